"""MiniMax-M2 (`MiniMaxM2ForCausalLM`): grouped-query attention with q and k each normed over all heads and rotary
embeddings on part of each head (`rotary_dim` on the Hub, transformers' partial_rotary_factor), every layer's MLP as
experts `block_sparse_moe.experts.E.w1/w2/w3` (Mixtral's names) behind a sigmoid router with its correction bias, the
chosen experts' weights renormalised; llama.cpp's minimax-m2 with the experts stacked."""

from __future__ import annotations

from pathlib import Path

from .gguf_hooks import rope_parameters, routed_by_sigmoid, text_hyperparameters
from .llama import TEXT_ONLY
from .parts import NO_TABLE, Family, GGUFPart, Unsupported, no_trainer_model


def minimax_m2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MiniMaxM2Model's: the TextModel's (sigmoid gating, which transformers' model routes by
    whatever the config says), then the experts' width and the rotated part of a head."""
    text_hyperparameters(writer, routed_by_sigmoid(hparams, folder / "config.json"), ftype, blocks, folder, True)
    writer.add_expert_feed_forward_length(hparams["intermediate_size"])
    rotated = hparams.get("rotary_dim")
    if rotated is None:
        head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
        rotated = int(head * rope_parameters(hparams)[0].get("partial_rotary_factor", 1.0))
    writer.add_rope_dimension_count(rotated)


FAMILIES = (
    Family(
        "MiniMax-M2",
        "minimax_m2",
        "MiniMaxM2ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's MiniMax-M2 layout is not mapped yet"),
        **no_trainer_model("MiniMax-M2"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"), ("w1", "w3")),
        gguf=GGUFPart("MINIMAXM2", hyperparameters=minimax_m2_hyperparameters),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)

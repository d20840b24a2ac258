"""Nemotron (NVIDIA's Nemotron-4 and Minitron): LayerNorms applied as 1 + weight, rope over part of each head, a
two-layer ReLU² MLP (up and down); llama.cpp's nemotron, whose converter stores the norms as 1 + weight, writes the
TextModel's header with the vocabulary's size, the LayerNorm's epsilon, the rotary dimensions and the rope scaling,
and sets the SentencePiece vocabulary's padding and unknown tokens to 0 and 1."""

from __future__ import annotations

from pathlib import Path

from .gguf_hooks import first_of, gguf_py, gguf_quiet, rope_parameters, text_hyperparameters
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def nemotron_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's NemotronModel's, in its order (the epsilon it writes again keeps its first place)."""
    gguf = gguf_py()
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_vocab_size(hparams["vocab_size"])
    with gguf_quiet():
        writer.add_layer_norm_eps(first_of(hparams, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "norm_eps"))
    _, rope = rope_parameters(hparams)
    writer.add_rope_dimension_count(
        int(rope["partial_rotary_factor"] * hparams["hidden_size"]) // hparams["num_attention_heads"]
    )
    factor = hparams.get("factor") or rope.get("factor")
    if factor is None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    else:
        with gguf_quiet():
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(factor)


def nemotron_special_tokens(writer, hparams: dict, folder: Path) -> None:
    """The padding and unknown tokens the converter sets after the vocabulary, whatever the tokenizer says."""
    with gguf_quiet():
        writer.add_pad_token_id(0)
        writer.add_unk_token_id(1)


FAMILIES = (
    Family(
        "Nemotron",
        "nemotron",
        "NemotronForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Nemotron layout (LayerNorm1P, partial rope) is not mapped yet"),
        **no_trainer_model("Nemotron"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        gguf=GGUFPart(
            "NEMOTRON",
            hyperparameters=nemotron_hyperparameters,
            after_vocabulary=nemotron_special_tokens,
            norm_shift=1.0,  # (LayerNorm1P: the converter stores 1 + weight, which llama.cpp applies as it is)
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

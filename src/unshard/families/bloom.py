"""BLOOM (BigScience's): ALiBi rather than rope, a LayerNorm after the embedding, LayerNorms with biases, q, k and v in
one tensor whose rows come head by head, as GPT-NeoX's, a GELU MLP four times the width, the head tied to the
embedding; llama.cpp's bloom, whose converter regroups that tensor as GPT-NeoX's and writes a header of its own."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gpt_neox import qkv_by_kind
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def bloom_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's BloomModel's, in its order (its context the config's seq_length, else the width)."""
    width, heads = hparams["hidden_size"], hparams["num_attention_heads"]
    writer.add_context_length(hparams.get("seq_length", width))
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(4 * width)
    writer.add_block_count(blocks)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_eps(hparams["layer_norm_epsilon"])
    writer.add_file_type(ftype)


def bloom_checked(hparams: dict, where: Path) -> None:
    """A residual taken after the LayerNorm, which llama.cpp's bloom does not compute."""
    if hparams.get("apply_residual_connection_post_layernorm"):
        raise ConfigMismatchError(
            f"{where}: apply_residual_connection_post_layernorm is set, which llama.cpp's bloom does not compute; "
            "serve this model with transformers or vLLM"
        )


FAMILIES = (
    Family(
        "BLOOM",
        "bloom",
        "BloomForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's BLOOM layout (ALiBi, LayerNorms) is not mapped yet"),
        **no_trainer_model("BLOOM"),
        fused_siblings=(),  # (q, k and v are one tensor already)
        gguf=GGUFPart(
            "BLOOM",
            hyperparameters=bloom_hyperparameters,
            check_config=bloom_checked,
            vocabulary="bpe",
            rearranged=qkv_by_kind,
            dropped_prefix="transformer.",
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
        also=("BloomModel",),  # (its layers alone, the head tied to the embedding)
    ),
)

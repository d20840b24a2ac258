"""GPT-NeoX (EleutherAI's Pythia and GPT-NeoX-20B): LayerNorms with biases, q, k and v in one tensor whose rows come
head by head (each head's q, k and v together), rope over part of each head, attention and MLP in parallel where the
config says, a GELU MLP; llama.cpp's gptneox, whose converter regroups that tensor's rows as every head's q, then
every head's k, then v, and writes a header of its own (no rope base: llama.cpp takes 10000; no file type)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of, rope_parameters, turned_at_llama_cpp_base
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Rearrangement, Unsupported, no_trainer_model


def gptneox_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's GPTNeoXModel's, in its order."""
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(hparams["intermediate_size"])
    head = hparams["hidden_size"] // hparams["num_attention_heads"]
    writer.add_rope_dimension_count(int(_rotary_fraction(hparams) * head))
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_parallel_residual(hparams.get("use_parallel_residual", True))
    writer.add_layer_norm_eps(hparams["layer_norm_eps"])


def _rotary_fraction(hparams: dict) -> float:
    """The part of a head rope turns: rotary_pct, as the converter reads it (transformers 4's configs), or
    transformers 5's partial_rotary_factor."""
    fraction = first_of(hparams, "rotary_pct")
    return rope_parameters(hparams)[1].get("partial_rotary_factor", 1.0) if fraction is None else fraction


def gptneox_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's gptneox would compute otherwise: a rope base other than its own."""
    turned_at_llama_cpp_base(hparams, where, "gptneox")


def qkv_by_kind(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """query_key_value (its weight and bias) as the converter stores it: the rows of every head's q, then k, then v.
    Its rows move across the whole tensor, so a band is the whole tensor."""
    if not name.endswith(("attention.query_key_value.weight", "attention.query_key_value.bias")):
        return None
    heads = hparams["num_attention_heads"]
    if shape[0] != 3 * hparams["hidden_size"]:
        raise ConfigMismatchError(
            f"{where}: {name} has {shape[0]} rows, not q, k and v of {heads} heads ({3 * hparams['hidden_size']}); "
            "pass --config-from the model's own folder"
        )
    return Rearrangement({name: shape}, partial(grouped_by_kind, heads=heads), shape[0])


def grouped_by_kind(band, heads: int) -> tuple:
    """Rows held head by head (each head's q, k and v) as kind by kind (every head's q, then k, then v)."""
    return (band.reshape(heads, 3, -1, *band.shape[1:]).swapaxes(0, 1).reshape(band.shape),)


FAMILIES = (
    Family(
        "GPT-NeoX",
        "gpt_neox",
        "GPTNeoXForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's GPT-NeoX layout (LayerNorms, q, k and v per head) is not mapped yet"),
        **no_trainer_model("GPT-NeoX"),
        fused_siblings=(),  # (q, k and v are one tensor already)
        gguf=GGUFPart(
            "GPTNEOX",
            hyperparameters=gptneox_hyperparameters,
            check_config=gptneox_checked,
            vocabulary="bpe",
            rearranged=qkv_by_kind,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

"""Mamba-2 layers as llama.cpp's converter writes them (its Mamba2Model, which its hybrid models build on: Granite
4.0's, Nemotron-H's): the tensors it stores otherwise than as they are, and the header keys of their sizes. And Mamba-2
itself (`Mamba2ForCausalLM`: Mamba-Codestral's layout, every layer Mamba-2's), llama.cpp's mamba2."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_quiet
from .llama import TEXT_ONLY
from .parts import (
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    middle_axis_dropped,
    negated_exp,
    no_trainer_model,
    renamed_only,
)


def mamba2_tensors(name: str, shape: tuple[int, ...], mixer: str, groups: int) -> Rearrangement | None:
    """A Mamba-2 layer's tensor (under `mixer`, its module's name with dots around it) as the converter stores it:
    A as -exp(A_log), A and D as columns, dt_bias as dt_proj's bias, the convolution's kernel 2-D, the gated norm's
    weight a row per group; None for the others (stored as they are)."""
    if mixer not in name:
        return None
    base, end = name.split(mixer)
    width = shape[0] // groups
    return {
        "A_log": Rearrangement({name: (*shape, 1)}, partial(in_rows_of, width=1, negated=True)),
        "D": Rearrangement({name: (*shape, 1)}, partial(in_rows_of, width=1)),
        "dt_bias": Rearrangement({base + mixer + "dt_proj.bias": shape}, renamed_only),
        "conv1d.weight": Rearrangement({name: (shape[0], shape[-1])}, middle_axis_dropped),
        "norm.weight": Rearrangement({name: (groups, width)}, partial(in_rows_of, width=width), width),
    }.get(end)


def in_rows_of(band, width: int, negated: bool = False) -> tuple:
    """A vector's band as rows of `width` (Mamba-2's A and D as columns, its gated norm's weight a row per group);
    A as -exp(A_log)."""
    return ((negated_exp(band) if negated else band).reshape(-1, width),)


def add_mamba2_sizes(writer, sizes: dict, kv_heads: int, attention: list[bool], rope: bool = False) -> None:
    """The converter's GraniteHybridModel's keys after Granite MoE's: Mamba-2's sizes (conv, state, groups, inner,
    heads), the key-value heads of each attention layer (0 for the others: llama.cpp's sign of a recurrent layer, or
    of Nemotron-H's MLP layers) over the model's count, and rope turned off by the fine-tuned flag with a context of
    2^20 over the config's (both keys rewritten in their places, as gguf-py's writer does), where there is a Mamba-2
    layer (a model of attention layers alone keeps rope, and its context, as does Bamba: `rope`)."""
    writer.add_ssm_conv_kernel(sizes["conv"])
    writer.add_ssm_state_size(sizes["state"])
    writer.add_ssm_group_count(sizes["groups"])
    writer.add_ssm_inner_size(sizes["inner"])
    writer.add_ssm_time_step_rank(sizes["heads"])
    rope = rope or all(attention)
    with gguf_quiet():
        writer.add_head_count_kv([kv_heads if layer else 0 for layer in attention])
        writer.add_rope_scaling_finetuned(rope)
        if not rope:
            writer.add_context_length(2**20)


def mamba2_checked(hparams: dict, where: Path, arch: str) -> None:
    """What every hybrid family's llama.cpp model would compute otherwise than transformers' Mamba-2 layers, or not
    load: a clamp of the time step, biases on the Mamba-2 projections, a vocabulary the
    converter pads to a multiple of 8 tokens past the embedding's rows."""
    other_model = "; serve this model with transformers or vLLM"
    if tuple(hparams.get("time_step_limit") or (0.0, float("inf"))) != (0.0, float("inf")):
        raise ConfigMismatchError(
            f"{where}: time_step_limit is {hparams.get('time_step_limit')}, and llama.cpp's {arch} clamps no time "
            f"step{other_model}"
        )
    if hparams.get("mamba_proj_bias"):
        raise ConfigMismatchError(
            f"{where}: mamba_proj_bias is set, and llama.cpp's {arch} has no biases on the Mamba-2 projections"
            f"{other_model}"
        )
    if hparams["vocab_size"] % 8:
        raise ConfigMismatchError(
            f"{where}: vocab_size is {hparams['vocab_size']}, which llama.cpp's converter pads to a multiple of 8 "
            f"tokens past the embedding's rows: llama.cpp would not load the file{other_model}"
        )


def mamba2_inner(hparams: dict) -> int:
    return hparams.get("intermediate_size") or hparams.get("expand", 2) * hparams["hidden_size"]


def state_space_header(writer, hparams: dict, blocks: int, inner: int, state: int, rank: int) -> None:
    """The head of the converter's MambaModel's and Mamba2Model's keys (not the TextModel's): a context of 2^20, no
    feed-forward width or heads, the blocks, the convolution's taps, the inner width, the state, the time step's
    rank."""
    writer.add_context_length(2**20)
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_block_count(blocks)
    writer.add_ssm_conv_kernel(hparams.get("conv_kernel") or 4)
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_state_size(state)
    writer.add_ssm_time_step_rank(rank)


def mamba2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Mamba2Model's: the state-space keys (the time step's rank the heads: the inner width over
    head_dim), the groups, the norms' epsilon."""
    inner = mamba2_inner(hparams)
    state_space_header(
        writer, hparams, blocks, inner, hparams.get("state_size") or 128, inner // (hparams.get("head_dim") or 64)
    )
    writer.add_ssm_group_count(hparams.get("n_groups") or 1)
    writer.add_layer_norm_rms_eps(hparams.get("layer_norm_epsilon") or 1e-5)
    writer.add_file_type(ftype)


def mamba2_model_checked(hparams: dict, where: Path) -> None:
    """Every hybrid's Mamba-2 checks, no biases on the projections (use_bias), and a vocabulary of whole sixteens:
    the converter pads Mamba-2's to a multiple of 16 tokens, past the embedding's rows otherwise."""
    mamba2_checked(hparams, where, "mamba2")
    for wrong, why in (
        (hparams.get("use_bias"), "use_bias is set, and llama.cpp's mamba2 has no biases on its projections"),
        (
            hparams["vocab_size"] % 16,
            f"vocab_size is {hparams['vocab_size']}, which llama.cpp's converter pads to a multiple of 16 tokens past "
            "the embedding's rows: llama.cpp would not load the file",
        ),
    ):
        if wrong:
            raise ConfigMismatchError(f"{where}: {why}; serve this model with transformers or vLLM")


def mamba2_model_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    return mamba2_tensors(name, shape, ".mixer.", hparams.get("n_groups") or 1)


FAMILIES = (
    Family(
        "Mamba-2",
        "mamba2",
        "Mamba2ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Mamba layout is not mapped yet"),
        **no_trainer_model("Mamba-2"),
        fused_siblings=(),
        gguf=GGUFPart(
            "MAMBA2",
            hyperparameters=mamba2_hyperparameters,
            check_config=mamba2_model_checked,
            vocabulary="bpe",
            rearranged=mamba2_model_tensors,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

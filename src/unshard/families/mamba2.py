"""Mamba-2 layers as llama.cpp's converter writes them (its Mamba2Model, which its hybrid models build on: Granite
4.0's, Nemotron-H's): the tensors it stores otherwise than as they are, and the header keys of their sizes."""

from __future__ import annotations

from functools import partial

from .gguf_hooks import gguf_quiet
from .parts import Rearrangement, middle_axis_dropped, negated_exp, renamed_only


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


def add_mamba2_sizes(writer, sizes: dict, kv_heads: int, attention: list[bool]) -> None:
    """The converter's GraniteHybridModel's keys after Granite MoE's: Mamba-2's sizes (conv, state, groups, inner,
    heads), the key-value heads of each attention layer (0 for the others: llama.cpp's sign of a recurrent layer, or
    of Nemotron-H's MLP layers) over the model's count, and rope turned off by the fine-tuned flag with a context of
    2^20 over the config's (both keys rewritten in their places, as gguf-py's writer does)."""
    writer.add_ssm_conv_kernel(sizes["conv"])
    writer.add_ssm_state_size(sizes["state"])
    writer.add_ssm_group_count(sizes["groups"])
    writer.add_ssm_inner_size(sizes["inner"])
    writer.add_ssm_time_step_rank(sizes["heads"])
    with gguf_quiet():
        writer.add_head_count_kv([kv_heads if layer else 0 for layer in attention])
        writer.add_rope_scaling_finetuned(False)
        writer.add_context_length(2**20)

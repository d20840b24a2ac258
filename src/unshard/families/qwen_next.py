"""Qwen3-Next and Qwen3.5: three of every four layers Gated DeltaNet (linear attention: a causal convolution, then a
recurrent state per value head), the fourth gated full attention (q_proj's rows are each head's query and its output
gate; a quarter of each head rotated), norms applied as 1 + weight; Qwen3-Next's MLPs routed experts beside a gated
shared expert (Qwen2-MoE's), Qwen3.5's dense. llama.cpp's qwen3next and qwen35, as the converter writes them: the
norms shifted by one (but the DeltaNet's output norm, applied as it is), A = -exp(A_log), the convolution's kernel 2-D,
Qwen3-Next's in_proj_qkvz (per key head: q, k, then its value heads' v and z) as all heads' q, k and v in one tensor
and z, the output gate, apart; Qwen3.5's value heads (stored by key head: each key head's value heads together)
reordered as llama.cpp broadcasts them (the first value head of every key head, then the second...)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import qwen2moe_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_META_NAMES, NO_TABLE, Family, GGUFPart, Rearrangement, Unsupported
from .parts import negated_exp as negated_exp_of
from .qwen_moe import routing_checked

DELTANET = "linear_attn."
NO_MOE = Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far")
MEGATRON = Unsupported("Megatron's Gated DeltaNet layers (Qwen3-Next, Qwen3.5) are not mapped yet")
# The M-RoPE sections the converter writes for Qwen3.5 where the config names none (llama.cpp's qwen35 needs them)
QWEN35_SECTIONS = [11, 11, 10, 0]


def qwen3next_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Qwen3NextModel's: Qwen2-MoE's (the experts' widths after the TextModel's, where there are
    experts), the DeltaNet's sizes as llama.cpp's SSM keys, which layers are recurrent, and the rotated part of a
    head."""
    qwen2moe_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_ssm_conv_kernel(hparams["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(hparams["linear_key_head_dim"])
    writer.add_ssm_group_count(hparams["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(hparams["linear_num_value_heads"])
    writer.add_ssm_inner_size(hparams["linear_value_head_dim"] * hparams["linear_num_value_heads"])
    if hparams.get("layer_types") is not None:
        # (llama.cpp's key; gguf 0.19's writer has no method for it yet)
        recurrent = [kind == "linear_attention" for kind in hparams["layer_types"]]
        writer.add_array(f"{writer.arch}.attention.recurrent_layers", recurrent)
    writer.add_full_attention_interval(hparams.get("full_attention_interval", 4))
    head_dim = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    rotated = (hparams.get("rope_parameters") or {}).get("partial_rotary_factor")
    writer.add_rope_dimension_count(int(head_dim * (rotated or hparams.get("partial_rotary_factor", 0.25))))


def qwen35_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Qwen3-Next's, then M-RoPE's sections where the config names none (llama.cpp's qwen35 rotates by them)."""
    qwen3next_hyperparameters(writer, hparams, ftype, blocks, folder)
    if (hparams.get("rope_parameters") or hparams.get("rope_scaling") or {}).get("mrope_section") is None:
        writer.add_rope_dimension_sections(QWEN35_SECTIONS)


def deltanet_tensors(
    name: str, shape: tuple[int, ...], hparams: dict, where: Path, tiled_values: bool = False
) -> Rearrangement | None:
    """The DeltaNet's tensors the converter stores otherwise: A = -exp(A_log), dt_bias as dt_proj's bias, the
    convolution's kernel without its middle axis of 1, Qwen3-Next's in_proj_qkvz apart into qkv (all key heads' q,
    then k, then v) and z; with `tiled_values` (Qwen3.5's), where key heads have several value heads, those reordered.
    A tensor whose rows are regrouped or reordered is cut a whole tensor at a time: any band holds rows of each
    group."""
    if DELTANET not in name:
        return None
    heads, key, value = (hparams[f"linear_{k}"] for k in ("num_key_heads", "key_head_dim", "value_head_dim"))
    per_key = hparams["linear_num_value_heads"] // heads
    base, end = name.split(DELTANET)
    base += DELTANET
    if end == "in_proj_qkvz.weight":
        return _qkvz(name, shape, heads, key, per_key * value, where)

    def values(width: int, first: int = 0) -> dict:  # (the value heads' rows from `first`, `width` rows each)
        return {"tiled": (heads, per_key, width, first)} if tiled_values and per_key > 1 else {}

    how = {
        "A_log": ({name: shape}, {**values(1), "negated_exp": True}),
        "dt_bias": ({base + "dt_proj.bias": shape}, values(1)),
        "conv1d.weight": ({name: (shape[0], shape[-1])}, {**values(value, 2 * heads * key), "kernel": True}),
        "in_proj_qkv.weight": ({name: shape}, values(value, 2 * heads * key)),
        "in_proj_z.weight": ({name: shape}, values(value)),
        "in_proj_a.weight": ({name: shape}, values(1)),
        "in_proj_b.weight": ({name: shape}, values(1)),
        "out_proj.weight": ({name: shape}, {**values(value), "axis": 1}),  # (its columns: any band of rows)
    }.get(end)
    if how is None:
        return None
    tensors, steps = how
    if tensors == {name: shape} and set(steps) <= {"axis"}:
        return None  # (stored as it is)
    whole = "tiled" in steps and steps.get("axis", 0) == 0
    return Rearrangement(tensors, partial(deltanet, **steps), shape[0] if whole else 1)


def _qkvz(name: str, shape: tuple[int, ...], heads: int, key: int, value: int, where: Path) -> Rearrangement:
    """Qwen3-Next's in_proj_qkvz (per key head: q and k of `key` rows, v and z of `value` rows) as qkv and z."""
    if shape[0] != heads * 2 * (key + value):
        raise ConfigMismatchError(
            f"{where}: {name} has {shape[0]} rows, not {heads} key heads of q, k ({key} each), v and z ({value} "
            "each) as the config's linear_* sizes say; pass the config the model was trained with (--config-from)"
        )
    base = name.removesuffix("in_proj_qkvz.weight")
    tensors = {
        base + "in_proj_qkv.weight": (heads * (2 * key + value), shape[1]),
        base + "in_proj_z.weight": (heads * value, shape[1]),
    }
    return Rearrangement(tensors, partial(qkv_and_z, heads=heads, widths=(key, key, value, value)), shape[0])


def deltanet(band, tiled=None, axis: int = 0, kernel: bool = False, negated_exp: bool = False) -> tuple:
    """A DeltaNet tensor's band as the converter stores it: the convolution's kernel 2-D; the value heads (from row
    or column `first`, each `width` wide, `per_key` of them for each of the `heads` key heads) reordered as llama.cpp
    broadcasts them; -exp (parts.negated_exp)."""
    import numpy as np

    if kernel:
        band = band.reshape(band.shape[0], band.shape[-1])
    if tiled is not None:
        heads, per_key, width, first = tiled
        moved = np.moveaxis(band, axis, 0)
        grouped = moved[first:].reshape(heads, per_key, width, *moved.shape[1:]).swapaxes(0, 1)
        band = np.moveaxis(np.concatenate([moved[:first], grouped.reshape(-1, *moved.shape[1:])]), 0, axis)
    if negated_exp:
        band = negated_exp_of(band)
    return (band,)


def qkv_and_z(band, heads: int, widths: tuple[int, int, int, int]) -> tuple:
    """in_proj_qkvz's rows ([q, k, v, z] per key head) as [all q; all k; all v] and [all z]."""
    import numpy as np

    per_head = band.reshape(heads, sum(widths), band.shape[-1])
    ends = np.cumsum(widths)[:-1]
    q, k, v, z = (part.reshape(-1, band.shape[-1]) for part in np.split(per_head, ends, axis=1))
    return np.concatenate([q, k, v]), z


def deltanet_gguf(arch: str, hyperparameters, check_config=None, tiled_values: bool = False) -> GGUFPart:
    """The GGUF part of a family of Gated DeltaNet layers (Qwen3.5's vision-language models' too, vlm.py)."""
    return GGUFPart(
        arch,
        hyperparameters=hyperparameters,
        check_config=check_config,
        vocabulary="bpe",
        rearranged=partial(deltanet_tensors, tiled_values=tiled_values),
        norm_shift=1.0,
        unshifted_norms=("linear_attn.norm.weight",),
    )


FAMILIES = (
    Family(
        "Qwen3-Next",
        "qwen3_next",
        "Qwen3NextForCausalLM",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=deltanet_gguf("QWEN3NEXT", qwen3next_hyperparameters, routing_checked("qwen3next", True)),
        mmproj=TEXT_ONLY,
        moe_layout=NO_MOE,
    ),
    Family(
        "Qwen3.5 (text)",
        "qwen3_5_text",
        "Qwen3_5ForCausalLM",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=deltanet_gguf("QWEN35", qwen35_hyperparameters, tiled_values=True),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("a dense family merge-moe does not assemble from", applies=False),
    ),
    Family(
        "Qwen3.5-MoE (text)",
        "qwen3_5_moe_text",
        "Qwen3_5MoeForCausalLM",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=deltanet_gguf("QWEN35MOE", qwen35_hyperparameters, tiled_values=True),
        mmproj=TEXT_ONLY,
        moe_layout=NO_MOE,
    ),
)

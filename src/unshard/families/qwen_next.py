"""Qwen3-Next: three of every four layers Gated DeltaNet (linear attention: a causal convolution, then a recurrent
state per value head), the fourth gated full attention (q_proj's rows are each head's query and its output gate;
a quarter of each head rotated); every layer's MLP routed experts beside a gated shared expert (Qwen2-MoE's), norms
applied as 1 + weight. llama.cpp's qwen3next, as the converter writes it: the norms shifted by one (but the DeltaNet
output norm, applied as it is), A_log as A = -exp(A_log), the convolution's kernel 2-D, and in_proj_qkvz (per key
head: q, k, then its value heads' v and z) as all heads' q, k and v in one tensor and z, the output gate, apart."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_META_NAMES, NO_TABLE, Family, GGUFPart, Rearrangement, Unsupported
from .qwen_moe import routing_checked

DELTANET = "linear_attn."


def qwen3next_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Qwen3NextModel's: Qwen2-MoE's (the experts' widths after the TextModel's), the DeltaNet's
    sizes as llama.cpp's SSM keys, which layers are recurrent, and the rotated part of a head."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_expert_shared_feed_forward_length(hparams["shared_expert_intermediate_size"])
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


def deltanet_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The DeltaNet's tensors the converter stores otherwise: A = -exp(A_log), the convolution's kernel without its
    middle axis of 1, in_proj_qkvz apart into qkv (all key heads' q, then k, then v) and z (a whole tensor at a time:
    every band holds rows of all four)."""
    if DELTANET not in name:
        return None
    if name.endswith(".A_log"):
        return Rearrangement({name: shape}, negative_exp)
    if name.endswith("conv1d.weight"):
        return Rearrangement({name: (shape[0], shape[-1])}, kernel_2d)
    if name.endswith("in_proj_qkvz.weight"):
        heads, key, value = (
            hparams["linear_num_key_heads"],
            hparams["linear_key_head_dim"],
            hparams["linear_value_head_dim"],
        )
        value *= hparams["linear_num_value_heads"] // heads  # (each key head's value heads, one after the other)
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
    return None


def negative_exp(band) -> tuple:
    """-exp(band), by torch's exp as the converter computes it (numpy's may round otherwise)."""
    import numpy as np
    import torch

    return ((-torch.exp(torch.from_numpy(np.ascontiguousarray(band)))).numpy(),)


def kernel_2d(band) -> tuple:
    return (band.reshape(band.shape[0], band.shape[-1]),)


def qkv_and_z(band, heads: int, widths: tuple[int, int, int, int]) -> tuple:
    """in_proj_qkvz's rows ([q, k, v, z] per key head) as [all q; all k; all v] and [all z]."""
    import numpy as np

    per_head = band.reshape(heads, sum(widths), band.shape[-1])
    ends = np.cumsum(widths)[:-1]
    q, k, v, z = (part.reshape(-1, band.shape[-1]) for part in np.split(per_head, ends, axis=1))
    return np.concatenate([q, k, v]), z


FAMILIES = (
    Family(
        "Qwen3-Next",
        "qwen3_next",
        "Qwen3NextForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Qwen3-Next (Gated DeltaNet layers) is not mapped yet"),
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "QWEN3NEXT",
            hyperparameters=qwen3next_hyperparameters,
            check_config=routing_checked("qwen3next", True),
            vocabulary="bpe",
            rearranged=deltanet_tensors,
            renames=(("linear_attn.dt_bias", "linear_attn.dt_proj.bias"),),
            norm_shift=1.0,
            unshifted_norms=("linear_attn.norm.weight",),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)

"""Ling 3.0 (inclusionAI's `BailingMoeV3ForCausalLM`; transformers' `BailingHybridForCausalLM`): Kimi Delta Attention
layers (a short convolution on each of q, k and v, a recurrent state per head, a forget gate with a lower bound, the
output normed and gated) with one layer of DeepSeek's latent attention, gated per head, closing each group of layers;
dense first layers, then experts chosen within groups by a sigmoid router with its correction bias, and a shared
expert. llama.cpp's bailingmoe3 (which PyPI's gguf-py 0.19 lacks), as the converter's BailingMoeV3Model writes it: the
convolutions' kernels as Kimi Linear's, A as exp(A_log), kv_b_proj split as DeepSeek-V3's, the delta layers' forget
and output gates as their own tensors, the experts stacked. transformers saves the Hub's tensor names and its own
config keys; the converter reads the Hub's, which unshard reads either."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .deepseek import latent_kv
from .gguf_hooks import gguf_quiet, text_hyperparameters
from .kimi_linear import CONVOLUTIONS, kernel_4d, latent_attention_widths
from .llama import TEXT_ONLY
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    no_trainer_model,
    renamed_only,
)

# The Hub's config keys the converter reads, by transformers' (its attribute map's names, which it saves)
HUB_KEYS = {
    "max_position_embeddings": "model_max_length",
    "norm_topk_prob": "moe_renormalize",
    "n_group": "num_expert_group",
    "num_experts_per_tok": "num_experts_per_token",
    "head_dim": "linear_head_dim",  # (the delta attention's head; transformers' head_dim is the rotary part's)
}


def ling_as_the_converter_reads(hparams: dict, where: Path) -> dict:
    """The config as the Hub's release names it, which the converter reads: transformers' keys under the Hub's names,
    the shared expert's width, transformers' routing (by a sigmoid) and its delta attention (no low-rank gates, the
    safe gate, attention gated per head) named, and no MTP layers (transformers drops them from the checkpoint: the
    file has none, as the converter's with --no-mtp). A config already in the Hub's form is read as it is."""
    read = dict(hparams)
    for hub, ours in HUB_KEYS.items():
        if ours in read:
            read[hub] = read[ours]
    shared = read.get("num_shared_experts") or 1
    read.setdefault("moe_shared_expert_intermediate_size", read["moe_intermediate_size"] * shared)
    read.setdefault("score_function", "sigmoid")
    read.setdefault("no_kda_lora", True)
    read.setdefault("gated_attention_proj_granularity_type", "head_wise")
    read["num_nextn_predict_layers"] = 0
    return read


def full_attention(hparams: dict) -> list[bool]:
    """Which layers llama.cpp's bailingmoe3 gives latent attention (the converter's is_full_attention): the last of
    each group of layer_group_size, and every layer after the last whole group."""
    layers, group = hparams["num_hidden_layers"], hparams["layer_group_size"]
    return [(i + 1) % group == 0 or i >= layers // group * group for i in range(layers)]


def ling_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's bailingmoe3 computes, and the converter asserts: the delta attention without low-rank gates,
    its safe forget gate, attention gated per head, the latent attention where the groups say (transformers' layer
    types may say otherwise), no SwiGLU clamps (transformers has none), SiLU. Another config is one line."""
    kinds = hparams.get("layer_types")
    why = None
    if not hparams.get("no_kda_lora"):
        why = "the delta attention's gates are low-rank (no_kda_lora is off), which llama.cpp's bailingmoe3 lacks"
    elif not hparams.get("kda_safe_gate", True):
        why = "kda_safe_gate is off, and llama.cpp's bailingmoe3 runs the safe forget gate alone"
    elif hparams.get("gated_attention_proj_granularity_type") != "head_wise":
        why = "the attention is not gated per head, as llama.cpp's bailingmoe3 gates it"
    elif kinds is not None and [kind == "full_attention" for kind in kinds] != full_attention(hparams):
        why = (
            f"layer_types puts latent attention elsewhere than at the end of each group of "
            f"{hparams['layer_group_size']} layers, where llama.cpp's bailingmoe3 computes it"
        )
    # (a limit of 0 clamps nothing: transformers 5.25 fills in a list of zeros)
    elif any(hparams.get("expert_swiglu_limit_list") or ()) or any(hparams.get("share_expert_swiglu_limit_list") or ()):
        why = "the experts' SwiGLU is clamped, which transformers' model does not compute"
    elif hparams.get("hidden_act", "silu") != "silu":
        why = f"hidden_act is {hparams['hidden_act']!r}, and llama.cpp's bailingmoe3 runs SiLU"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: it would compute another model; serve this one with transformers")


def ling_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's BailingMoeV3Model's, in its order: its TextModel's (one key-value head, then each layer's: 1 for
    latent attention as MQA, 0 for a recurrent layer), the vocabulary's size, the delta attention's kernel, head width
    and gate, the latent's ranks and widths, then the experts'."""
    with gguf_quiet():  # (the key-value heads and the key width written again, as the converter does: in place)
        text_hyperparameters(writer, {**hparams, "num_key_value_heads": 1}, ftype, blocks, folder, expert_groups=True)
        writer.add_head_count_kv([int(full) for full in full_attention(hparams)])
        writer.add_vocab_size(hparams["vocab_size"])
        writer.add_ssm_conv_kernel(hparams["short_conv_kernel_size"])
        writer.add_kda_head_dim(hparams["head_dim"])
        writer.add_kda_safe_gate(hparams.get("kda_safe_gate", True))
        writer.add_kda_gate_lower_bound(hparams["kda_lower_bound"])
        latent_attention_widths(writer, hparams)
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_expert_shared_feed_forward_length(hparams["moe_shared_expert_intermediate_size"])
    writer.add_expert_shared_count(hparams.get("num_shared_experts") or 1)
    writer.add_leading_dense_block_count(hparams["first_k_dense_replace"])
    writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
    writer.add_expert_weights_norm(hparams["norm_topk_prob"])


def ling_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The convolutions' kernels [channels, 1, width] as [1, channels, 1, width] (one band: the whole kernel), A as
    exp(A_log) in a column, kv_b_proj split per head (DeepSeek-V3's), each g_proj named by its layer's kind: the delta
    attention's output gate, or the latent attention's gate per head."""
    if name.endswith(CONVOLUTIONS):
        four_d = (1, shape[0], 1, shape[-1])
        return Rearrangement({name: four_d}, partial(kernel_4d, shape=four_d), shape[0])
    if name.endswith(".A_log"):
        return Rearrangement({name: (shape[0], 1)}, exponent_column, shape[0])
    if name.endswith(".attention.kv_b_proj.weight"):
        return latent_kv(name.replace(".attention.", ".self_attn."), shape, hparams, where)
    if name.endswith(".attention.g_proj.weight"):
        layer = int(name.split(".")[2])
        gate = ".self_attn.gate_proj." if full_attention(hparams)[layer] else ".self_attn.g_a_proj."
        return Rearrangement({name.replace(".attention.g_proj.", gate): shape}, renamed_only, shape[0])
    return None


def first_layer_kv_heads(hparams: dict) -> int:
    """GGUFPart.first_kv_heads: the first layer's in the file (0 for a recurrent layer, 1 for latent attention as
    MQA), which llama-quantize's mixes choose by."""
    return int(full_attention(hparams)[0])


def exponent_column(band) -> tuple:
    """exp of A_log, by torch's exp as the converter computes it, as one column."""
    import numpy as np
    import torch

    return (torch.exp(torch.from_numpy(np.ascontiguousarray(band))).numpy().reshape(-1, 1),)


FAMILIES = (
    Family(
        "Ling 3.0",
        "bailing_hybrid",
        "BailingHybridForCausalLM",
        also=("BailingMoeV3ForCausalLM",),  # (the Hub's class, its own code's)
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Ling 3.0 layout (delta attention) is not mapped yet"),
        **no_trainer_model("Ling 3.0"),
        fused_siblings=Unsupported(
            "not yet compared with what llm-compressor writes for Ling 3.0 (its pinned transformers has none)"
        ),
        gguf=GGUFPart(
            "BAILINGMOE3",
            hyperparameters=ling_hyperparameters,
            check_config=ling_checked,
            as_the_converter_reads=ling_as_the_converter_reads,
            vocabulary="bpe",
            rearranged=ling_tensors,
            renames=(
                (r"\.dt_bias$", ".dt_proj.bias"),
                (r"\.expert_bias$", ".expert_bias.bias"),
                (r"\.attention\.f_proj\.", ".self_attn.f_a_proj."),
            ),
            expert_stack_order=("down_proj.weight", "gate_proj.weight", "up_proj.weight"),
            first_kv_heads=first_layer_kv_heads,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="bailingmoe3")},
    ),
)

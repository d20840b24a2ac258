"""Kimi Linear (Moonshot's `KimiLinearForCausalLM`): Kimi Delta Attention layers (a short convolution on each of q, k
and v, then a recurrent state per head, gated by a low-rank forget gate and output gate) between multi-latent attention
layers without rotary embeddings, which the config's `linear_attn_config` places (counting from 1); a dense first
layer, then DeepSeek-V3's experts (a sigmoid router with its correction bias, a shared expert, a routing scale).

transformers loads the Hub's names, but its save_pretrained names the dense layer's MLP as the experts' block
(`block_sparse_moe.gate_proj`), which neither vLLM nor llama.cpp's converter reads: the folder keeps the Hub's
(`mlp.gate_proj`). llama.cpp's kimi-linear, as the converter writes it: the latent attention as MQA (kv_b_proj split
into k_b and v_b, as DeepSeek-V3's), the convolutions' kernels 4-D and in F32, A = -exp(A_log), dt_bias as dt_proj's
bias, which layers are recurrent as key-value head counts of 0."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .deepseek import latent_kv
from .gguf_hooks import gguf_quiet, routed_by_sigmoid, text_hyperparameters
from .llama import TEXT_ONLY
from .parts import (
    DEFAULT_FUSED_SIBLINGS,
    NO_TABLE,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    negated_exp,
    no_trainer_model,
)

# transformers' save_pretrained names a dense layer's MLP as the experts' block; the Hub's names it mlp
DENSE_MLP_AS_THE_HUB = (
    (r"^model\.layers\.(\d+)\.block_sparse_moe\.(gate|up|down)_proj\.", r"model.layers.\1.mlp.\2_proj."),
)
# the epsilon of transformers' l2 norms of the delta attention's q and k, and of its latent attention's kv_a_layernorm
TRANSFORMERS_EPS = 1e-6
CONVOLUTIONS = (".q_conv1d.weight", ".k_conv1d.weight", ".v_conv1d.weight")


def kimi_linear_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's KimiLinearModel's, in its order: its TextModel's with one key-value head (the latent attention
    as MQA) and the config's context length (model_max_length, as the Hub's config names it), then which layers are
    recurrent (0 key-value heads), the convolution's kernel and the delta attention's head width, the latent's ranks,
    the widths of keys and values, the experts' width and shared count, the dense first layers and the routing's scale.
    Some keys are written twice, as the converter does (the second value counts, in the first one's place)."""
    where = folder / "config.json"
    linear = hparams["linear_attn_config"]
    context = hparams.get("max_position_embeddings", hparams.get("model_max_length"))
    as_mqa = {**hparams, "num_key_value_heads": 1, "max_position_embeddings": context}
    with gguf_quiet():  # (gguf-py warns of each key written again)
        text_hyperparameters(writer, routed_by_sigmoid(as_mqa, where), ftype, blocks, folder, expert_groups=True)
        writer.add_vocab_size(hparams["vocab_size"])
        writer.add_head_count_kv(kv_heads_by_layer(hparams))
        if linear.get("short_conv_kernel_size") is not None:
            writer.add_ssm_conv_kernel(linear["short_conv_kernel_size"])
        if linear.get("head_dim") is not None:
            writer.add_kda_head_dim(linear["head_dim"])
        latent_attention_widths(writer, hparams)
        writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
        writer.add_expert_shared_count(hparams["num_shared_experts"])
        writer.add_leading_dense_block_count(hparams["first_k_dense_replace"])
        writer.add_expert_weights_scale(hparams["routed_scaling_factor"])


def latent_attention_widths(writer, hparams: dict) -> None:
    """The latent attention's ranks and widths, as the converter's KimiLinearModel and BailingMoeV3Model write them
    beside their delta attention: the query's rank where it has one, the latent's, the rotary part, the width of a
    key as llama.cpp's absorbed attention sees it (the latent and the rotary part), and a head's key and value."""
    rank, rope = hparams["kv_lora_rank"], hparams["qk_rope_head_dim"]
    if hparams.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(hparams["q_lora_rank"])
    writer.add_kv_lora_rank(rank)
    writer.add_rope_dimension_count(rope)
    writer.add_key_length(rank + rope)
    writer.add_key_length_mla(hparams["qk_nope_head_dim"] + rope)
    writer.add_value_length_mla(hparams["v_head_dim"])


def kimi_linear_checked(hparams: dict, where: Path) -> list[str]:
    """What llama.cpp's kimi-linear computes otherwise than transformers, or the converter does not read: one line.
    Noted: the epsilon of the norms transformers computes at 1e-6 whatever the config says (the delta attention's l2
    norms of q and k, the latent's norm), which llama.cpp takes from rms_norm_eps."""
    linear = hparams.get("linear_attn_config")
    heads = hparams["num_attention_heads"]
    why = None
    if not isinstance(linear, dict) or "full_attn_layers" not in linear:
        why = "it has no linear_attn_config.full_attn_layers, which the converter places the attention layers by"
    elif linear.get("num_heads", heads) != heads:
        why = f"its delta attention has {linear['num_heads']} heads, and llama.cpp's kimi-linear gives it {heads}"
    elif (hparams.get("num_key_value_heads") or heads) != heads:
        why = f"num_key_value_heads is {hparams['num_key_value_heads']}, and the converter splits kv_b_proj by it"
    elif (hparams.get("num_expert_group") or hparams.get("n_group") or 1) > 1:
        why = "its experts are routed in groups, which llama.cpp's kimi-linear does not read from the converter's file"
    elif hparams.get("moe_renormalize", hparams.get("norm_topk_prob", True)) is False:
        why = "its experts' weights are not renormalised, and llama.cpp's kimi-linear renormalises them"
    if why:
        raise ConfigMismatchError(f"{where}: {why}; serve this model with transformers or vLLM")
    eps = hparams.get("rms_norm_eps", 1e-5)
    if eps != TRANSFORMERS_EPS:
        return [
            f"llama.cpp's kimi-linear normalises the delta attention's q and k and the latent at rms_norm_eps {eps:g}, "
            f"where transformers takes {TRANSFORMERS_EPS:g}: its logits differ slightly from transformers', as from "
            "the converter's file"
        ]
    return []


def kimi_linear_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """kv_b_proj split per head (DeepSeek-V3's), the convolutions' kernels [channels, 1, width] as [1, channels, 1,
    width] (one band: the whole kernel), A = -exp(A_log)."""
    if name.endswith(CONVOLUTIONS):
        four_d = (1, shape[0], 1, shape[-1])
        return Rearrangement({name: four_d}, partial(kernel_4d, shape=four_d), shape[0])
    if name.endswith(".A_log"):
        return Rearrangement({name: shape}, negated)
    return latent_kv(name, shape, hparams, where)


def kv_heads_by_layer(hparams: dict) -> list[int]:
    """Each layer's key-value heads in the file: 1 for latent attention (as MQA), 0 for a recurrent layer (the config
    counts the attention layers from 1)."""
    full = hparams["linear_attn_config"]["full_attn_layers"]
    return [1 if layer + 1 in full else 0 for layer in range(hparams["num_hidden_layers"])]


def first_layer_kv_heads(hparams: dict) -> int:
    """GGUFPart.first_kv_heads: the first layer's, which llama-quantize's mixes choose by."""
    return kv_heads_by_layer(hparams)[0]


def kernel_4d(band, shape: tuple[int, ...]) -> tuple:
    return (band.reshape(shape),)


def negated(band) -> tuple:
    return (negated_exp(band),)


FAMILIES = (
    Family(
        "Kimi Linear",
        "kimi_linear",
        "KimiLinearForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Kimi Delta Attention layers are not mapped"),
        **no_trainer_model("Kimi Linear"),
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        gguf=GGUFPart(
            "KIMI_LINEAR",
            hyperparameters=kimi_linear_hyperparameters,
            check_config=kimi_linear_checked,
            vocabulary="bpe",
            rearranged=kimi_linear_tensors,
            renames=((r"\.dt_bias$", ".dt_proj.bias"),),
            first_kv_heads=first_layer_kv_heads,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        hub_renames=DENSE_MLP_AS_THE_HUB,
    ),
)

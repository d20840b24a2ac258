"""Llama and Mistral: one set of names (Mistral is Llama's layout with a sliding window), Meta's names as torchtitan
and torchtune save them, llama.cpp's `llama` (q and k rows reordered per head, Llama 3's rope factors computed); and
SmolLM3, Llama's layout with every fourth layer's rotary embeddings left out, llama.cpp's `smollm3` (Mistral Small 3:
mistral3.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from ..names import dense_tables as t
from ..names import megatron_rules as m
from .gguf_hooks import llama_hyperparameters
from .parts import (
    NO_META_NAMES,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MegatronRules,
    Unsupported,
)

# torchtune's and torchtitan's names (layer as {i}) -> (Hugging Face name, which rotary permutation: q, k or none)
L = "model.layers.{i}."
TORCHTUNE = {
    "norm.scale": ("model.norm.weight", None),
    "layers.{i}.sa_norm.scale": (L + "input_layernorm.weight", None),
    "layers.{i}.mlp_norm.scale": (L + "post_attention_layernorm.weight", None),
    "layers.{i}.attn.q_proj.weight": (L + "self_attn.q_proj.weight", "q"),
    "layers.{i}.attn.k_proj.weight": (L + "self_attn.k_proj.weight", "k"),
    "layers.{i}.attn.v_proj.weight": (L + "self_attn.v_proj.weight", None),
    "layers.{i}.attn.output_proj.weight": (L + "self_attn.o_proj.weight", None),
    "layers.{i}.mlp.w1.weight": (L + "mlp.gate_proj.weight", None),
    "layers.{i}.mlp.w2.weight": (L + "mlp.down_proj.weight", None),
    "layers.{i}.mlp.w3.weight": (L + "mlp.up_proj.weight", None),
}
# What every torchtitan (0.3) model names alike: its ends and each layer's two norms
TORCHTITAN_COMMON = {
    "tok_embeddings.weight": ("model.embed_tokens.weight", None),
    "norm.weight": ("model.norm.weight", None),
    "lm_head.weight": ("lm_head.weight", None),
    "layers.{i}.attention_norm.weight": (L + "input_layernorm.weight", None),
    "layers.{i}.ffn_norm.weight": (L + "post_attention_layernorm.weight", None),
}
# torchtitan's names as its Llama3StateDictAdapter (0.3) maps them: q, k and v in its fused-QKV module
TORCHTITAN = {
    **TORCHTITAN_COMMON,
    "layers.{i}.attention.wo.weight": (L + "self_attn.o_proj.weight", None),
    "layers.{i}.feed_forward.w1.weight": (L + "mlp.gate_proj.weight", None),
    "layers.{i}.feed_forward.w2.weight": (L + "mlp.down_proj.weight", None),
    "layers.{i}.feed_forward.w3.weight": (L + "mlp.up_proj.weight", None),
    **{
        f"layers.{{i}}.attention.qkv_linear.w{p}.weight": (L + f"self_attn.{p}_proj.weight", p if p != "v" else None)
        for p in "qkv"
    },
}
# What torchtitan before 0.3 named otherwise: the head, and q, k and v outside a fused module
TORCHTITAN_BEFORE_0_3 = {
    "output.weight": ("lm_head.weight", None),
    **{
        f"layers.{{i}}.attention.w{p}.weight": (L + f"self_attn.{p}_proj.weight", p if p != "v" else None)
        for p in "qkv"
    },
}
META_NAMES = {**TORCHTITAN, **TORCHTITAN_BEFORE_0_3, **TORCHTUNE}  # the name sets do not overlap
# torchtune's embedding and head (its head `output`, left out where tied to the embedding)
TORCHTUNE_ENDS = {
    "tok_embeddings.weight": ("model.embed_tokens.weight", None),
    "output.weight": ("lm_head.weight", None),
}
TORCHTUNE_LLAMA = {**TORCHTUNE, **TORCHTUNE_ENDS}

# The Linear layers vLLM runs as one (--quantize's shared global scales) in Llama's layout
SIBLINGS = (("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj"))
MEGATRON_RULES = {**m.COMMON, **m.DENSE_MLP}


def _no_biases(args: dict) -> dict:
    return {"attention_bias": False, "mlp_bias": False}


def llama3_rope_factors(rope: dict, head_dim: int) -> list[float]:
    """Llama 3's rope frequencies, divided by these factors per pair of dimensions: by `factor` for wavelengths
    longer than the original context over `low_freq_factor`, by 1 for those shorter than it over
    `high_freq_factor`, smoothly between (as transformers' and the converter's rope of type llama3)."""
    import torch

    base = rope.get("rope_theta", 10000.0)
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    context = rope.get("original_max_position_embeddings", 8192)
    factors = []  # (computed in float32 as the converter computes them, so the values are its own to the bit)
    for frequency in 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)):
        wavelength = 2 * math.pi / frequency
        if wavelength < context / high:
            factors.append(1)
        elif wavelength > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return [float(f) for f in factors]


def llama_computed(writer, hparams: dict, rope: dict, head_dim: int, where: Path) -> dict[str, list[float]]:
    """Llama 3's rope frequency factors, which the converter computes for rope of type llama3."""
    if str(rope.get("rope_type")).lower() == "llama3":
        return {"rope_freqs.weight": llama3_rope_factors(rope, head_dim)}
    return {}


def smollm3_checked(hparams: dict, where: Path) -> None:
    """SmolLM3's layers without rotary embeddings, and no sliding window, where llama.cpp's smollm3 has them: every
    fourth layer, whatever the config says."""
    every_fourth = [int((i + 1) % 4 != 0) for i in range(hparams["num_hidden_layers"])]
    if list(hparams.get("no_rope_layers", every_fourth))[: len(every_fourth)] != every_fourth:
        raise ConfigMismatchError(
            f"{where}: no_rope_layers is not every fourth layer, which is where llama.cpp's smollm3 leaves "
            "rotary embeddings out: it would compute another model; serve this one with transformers or vLLM"
        )
    if hparams.get("use_sliding_window"):
        raise ConfigMismatchError(
            f"{where}: use_sliding_window is set, and llama.cpp's smollm3 has no sliding window: it would "
            "compute another model; serve this one with transformers or vLLM"
        )


# llama.cpp's llama: Llama, Mistral and Mixtral
GGUF = GGUFPart(
    "LLAMA", hyperparameters=llama_hyperparameters, computed=llama_computed, permute_qk=True, llama_vocabulary=True
)
# NVIDIA's embedding models (llama-embed-nemotron: `LlamaBidirectionalModel`, the layers alone, attending both ways),
# which the converter writes as Llama's under llama.cpp's llama-embed (run with non-causal attention)
LLAMA_EMBED = replace(GGUF, arch="LLAMA_EMBED")
# (Llama's and Mistral's, which share it: the class decides)
LLAMA_OR_EMBED = replace(GGUF, classes=(("LlamaBidirectionalModel", LLAMA_EMBED),))
TEXT_ONLY = Unsupported("a text model: it has no vision part", applies=False)

FAMILIES = (
    Family(
        "Llama",
        "llama",
        "LlamaForCausalLM",
        tensors=t.TensorTable(
            "LlamaForCausalLM",
            t.SIZES,
            t.LAYER,
            {"attention_bias": (False, t.ATTENTION_BIAS), "mlp_bias": (False, t.MLP_BIAS)},
            nullable=tuple(t.WHEN_NULL),
            heads_divide_hidden=True,
        ),
        megatron=MegatronRules(MEGATRON_RULES, m.Signature(), _no_biases),
        meta_names=META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=LLAMA_OR_EMBED,
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("a dense family: merge-moe assembles Mixtral or Qwen MoE from it", applies=False),
        torchtitan_names=TORCHTITAN,
        torchtune_names=TORCHTUNE_LLAMA,
        # (its layers alone, as embedding models have them: LLM2Vec's, and attending both ways, llama-embed-nemotron's;
        # the class's first name, as early configs name it)
        also=("LlamaModel", "LlamaBidirectionalModel", "LLaMAForCausalLM", "IQuestCoderForCausalLM"),
    ),
    Family(
        "Mistral",
        "mistral",
        "MistralForCausalLM",
        tensors=t.TensorTable(
            "MistralForCausalLM", {**t.SIZES, "num_key_value_heads": 8}, t.LAYER, {}, nullable=("head_dim",)
        ),
        # (Megatron-LM's args describe a Llama: a Mistral is read with --config-from its config)
        megatron=MegatronRules(MEGATRON_RULES, None, _no_biases),
        meta_names=META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=LLAMA_OR_EMBED,
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("a dense family: merge-moe assembles Mixtral or Qwen MoE from it", applies=False),
        torchtitan_names=Unsupported("torchtitan has no Mistral model", applies=False),
        torchtune_names=TORCHTUNE_LLAMA,  # (torchtune's Mistral is its Llama, named alike)
        notes={
            "megatron_legacy": "with --config-from (the args describe a Llama)",
            "megatron_dist": "with --config-from (the args describe a Llama)",
        },
    ),
    Family(
        "SmolLM3",
        "smollm3",
        "SmolLM3ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's layout of SmolLM3 (its layers without rotary embeddings) is not mapped yet"),
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "SMOLLM3",
            hyperparameters=llama_hyperparameters,
            computed=llama_computed,
            permute_qk=True,
            llama_vocabulary=True,
            check_config=smollm3_checked,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

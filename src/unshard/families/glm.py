"""GLM-4.5 and GLM-4.6 (`Glm4MoeForCausalLM`): grouped-query attention with q/k/v biases, optional q/k norms and
rotary embeddings on part of each head, then DeepSeek-V3's MoE block (deepseek.py): dense first layers, a sigmoid
router with an expert bias, routed and shared experts."""

from __future__ import annotations

from typing import Any

from ..names import megatron_rules as m
from .deepseek import MEGATRON_SIGMOID_MOE, sigmoid_moe_config
from .llama import TEXT_ONLY
from .parts import NO_META_NAMES, Family, MegatronRules, Unsupported


def _config(args: dict[str, Any]) -> dict[str, Any]:
    return {
        "attention_bias": True,
        "use_qk_norm": bool(args.get("qk_layernorm")),
        "partial_rotary_factor": args.get("rotary_percent", 1.0),
        **sigmoid_moe_config(args),
    }


FAMILIES = (
    Family(
        "GLM-4.5",
        "glm4_moe",
        "Glm4MoeForCausalLM",
        tensors=Unsupported("not written down: transformers is asked once per config (then remembered)"),
        megatron=MegatronRules(
            {**m.COMMON, **MEGATRON_SIGMOID_MOE},
            m.Signature(
                qkv_bias=True,
                qk_norm=None,
                experts=True,
                shared_experts=True,
                sigmoid_router=True,
                partial_rotary=None,
            ),
            _config,
        ),
        meta_names=NO_META_NAMES,
        fused_siblings=(("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj")),
        gguf=Unsupported("llama.cpp's glm4moe is not written by unshard yet"),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={
            "megatron_legacy": "partial rotary, dense first layers; MTP layers are left out",
            "megatron_dist": "partial rotary, dense first layers; MTP layers are left out",
        },
    ),
)

"""Mixtral: Llama's attention, each layer's MLP as experts `block_sparse_moe.experts.E.w1/w2/w3` behind a router;
llama.cpp's `llama` with the experts stacked; what merge-moe assembles from Llama or Mistral models (mergekit's
default)."""

from __future__ import annotations

from ..names import megatron_rules as m
from .llama import GGUF, TEXT_ONLY
from .parts import NO_META_NAMES, NO_TABLE, Family, MegatronRules, MoELayout

L = m.L
MEGATRON_MOE = {
    "decoder.layers.{i}.mlp.router.weight": L + "block_sparse_moe.gate.weight",
    "decoder.layers.{i}.mlp.experts.{e}.linear_fc1.weight": (
        m.GATE_UP,
        L + "block_sparse_moe.experts.{e}.w1.weight",
        L + "block_sparse_moe.experts.{e}.w3.weight",
    ),
    "decoder.layers.{i}.mlp.experts.{e}.linear_fc2.weight": L + "block_sparse_moe.experts.{e}.w2.weight",
}


def _config(args: dict) -> dict:
    return m.moe_config(args, num_local_experts=args["num_experts"], intermediate_size=args.get("moe_ffn_hidden_size"))


FAMILIES = (
    Family(
        "Mixtral",
        "mixtral",
        "MixtralForCausalLM",
        tensors=NO_TABLE,
        megatron=MegatronRules({**m.COMMON, **MEGATRON_MOE}, m.Signature(experts=True), _config),
        meta_names=NO_META_NAMES,
        # (w1 and w3 on disk; gate and up where transformers names them so)
        fused_siblings=(("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj"), ("w1", "w3")),
        gguf=GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=MoELayout(
            "Mixtral",
            "MixtralConfig",
            ("llama", "mistral"),
            0,
            "block_sparse_moe.experts.{e}.{part}.weight",
            {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"},
            "block_sparse_moe.gate.weight",
            "num_local_experts",
            {"sliding_window": None},
        ),
    ),
)

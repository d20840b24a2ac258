"""Seed-OSS (ByteDance Seed's, trained with verl): Llama's layout with biases on q, k and v and wide heads; llama.cpp's
seed_oss, whose header is the converter's TextModel's and whose rotary turns as transformers' does."""

from __future__ import annotations

from .llama import MEGATRON_RULES, SIBLINGS, TEXT_ONLY
from .parts import NO_META_NAMES, NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, MegatronRules

FAMILIES = (
    Family(
        "Seed-OSS",
        "seed_oss",
        "SeedOssForCausalLM",
        tensors=NO_TABLE,
        # (Qwen2's layers, q, k and v with biases: Megatron-LM's args describe a Qwen2, which computes it)
        megatron=MegatronRules(MEGATRON_RULES, None, read_as="a Qwen2"),
        meta_names=NO_META_NAMES,
        notes={
            "megatron_legacy": "with --config-from (the args describe a Qwen2, which it is)",
            "megatron_dist": "with --config-from (the args describe a Qwen2, which it is)",
        },
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("SEED_OSS", vocabulary="bpe"),  # (the converter reads tokenizer.json alone for it)
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

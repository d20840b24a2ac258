"""Seed-OSS (ByteDance Seed's, trained with verl): Llama's layout with biases on q, k and v and wide heads; llama.cpp's
seed_oss, whose header is the converter's TextModel's and whose rotary turns as transformers' does."""

from __future__ import annotations

from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_META_NAMES, NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported

FAMILIES = (
    Family(
        "Seed-OSS",
        "seed_oss",
        "SeedOssForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Seed-OSS layout is not mapped yet"),
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("SEED_OSS", vocabulary="bpe"),  # (the converter reads tokenizer.json alone for it)
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

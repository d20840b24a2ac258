"""StarCoder 2 (BigCode's): grouped-query attention with biases everywhere, LayerNorms with biases, a two-layer GELU
MLP (c_fc, c_proj); llama.cpp's starcoder2, whose converter is its TextModel as it is."""

from __future__ import annotations

from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model

FAMILIES = (
    Family(
        "StarCoder 2",
        "starcoder2",
        "Starcoder2ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's StarCoder 2 layout (LayerNorms, a GELU MLP) is not mapped yet"),
        **no_trainer_model("StarCoder 2"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        gguf=GGUFPart("STARCODER2", vocabulary="bpe"),  # (the converter's TextModel reads tokenizer.json alone)
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

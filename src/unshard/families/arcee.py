"""Arcee's AFM: Llama's attention with a two-layer ReLU² MLP (up and down, no gate); llama.cpp's arcee, whose converter
is its LlamaModel (q and k reordered per head)."""

from __future__ import annotations

from .gguf_hooks import llama_hyperparameters
from .llama import TEXT_ONLY, llama_computed
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model

FAMILIES = (
    Family(
        "Arcee (AFM)",
        "arcee",
        "ArceeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's AFM layout (a ReLU² MLP without a gate) is not mapped yet"),
        **no_trainer_model("AFM"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        gguf=GGUFPart(
            "ARCEE",
            hyperparameters=llama_hyperparameters,
            computed=llama_computed,
            permute_qk=True,
            llama_vocabulary=True,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

"""OLMo 2 and OLMo 3 (AllenAI's): Llama's projections with the norms moved after attention and after the MLP, and q
and k normed over all heads at once; OLMo 3 with three sliding-window layers to each global one. llama.cpp's olmo2,
with the TextModel's header and the sliding window's pattern."""

from __future__ import annotations

from pathlib import Path

from .gguf_hooks import text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_META_NAMES, NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported


def olmo2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Olmo2Model's: the TextModel's, then a sliding window's width and which layers have it (the
    config's layer types; without them, OLMo 3's three in four)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    if "sliding_window" in hparams:
        writer.add_sliding_window(hparams["sliding_window"])
        kinds = hparams.get("layer_types")
        writer.add_sliding_window_pattern(
            [kind == "sliding_attention" for kind in kinds]
            if kinds is not None
            else [(i + 1) % 4 != 0 for i in range(hparams["num_hidden_layers"])]
        )


GGUF = GGUFPart("OLMO2", hyperparameters=olmo2_hyperparameters, vocabulary="bpe")
MEGATRON = Unsupported("Megatron's OLMo layout (norms after attention and the MLP) is not mapped yet")

FAMILIES = tuple(
    Family(
        name,
        model_type,
        architecture,
        tensors=NO_TABLE,
        megatron=MEGATRON,
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    )
    for name, model_type, architecture in (
        ("OLMo 2", "olmo2", "Olmo2ForCausalLM"),
        ("OLMo 3", "olmo3", "Olmo3ForCausalLM"),
    )
)

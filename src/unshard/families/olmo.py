"""OLMo (AllenAI's first): Llama's projections behind LayerNorms without parameters, q, k and v clipped where the
config says; llama.cpp's olmo, q and k reordered per head as for a llama. OLMo 2 and OLMo 3: Llama's projections with
the norms moved after attention and after the MLP, and q and k normed over all heads at once; OLMo 3 with three
sliding-window layers to each global one. llama.cpp's olmo2, with the TextModel's header and the sliding window's
pattern."""

from __future__ import annotations

from pathlib import Path

from .gguf_hooks import text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_META_NAMES, NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


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


def olmo_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's OlmoModel's: the TextModel's, the LayerNorm's epsilon (1e-5, which transformers' OLMo has
    fixed), and the clip of q, k and v where the config sets one."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_layer_norm_eps(1e-5)
    if hparams.get("clip_qkv") is not None:
        writer.add_clamp_kqv(hparams["clip_qkv"])


GGUF = GGUFPart("OLMO2", hyperparameters=olmo2_hyperparameters, vocabulary="bpe")
MEGATRON = Unsupported("Megatron's OLMo layout (norms after attention and the MLP) is not mapped yet")

FAMILIES = (
    Family(
        "OLMo",
        "olmo",
        "OlmoForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's OLMo layout (LayerNorms without parameters) is not mapped yet"),
        **no_trainer_model("OLMo"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("OLMO", hyperparameters=olmo_hyperparameters, permute_qk=True, vocabulary="bpe"),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
) + tuple(
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

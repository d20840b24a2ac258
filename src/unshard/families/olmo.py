"""OLMo (AllenAI's first): Llama's projections behind LayerNorms without parameters, q, k and v clipped where the
config says; llama.cpp's olmo, q and k reordered per head as for a llama. OLMo 2 and OLMo 3: Llama's projections with
the norms moved after attention and after the MLP, and q and k normed over all heads at once; OLMo 3 with three
sliding-window layers to each global one. llama.cpp's olmo2, with the TextModel's header and the sliding window's
pattern. OLMoE: OLMo 2's attention (q and k normed over all heads) before the norms, then experts behind a softmax
router whose chosen weights are not renormalised; llama.cpp's olmoe with the experts stacked."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_quiet, text_hyperparameters
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


def olmoe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's OlmoeModel's: the TextModel's, then the RMS norms' epsilon as 1e-5 (in its place)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    with gguf_quiet():
        writer.add_layer_norm_rms_eps(1e-5)


def olmoe_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's olmoe would compute otherwise, or not load: renormalised experts' weights, q, k and v clipped,
    another epsilon than the converter's 1e-5, fewer key-value heads than heads (its k norm is as wide as the model)."""
    heads = hparams["num_attention_heads"]
    for refused, what in (
        (
            (hparams.get("num_key_value_heads") or heads) != heads,
            f"num_key_value_heads is {hparams.get('num_key_value_heads')}, and llama.cpp's olmoe gives each of the "
            f"{heads} heads its own keys",
        ),
        (hparams.get("norm_topk_prob"), "norm_topk_prob is set, and llama.cpp's olmoe never renormalises"),
        (hparams.get("clip_qkv") is not None, "clip_qkv is set, and llama.cpp's olmoe does not clip q, k and v"),
        (
            hparams.get("rms_norm_eps", 1e-5) != 1e-5,
            f"rms_norm_eps is {hparams.get('rms_norm_eps')}, and the converter writes llama.cpp's olmoe 1e-5",
        ),
    ):
        if refused:
            raise ConfigMismatchError(f"{where}: {what}; serve this model with transformers or vLLM")


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
    Family(
        "OLMoE",
        "olmoe",
        "OlmoeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's OLMoE layout (q and k normed over all heads, experts) is not mapped yet"),
        **no_trainer_model("OLMoE"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("OLMOE", hyperparameters=olmoe_hyperparameters, check_config=olmoe_checked, vocabulary="bpe"),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
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

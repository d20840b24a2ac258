"""Mellum (JetBrains' code models, `MellumForCausalLM`): Qwen3-MoE's layers (q and k normed per head) with experts in
every layer behind a softmax router whose chosen weights are renormalised, a window on some layers; llama.cpp's
mellum, which PyPI's gguf-py 0.19 lacks (written with llama.cpp's own, sinks/gguf)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import LLAMA_CPP_GGUF_PY, NO_TABLE, Family, GGUFPart, Unsupported, no_trainer_model


def mellum_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MellumModel's: the TextModel's, the experts' width, then the window and the layers attending
    within it, unless the config turns the window off."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    if hparams.get("moe_intermediate_size") is not None:
        writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    if hparams.get("use_sliding_window") in (True, None) and hparams.get("sliding_window") is not None:
        writer.add_sliding_window(hparams["sliding_window"])
        writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in hparams["layer_types"]])


def mellum_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's mellum computes: experts in every layer, their chosen weights renormalised, rope on the
    sliding layers at the global layers' base (it reads theirs and turns them at the other). Else one line."""
    by_kind = hparams.get("rope_parameters") or {}
    bases = {kind: (by_kind.get(kind) or {}).get("rope_theta") for kind in ("full_attention", "sliding_attention")}
    why = None
    if (
        "sliding_attention" in hparams.get("layer_types", ())
        and None not in bases.values()
        and len(set(bases.values())) > 1
    ):
        why = (
            f"the sliding layers turn rope at {bases['sliding_attention']} and the others at "
            f"{bases['full_attention']}, and llama.cpp's mellum turns every layer at the latter"
        )
    elif any(kind != "sparse" for kind in hparams.get("mlp_layer_types") or ()):
        why = f"mlp_layer_types is {hparams['mlp_layer_types']}, and llama.cpp's mellum runs experts in every layer"
    elif not hparams.get("norm_topk_prob", True):
        why = "norm_topk_prob is off, and llama.cpp's mellum renormalises the chosen experts' weights"
    if why:
        raise ConfigMismatchError(
            f"{where}: {why}: it would compute another model; serve this one with transformers or vLLM"
        )


FAMILIES = (
    Family(
        "Mellum",
        "mellum",
        "MellumForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Mellum layout is not mapped yet"),
        **no_trainer_model("Mellum"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("MELLUM", hyperparameters=mellum_hyperparameters, check_config=mellum_checked, vocabulary="bpe"),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="mellum")},
    ),
)

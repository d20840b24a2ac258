"""LightOnOCR (`LightOnOcrForConditionalGeneration`; the Hub's LightOnOCR-1B and -2 name it
`LightOnOCRForConditionalGeneration`): a Qwen3 beside Mistral 3's Pixtral tower with its patch merger and two-layer
GELU projector, under its own names (`model.vision_encoder.`, `model.vision_projection.`). The text model as llama.cpp's
qwen3 (the converter's Qwen3Model, which skips the tower's tensors), the tower and the projector as the mmproj file of
llama.cpp's `lightonocr` projector: Pixtral's graph without the [IMG_BREAK] token between rows."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .mistral3 import PIXTRAL, PIXTRAL_NORM_EPS
from .parts import GGUFPart, multimodal_family, prefix_renamed
from .qwen import qwen_hyperparameters

# the converter's renames of LightOnOCR's towers to the names its Pixtral model maps
CONVERTER_PREFIXES = (
    ("model.vision_encoder.", "vision_tower."),
    ("model.vision_projection.", "multi_modal_projector."),
)


def lightonocr_checked(hparams: dict, where: Path) -> list[str] | None:
    """A Qwen3 text model; the patch merger's norm at the epsilon llama.cpp takes for it (the tower's), or a note of
    how far the text model's (which LightOnOCR's merger takes) is from it."""
    found = hparams.get("model_type")
    if found != "qwen3":
        raise ConfigMismatchError(
            f"{where}: text_config's model_type is {found!r}, and unshard writes LightOnOCR's text model as a Qwen3; "
            "write a folder and use llama.cpp's convert_hf_to_gguf.py"
        )
    eps = hparams.get("rms_norm_eps", PIXTRAL_NORM_EPS)
    if eps == PIXTRAL_NORM_EPS:
        return None
    return [
        f"llama.cpp's lightonocr norms the patches before merging them at the tower's epsilon ({PIXTRAL_NORM_EPS}), "
        f"where LightOnOCR takes the text model's ({eps}): image features some 1e-7 apart (measured on a tiny model, "
        "within the tower's own rounding)"
    ]


LIGHTONOCR_MMPROJ = replace(
    PIXTRAL,
    projector="LIGHTONOCR",
    vision=r"^model\.(?:vision_encoder|vision_projection)\.",
    converter_name=partial(prefix_renamed, CONVERTER_PREFIXES),  # (its LightOnOCR renames, then Pixtral's)
    text_rows=None,  # (no [IMG_BREAK] between rows: the converter's LightOnOCR model reads none)
)

FAMILIES = (
    multimodal_family(
        "LightOnOCR",
        "lighton_ocr",
        "LightOnOcrForConditionalGeneration",
        GGUFPart("QWEN3", hyperparameters=qwen_hyperparameters, check_config=lightonocr_checked),
        LIGHTONOCR_MMPROJ,
        "its Pixtral tower",
        also=("LightOnOCRForConditionalGeneration",),
    ),
)

"""LLaVA (`LlavaForConditionalGeneration`) with the Pixtral tower: Pixtral-12B's layout on the Hub, a Mistral beside
Mistral 3's tower without its patch merger, every patch a token, two linear layers to the text model's width. The text
model as llama.cpp's llama (the converter's LlamaModel), the tower and the projector as the mmproj file of llama.cpp's
pixtral projector, the [IMG_BREAK] embedding in it as for Mistral 3. LLaVA's other towers (CLIP's, SigLIP's) the
converter does not write."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from .llama import GGUF as LLAMA
from .mistral3 import PIXTRAL, pixtral_projector_checked
from .parts import multimodal_family


def llava_checked(hparams: dict, where: Path) -> None:
    """A Llama or Mistral text model without a sliding window (llama.cpp's llama has none), and the projector as
    llama.cpp's pixtral computes it: the tower's last layer, all of it (Pixtral has no class token to drop), GELU."""
    found = hparams.get("model_type")
    if found not in ("llama", "mistral"):
        raise ConfigMismatchError(
            f"{where}: text_config's model_type is {found!r}, and unshard writes LLaVA's text model as a Llama or a "
            "Mistral; write a folder and use llama.cpp's convert_hf_to_gguf.py"
        )
    if hparams.get("sliding_window") is not None:
        raise ConfigMismatchError(
            f"{where}: sliding_window is {hparams['sliding_window']}, and llama.cpp's llama has no sliding window: it "
            "would compute another model; serve this one with transformers or vLLM"
        )
    strategy = hparams.get("vision_feature_select_strategy", "default")
    if strategy != "full":
        raise ConfigMismatchError(
            f"{where}: vision_feature_select_strategy is {strategy!r}, and llama.cpp's pixtral projector takes every "
            "patch ('full'): its images would be another model's; serve this one with transformers or vLLM"
        )
    pixtral_projector_checked(hparams, where, merger=False)


FAMILIES = (
    multimodal_family(
        "LLaVA (Pixtral)",
        "llava",
        "LlavaForConditionalGeneration",
        replace(LLAMA, check_config=llava_checked),
        PIXTRAL,
        "its Pixtral tower",
        says="LLaVA",
    ),
)

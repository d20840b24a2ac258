"""Janus-Pro (`JanusForConditionalGeneration`): a Llama beside a SigLIP tower whose patches an MLP aligner projects to
the text model's width, and an image generator (a VQ model, its embeddings, aligner and head). The text model as
llama.cpp's llama, the tower and the aligner as the mmproj file of llama.cpp's janus_pro projector; the image
generator, which llama.cpp does not run, in neither file (as the converter leaves it out)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .gguf_hooks import fixed_in_code, mmproj_model_forced_type
from .llama import GGUF as LLAMA
from .parts import MmprojPart, multimodal_family


def janus_sizes(vision: dict, where: Path) -> dict:
    """The tower as the converter's JanusProVisionModel reads it (its MLP's width from mlp_ratio), refusing what
    llama.cpp's janus_pro computes otherwise: an aligner of two linear layers, no q and k norms, SigLIP's
    activations as the file names them (GELU or SiLU)."""
    act = vision.get("hidden_act", "gelu")
    runs = {
        "depth": (vision.get("depth", 2), 2),
        "use_qk_norm": (vision.get("use_qk_norm", False), False),
        "hidden_act": (act, act if act in ("gelu", "silu") else "gelu"),
    }
    fixed_in_code(where, "vision", "janus_pro projector", runs)
    if "intermediate_size" not in vision:
        vision = {**vision, "intermediate_size": int(round(vision["hidden_size"] * vision.get("mlp_ratio", 4.0)))}
    return vision


def janus_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The converter's JanusProVisionModel's: the tower's norms' epsilon, its activation."""
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    if vision.get("hidden_act", "gelu") == "gelu":
        writer.add_vision_use_gelu(True)
    else:
        writer.add_vision_use_silu(True)


def aligner_name(name: str) -> str:
    """The aligner's layers as the converter numbers them (fc1 the first, hidden_layers.N the (N+2)th)."""
    if name.startswith(("model.aligner.", "aligner.")):
        local = name.split("aligner.", 1)[1]
        layer = 0 if local.startswith("fc1.") else int(local.split(".")[1]) + 1
        return f"mm.{layer}.{local.rsplit('.', 1)[1]}"
    return name


JANUS_PRO = MmprojPart(
    "JANUS_PRO",
    r"^(?:model\.)?(?:vision_model|aligner)\.",
    janus_sizes,
    janus_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=aligner_name,
)

FAMILIES = (
    multimodal_family(
        "Janus-Pro",
        "janus",
        "JanusForConditionalGeneration",
        replace(
            LLAMA,
            towers=r"^(?:model\.)?(?:vqmodel|generation_embeddings|generation_aligner|generation_head)\.",
            towers_left_out="the image generator's: llama.cpp runs no image generation",
        ),
        JANUS_PRO,
        "its SigLIP tower and image generator",
    ),
)

"""Qwen's omni models: a thinker, which hears, sees and writes text, and a talker with a decoder to waveforms, which
speak; their checkpoints convert by transformers' own names (save_pretrained's `thinker.*`, `talker.*`, ...). To GGUF,
the thinker's text model as llama.cpp's converter writes it, and of its towers those llama.cpp computes as
transformers does, as the mmproj file the converter writes of the model they come from; the talker and its decoder in
neither file, as llama.cpp generates no speech of them.

Qwen2.5-Omni (`Qwen2_5OmniForConditionalGeneration`): a Qwen2 with M-RoPE (llama.cpp's qwen2vl), Qwen2.5-VL's vision
tower (its mmproj file as the converter writes Qwen2.5-VL's), and a Whisper-like audio encoder that attends within
chunks of 2 seconds, which llama.cpp runs as Qwen2-Audio's (across 30 seconds, padding included): left out.

Qwen3-Omni (`Qwen3OmniMoeForConditionalGeneration`): a thinker, which hears, sees and writes text (Qwen3-VL-MoE's
text model and vision tower, Qwen3-ASR's audio encoder with its projector within), and a talker with a
code-to-waveform decoder, which speak. Its checkpoints convert by transformers' own names (save_pretrained's
`thinker.*`, `talker.*`, `code2wav.*`, each expert a Linear layer). To GGUF: the thinker's text model as llama.cpp's
converter writes it (llama.cpp's qwen3vlmoe), and its audio encoder as the mmproj file the converter writes of
Qwen3-ASR's (qwen3a), which llama.cpp runs. The vision tower is in neither file: llama.cpp adds none of its deepstack
features to the text model (the converter writes Qwen3-Omni's text model without them), and mtmd does not load the
converter's file of both towers (its images' embeddings, deepstack's included, are wider than its sounds'). Nor are
the talker and the decoder: llama.cpp generates no speech of them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .audio import QWEN3A, im_end_tokens
from .gguf_hooks import gguf_quiet, mmproj_model_forced_type
from .parts import GGUFPart, MmprojPart, multimodal_family
from .qwen_moe import routing_checked
from .vlm import qwen3vl_moe_hyperparameters, qwen25vl_projector_keys, qwen25vl_sizes, qwen_vision_split


def thinker_tower_name(name: str) -> str:
    """The name the converter maps: the tower's own, as the model it comes from names it (Qwen2.5-VL's vision tower,
    Qwen3-ASR's audio encoder with its projector within: proj1, proj2)."""
    return name.removeprefix("thinker.")


# Qwen2.5-Omni's vision tower as the converter writes Qwen2.5-VL's
QWEN25_OMNI_VISION = MmprojPart(
    "QWEN25VL",
    r"^thinker\.visual\.",
    qwen25vl_sizes,
    qwen25vl_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=thinker_tower_name,
    rearranged=qwen_vision_split,
)
# Qwen3-Omni's audio encoder as the converter writes Qwen3-ASR's: the same encoder and projector
THINKER_AUDIO = replace(QWEN3A, vision=r"^thinker\.audio_tower\.", converter_name=thinker_tower_name)


def omni_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Qwen3-VL-MoE's, and no deepstack layers, as the converter writes Qwen3-Omni's whatever its tower's config
    says."""
    qwen3vl_moe_hyperparameters(writer, hparams, ftype, blocks, folder)
    with gguf_quiet():  # (written again in its place, as the converter does)
        writer.add_num_deepstack_layers(0)


FAMILIES = (
    multimodal_family(
        "Qwen2.5-Omni",
        "qwen2_5_omni",
        "Qwen2_5OmniForConditionalGeneration",
        GGUFPart(
            "QWEN2VL",
            dropped_prefix="thinker.",
            towers=r"^(?:thinker\.audio_tower|talker|token2wav)\.",
            towers_left_out="the audio encoder's, which llama.cpp runs as Qwen2-Audio's, attending across 30 seconds "
            "where Qwen2.5-Omni attends within chunks of 2; and the talker's and its decoder's, of which llama.cpp "
            "generates no speech",
        ),
        QWEN25_OMNI_VISION,
        "its thinker's towers and its talker",
        also=("Qwen2_5OmniModel",),  # (the class the Hub's config names, no class of transformers')
    ),
    multimodal_family(
        "Qwen3-Omni",
        "qwen3_omni_moe",
        "Qwen3OmniMoeForConditionalGeneration",
        GGUFPart(
            "QWEN3VLMOE",
            hyperparameters=omni_hyperparameters,
            after_vocabulary=im_end_tokens,
            check_config=routing_checked("qwen3vlmoe", True),
            vocabulary="bpe",
            dropped_prefix="thinker.",
            towers=r"^(?:thinker\.visual|talker|code2wav)\.",
            towers_left_out="the vision tower's, whose deepstack features llama.cpp adds none of to Qwen3-Omni's text "
            "model, and the talker's and its decoder's, of which llama.cpp generates no speech",
        ),
        THINKER_AUDIO,
        "its thinker's towers and its talker",
    ),
)

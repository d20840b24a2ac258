"""Speech-language models whose audio tower is Whisper's encoder: Qwen2-Audio (`Qwen2AudioForConditionalGeneration`),
a Qwen2 beside the encoder, its output pooled 2 to 1 and projected to the text model's width; Audio Flamingo 3
(`AudioFlamingo3ForConditionalGeneration`), the same with a two-layer GELU projector; Voxtral
(`VoxtralForConditionalGeneration`), a Llama beside it, 4 of its frames stacked into each token by an MLP. The text
model as llama.cpp's qwen2 or llama, the encoders and projectors as mmproj files of an audio tower alone (no vision
keys): llama.cpp's qwen2a and musicflamingo projectors; Voxtral's, which llama.cpp's voxtral computes otherwise, left
out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .gguf_hooks import fixed_in_code, mmproj_model_forced_type
from .llama import GGUF as LLAMA
from .parts import GGUFPart, MmprojPart, Rearrangement, Unsupported, multimodal_family


def whisper_sizes(config: dict, where: Path) -> dict | None:
    """Whisper's encoder as the converter's WhisperEncoderModel reads it (its sizes under Whisper's names), and as
    llama.cpp's graph runs it: GELU (erf), its embeddings unscaled."""
    audio = config.get("audio_config")
    if not audio:
        return None
    runs = {
        "activation_function": (audio.get("activation_function", "gelu"), "gelu"),
        "scale_embedding": (audio.get("scale_embedding", False), False),
    }
    fixed_in_code(where, "audio", "whisper encoder", runs)
    if "hidden_size" in audio or "intermediate_size" in audio:
        return audio
    return {
        **audio,
        "hidden_size": audio.get("d_model"),
        "intermediate_size": audio.get("encoder_ffn_dim"),
        "num_attention_heads": audio.get("encoder_attention_heads"),
        "num_hidden_layers": audio.get("encoder_layers"),
    }


def qwen2a_projector_keys(writer, hparams: dict, vision: dict | None, processor: dict) -> None:
    """The mel bins the encoder reads and its norms' epsilon (Whisper's config has none: 1e-5)."""
    audio = hparams["audio_config"]
    writer.add_audio_num_mel_bins(audio["num_mel_bins"])
    writer.add_audio_attention_layernorm_eps(audio.get("layer_norm_eps", 1e-5))


def whisper_name(name: str) -> str:
    """The name the converter maps: the projector's under `audio.`, as it renames it apart from a vision one."""
    name = name.removeprefix("model.")
    return "audio." + name if name.startswith("multi_modal_projector.") else name


def whisper_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's WhisperEncoderModel's: the convolutions' kernels in F16 whatever the file's type, then
    MmprojModel's (the position embedding in F32)."""
    if ".conv" in source and ".weight" in source:
        return gguf.GGMLQuantizationType.F16
    return mmproj_model_forced_type(gguf, source, name, shape, qtype, file_type)


def as_column(band) -> tuple:
    return (band.reshape(-1, 1),)


def conv_bias_as_column(name: str, shape: tuple[int, ...], sizes: dict) -> Rearrangement | None:
    """The convolutions' biases as columns, as the converter stores them (llama.cpp adds them to each frame)."""
    if name.endswith(("conv1.bias", "conv2.bias")):
        return Rearrangement({name: (shape[0], 1)}, as_column)
    return None


QWEN2A = MmprojPart(
    "QWEN2A",
    r"^(?:model\.)?(?:audio_tower|multi_modal_projector)\.",
    None,
    qwen2a_projector_keys,
    forced_type=whisper_forced_type,
    converter_name=whisper_name,
    rearranged=conv_bias_as_column,
    audio_sizes=whisper_sizes,
)


def flamingo_projector_checked(config: dict, where: Path) -> dict | None:
    """Whisper's encoder (as Qwen2-Audio's), and the projector as llama.cpp's musicflamingo runs it: two linear layers
    with biases, GELU (erf) between."""
    runs = {
        "projector_hidden_act": (config.get("projector_hidden_act", "gelu"), "gelu"),
        "projector_bias": (config.get("projector_bias", True), True),
    }
    fixed_in_code(where, "audio", "musicflamingo projector", runs)
    return whisper_sizes(config, where)


def flamingo_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's AudioFlamingo3WhisperEncoderModel's: the convolutions' kernels in F32 whatever the file's type
    (the model was trained in bf16, which F16 may not hold), then MmprojModel's."""
    if ".conv" in source and ".weight" in source:
        return gguf.GGMLQuantizationType.F32
    return mmproj_model_forced_type(gguf, source, name, shape, qtype, file_type)


MUSIC_FLAMINGO = replace(
    QWEN2A, projector="MUSIC_FLAMINGO", forced_type=flamingo_forced_type, audio_sizes=flamingo_projector_checked
)


# llama.cpp's voxtral (llama-cpp-python 0.3.36's) averages the encoder's frames 2 to 1 before stacking 4 of them, where
# Voxtral stacks them as they are (transformers 5.24 builds the pooling and does not use it): it gives half the tokens
# of another model, and stops on the lengths it counts otherwise than its graph makes them (every 30-second chunk)
VOXTRAL_MMPROJ = Unsupported(
    "llama.cpp's voxtral pools the encoder's frames 2 to 1 where Voxtral does not (half the tokens of another model, "
    "and it stops on most sounds): the audio tower is left out"
)


FAMILIES = (
    multimodal_family(
        "Qwen2-Audio",
        "qwen2_audio",
        "Qwen2AudioForConditionalGeneration",
        GGUFPart("QWEN2"),
        QWEN2A,
        "its Whisper encoder",
    ),
    multimodal_family(
        "Audio Flamingo 3",
        "audioflamingo3",
        "AudioFlamingo3ForConditionalGeneration",
        GGUFPart("QWEN2"),
        MUSIC_FLAMINGO,
        "its Whisper encoder",
    ),
    multimodal_family(
        "Voxtral",
        "voxtral",
        "VoxtralForConditionalGeneration",
        replace(LLAMA, towers=r"^(?:model\.)?(?:audio_tower|multi_modal_projector)\."),
        VOXTRAL_MMPROJ,
        "its Whisper encoder",
    ),
)

"""Speech-language models whose audio tower is Whisper's encoder: Qwen2-Audio (`Qwen2AudioForConditionalGeneration`),
a Qwen2 beside the encoder, its output pooled 2 to 1 and projected to the text model's width; Audio Flamingo 3
(`AudioFlamingo3ForConditionalGeneration`), the same with a two-layer GELU projector; Voxtral
(`VoxtralForConditionalGeneration`), a Llama beside it, 4 of its frames stacked into each token by an MLP. The text
model as llama.cpp's qwen2 or llama, the encoders and projectors as mmproj files of an audio tower alone (no vision
keys): llama.cpp's qwen2a and musicflamingo projectors; Voxtral's, which llama.cpp's voxtral computes otherwise, left
out. Qwen3-ASR (`Qwen3ASRForConditionalGeneration`): a Qwen3 beside Qwen3-Omni's audio encoder (three stride-2
convolutions over chunks of 100 mel frames, sinusoidal positions), as llama.cpp's qwen3vl and its qwen3a projector."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .gguf_hooks import fixed_in_code, gguf_quiet, json_or_empty, mmproj_model_forced_type, rope_parameters
from .llama import GGUF as LLAMA
from .parts import GGUFPart, MmprojPart, Rearrangement, Unsupported, multimodal_family
from .vlm import qwen3vl_hyperparameters


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


def qwen3a_sizes(config: dict, where: Path) -> dict | None:
    """Qwen3-ASR's encoder: Whisper's sizes under its names (whisper_sizes), cut as llama.cpp's qwen3a cuts every
    sound whatever the file says: chunks of 100 mel frames (n_window 50) through the convolutions, attention within
    windows of 800 frames (n_window_infer)."""
    audio = config.get("audio_config") or {}
    runs = {"n_window": (audio.get("n_window"), 50), "n_window_infer": (audio.get("n_window_infer"), 800)}
    fixed_in_code(where, "audio", "qwen3a encoder", runs)
    return whisper_sizes(config, where)


# transformers 5's projector, which Qwen's own release (the converter's layout) keeps inside the encoder
QWEN3A_PROJECTOR = {
    "multi_modal_projector.linear_1.": "audio_tower.proj1.",
    "multi_modal_projector.linear_2.": "audio_tower.proj2.",
}


def qwen3a_name(name: str) -> str:
    """The name the converter maps: the projector's under the encoder's names for it (proj1, proj2)."""
    name = name.removeprefix("model.")
    for ours, theirs in QWEN3A_PROJECTOR.items():
        name = name.replace(ours, theirs)
    return name


def conv2d_bias_as_image(name: str, shape: tuple[int, ...], sizes: dict) -> Rearrangement | None:
    """The convolutions' biases as [channels, 1, 1], as the converter stores them (llama.cpp adds them to each
    pixel)."""
    if ".conv2d" in name and name.endswith(".bias"):
        return Rearrangement({name: (shape[0], 1, 1)}, as_image)
    return None


def as_image(band) -> tuple:
    return (band.reshape(-1, 1, 1),)


def sinusoid_positions(vision: dict | None, audio: dict) -> dict:
    """The positions of Whisper's 1500 frames as the converter computes them (torch, in its order of operations),
    of which llama.cpp adds the first 13 to each chunk's tokens, as transformers computes them."""
    import numpy as np
    import torch

    channels, length = audio["hidden_size"], 1500
    step = np.log(10000) / (channels // 2 - 1)
    inverse = torch.exp(-step * torch.arange(channels // 2).float())
    scaled = torch.arange(length)[:, np.newaxis] * inverse[np.newaxis, :]
    return {"a.position_embd.weight": torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1).numpy()}


QWEN3A = MmprojPart(
    "QWEN3A",
    r"^(?:model\.)?(?:audio_tower|multi_modal_projector)\.",
    None,
    qwen2a_projector_keys,
    forced_type=whisper_forced_type,
    converter_name=qwen3a_name,
    rearranged=conv2d_bias_as_image,
    audio_sizes=qwen3a_sizes,
    projector_type_key="clip.audio",
    computed=sinusoid_positions,
)

# The chat template the converter writes for Qwen3-ASR over the tokenizer's: Qwen's ChatML
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chatml_tokens(writer, hparams: dict, folder: Path) -> None:
    """The converter's fix of Qwen3-ASR's tokens: ChatML as the chat template, then im_end_tokens'."""
    with gguf_quiet():  # (written again over the tokenizer's, in its place, as the converter does)
        writer.add_chat_template(CHATML)
    im_end_tokens(writer, hparams, folder)


def im_end_tokens(writer, hparams: dict, folder: Path) -> None:
    """The converter's fix of Qwen3-ASR's and Qwen3-Omni's tokens: `<|im_end|>` as both the start and the end of text
    where tokenizer_config.json lists it among its added tokens (the Hub's files do; transformers 5 saves them in
    tokenizer.json alone, and then the converter keeps the tokenizer's)."""
    added = json_or_empty(folder / "tokenizer_config.json").get("added_tokens_decoder") or {}
    end = next((int(i) for i, token in added.items() if token.get("content") == "<|im_end|>"), None)
    if end is not None:
        with gguf_quiet():  # (written again over the tokenizer's, in their places, as the converter does)
            writer.add_bos_token_id(end)
            writer.add_eos_token_id(end)


def sequence_sections(hparams: dict) -> list[int]:
    """M-RoPE's sections that turn every pair of a head by the sequence's position, as a 1-D rotary does: llama.cpp's
    qwen3vl interleaves the axes pair by pair (t, h, w, t, ...), a text or sound token's position the same on those
    three and 0 on the fourth, so each axis takes every third pair and none is left to the fourth."""
    pairs = (hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]) // 2
    return [-(-(pairs - axis) // 3) for axis in range(3)] + [0]


def qwen3_asr_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Qwen3-VL's (the converter's, of no deepstack layers), and where the config has no M-RoPE sections, which
    llama.cpp's qwen3vl cannot load without (the converter then writes a file it does not load), sections that turn
    the rotary by the sequence, as transformers' Qwen3 does."""
    qwen3vl_hyperparameters(writer, hparams, ftype, blocks, folder)
    if "mrope_section" not in rope_parameters(hparams)[1]:
        writer.add_rope_dimension_sections(sequence_sections(hparams))


def qwen3_asr_sections_noted(hparams: dict, where: Path) -> list[str]:
    if "mrope_section" in rope_parameters(hparams)[1]:
        return []
    return [
        f"no M-RoPE sections in the text config: written as {sequence_sections(hparams)}, the rotary turned by the "
        "sequence as transformers' Qwen3 turns it (llama.cpp's qwen3vl does not load a file without them)"
    ]


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
        "Qwen3-ASR",
        "qwen3_asr",
        "Qwen3ASRForConditionalGeneration",
        GGUFPart(
            "QWEN3VL",
            hyperparameters=qwen3_asr_hyperparameters,
            after_vocabulary=chatml_tokens,
            check_config=qwen3_asr_sections_noted,
        ),
        QWEN3A,
        "its audio encoder",
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

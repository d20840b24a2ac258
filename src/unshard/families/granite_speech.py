"""Granite Speech (`GraniteSpeechForConditionalGeneration`): a Granite beside a Conformer encoder (relative positions,
a convolution module batch-normed in each layer) and a Q-Former projector that reads the encoder's frames by windows.
To GGUF as llama.cpp's converter writes it: the text model as Granite's (llama.cpp's granite), the encoder and the
projector as the mmproj file of llama.cpp's granite_speech projector: each batch norm folded into a scale and a shift
(its running statistics, weight and bias, as llama.cpp applies them), keys and values apart, the convolutions' kernels
as 2-D tensors in F32. Granite Speech Plus (`GraniteSpeechPlusForConditionalGeneration`): the same, its projector
reading some of the encoder's layers beside its last (llama.cpp's feature layers)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import fixed_in_code, mmproj_model_forced_type
from .granite import GRANITE_GGUF
from .parts import MmprojPart, Rearrangement, multimodal_family

# The epsilon of llama.cpp's norms of the encoder, and of the batch norms the converter folds (torch's default, as
# transformers' Granite Speech builds them)
EPSILON = 1e-5
BATCH_NORM = re.compile(r"^(.*\.batch_norm)\.(weight|bias|running_mean|running_var|num_batches_tracked)$")


def granite_speech_sizes(config: dict, where: Path) -> dict | None:
    """The encoder's sizes under the names the converter gives them; one line where llama.cpp's graph computes
    otherwise whatever the file says: heads of the width over their count, a Q-Former of two layers, each
    cross-attending, normed at 1e-12, as wide as the encoder."""
    encoder = config.get("encoder_config")
    if not encoder:
        return None
    heads, width = encoder.get("num_heads"), encoder.get("hidden_dim")
    if heads and width and encoder.get("dim_head", width // heads) * heads != width:
        raise ConfigMismatchError(
            f"{where}: the encoder's heads are {encoder['dim_head']} wide, and llama.cpp's granite_speech takes "
            f"hidden_dim over num_heads ({width // heads}); serve this model with transformers or vLLM"
        )
    projector = config.get("projector_config") or {}
    runs = {
        "projector's num_hidden_layers": (projector.get("num_hidden_layers"), 2),
        "projector's cross_attention_frequency": (projector.get("cross_attention_frequency"), 1),
        "projector's layer_norm_eps": (projector.get("layer_norm_eps"), 1e-12),
        "projector's hidden_size": (projector.get("hidden_size"), width),
    }
    fixed_in_code(where, "audio", "granite_speech", runs)
    return {
        **encoder,
        "hidden_size": width,
        "intermediate_size": width * encoder.get("feedforward_mult", 4),
        "num_attention_heads": heads,
        "num_hidden_layers": encoder.get("num_layers"),
    }


def granite_speech_keys(writer, hparams: dict, vision: dict | None, processor: dict) -> None:
    """The encoder's input (stacked mel bins), chunks, convolution and positions; the projector's windows."""
    encoder = hparams["encoder_config"]
    writer.add_audio_num_mel_bins(encoder["input_dim"])
    writer.add_audio_attention_layernorm_eps(EPSILON)
    writer.add_audio_chunk_size(encoder["context_size"])
    writer.add_audio_conv_kernel_size(encoder["conv_kernel_size"])
    writer.add_audio_max_pos_emb(encoder["max_pos_emb"])
    writer.add_audio_projector_window_size(hparams["window_size"])
    writer.add_audio_projector_downsample_rate(hparams["downsample_rate"])
    writer.add_audio_projector_head_count(hparams["projector_config"]["num_attention_heads"])


def granite_speech_name(name: str) -> str:
    return name.removeprefix("model.")  # (the names transformers holds; it saves them without)


def granite_speech_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's: the convolutions' kernels in F32 whatever the file's type, then MmprojModel's."""
    if ".conv" in source and source.endswith(".weight"):
        return gguf.GGMLQuantizationType.F32
    return mmproj_model_forced_type(gguf, source, name, shape, qtype, file_type)


def granite_speech_split(name: str, shape: tuple[int, ...], sizes: dict) -> Rearrangement | None:
    """The converter's: each attention's fused keys and values apart; the convolutions' kernels of width 1 (the
    pointwise ones) and the depthwise one's single input channel as 2-D tensors."""
    if name.endswith(".attn.to_kv.weight"):
        half = (shape[0] // 2, *shape[1:])
        halves_of_it = {name.replace("to_kv", "to_k"): half, name.replace("to_kv", "to_v"): half}
        return Rearrangement(halves_of_it, halves, shape[0])  # (one band: the whole tensor's halves, not a band's)
    if name.endswith(("up_conv.weight", "down_conv.weight")) and len(shape) == 3 and shape[2] == 1:
        return Rearrangement({name: shape[:2]}, squeezed)
    if "depth_conv" in name and name.endswith(".weight") and len(shape) == 3 and shape[1] == 1:
        return Rearrangement({name: (shape[0], shape[2])}, squeezed)
    return None


def halves(band) -> tuple:
    half = band.shape[0] // 2
    return band[:half], band[half:]


def squeezed(band) -> tuple:
    return (band.reshape(band.shape[0], -1),)


def batch_norms_folded(values: dict) -> dict:
    """Each batch norm as the converter folds it, in the tensors' own dtype and its order of operations: the scale
    weight / sqrt(running_var + eps) and the shift bias - running_mean * scale, written after its weight (the last of
    the four by name; its count of batches is left out)."""
    import torch

    norms: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in values.items():
        prefix, part = BATCH_NORM.match(name).groups()
        norms.setdefault(prefix, {})[part] = tensor
    folded = {}
    for prefix, norm in norms.items():
        lacking = [part for part in ("weight", "bias", "running_mean", "running_var") if part not in norm]
        if lacking:  # (a checkpoint saved without the buffers: the statistics the scale and shift are made of)
            raise ConfigMismatchError(
                f"{prefix}: the checkpoint has no {', '.join(lacking)} of this batch norm, which llama.cpp's "
                "granite_speech takes folded into a scale and a shift; convert a checkpoint saved with its buffers"
            )
        scale = norm["weight"] / torch.sqrt(norm["running_var"] + EPSILON)
        shift = norm["bias"] - norm["running_mean"] * scale
        after = f"{prefix}.weight"
        folded[f"{prefix}.weight"], folded[f"{prefix}.bias"] = (scale, after), (shift, after)
    return folded


GRANITE_SPEECH_MMPROJ = MmprojPart(
    "GRANITE_SPEECH",
    r"^(?:model\.)?(?:encoder|projector)\.",
    None,
    granite_speech_keys,
    forced_type=granite_speech_forced_type,
    converter_name=granite_speech_name,
    rearranged=granite_speech_split,
    audio_sizes=granite_speech_sizes,
    folds=BATCH_NORM.pattern,
    fold=batch_norms_folded,
)


def granite_speech_plus_sizes(config: dict, where: Path) -> dict | None:
    """Granite Speech's, and a projector as wide as the encoder's layers it reads concatenated (cat_hidden_layers and
    the last), as llama.cpp's graph feeds it."""
    sizes = granite_speech_sizes(config, where)
    layers = (config.get("encoder_config") or {}).get("cat_hidden_layers") or []
    wide = (config.get("projector_config") or {}).get("encoder_hidden_size")
    if sizes is not None and layers and wide != sizes["hidden_size"] * (len(layers) + 1):
        raise ConfigMismatchError(
            f"{where}: the projector reads {wide} features, and the encoder's layers {layers} and its last make "
            f"{sizes['hidden_size'] * (len(layers) + 1)}; pass --config-from the model's own folder"
        )
    return sizes


def granite_speech_plus_keys(writer, hparams: dict, vision: dict | None, processor: dict) -> None:
    """Granite Speech's keys, then which of the encoder's layers the projector also reads (gguf-py 0.19's writer has
    no method for the key)."""
    granite_speech_keys(writer, hparams, vision, processor)
    if layers := hparams["encoder_config"].get("cat_hidden_layers"):
        writer.add_array("clip.audio.feature_layer", layers)


FAMILIES = (
    multimodal_family(
        "Granite Speech",
        "granite_speech",
        "GraniteSpeechForConditionalGeneration",
        GRANITE_GGUF,
        GRANITE_SPEECH_MMPROJ,
        "its Conformer encoder and Q-Former projector",
    ),
    multimodal_family(
        "Granite Speech Plus",
        "granite_speech_plus",
        "GraniteSpeechPlusForConditionalGeneration",
        GRANITE_GGUF,
        replace(GRANITE_SPEECH_MMPROJ, projector_keys=granite_speech_plus_keys, audio_sizes=granite_speech_plus_sizes),
        "its Conformer encoder and Q-Former projector",
    ),
)

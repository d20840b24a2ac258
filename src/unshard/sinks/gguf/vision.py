"""A vision-language model's second GGUF file: the mmproj, which llama.cpp's multimodal library (mtmd: llama-mtmd-cli,
llama-server, llama-cpp-python) loads beside the text model's file to turn images into its input embeddings.

It holds the vision tower and the projector, as llama.cpp's converter writes them with `--mmproj`: gguf-py's CLIP
names (v.blk.0.attn_q.weight, mm.input_projection.weight), the `clip` architecture and the vision hyper-parameters
(image and patch size, widths, heads, the image processor's mean and std, the projector's type). So far: Gemma 3
(4B and up), whose SigLIP tower's patches are averaged into the tokens the projector maps to the text model's width.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ... import dtypes
from ...errors import ConfigMismatchError
from ...families.gguf_hooks import gguf_py, json_or_empty
from ...types import OutputTensor
from .header import general_metadata
from .tensors import GGUFPlan, GGUFTensor

VISION = re.compile(r"^(?:model\.)?(?:vision_tower|multi_modal_projector)\.")
MMPROJ_TYPES = ("f32", "f16", "bf16", "q8_0")  # (llama-quantize leaves an mmproj alone: others write it in f16)


def is_vision(name: str) -> bool:
    """Whether an output tensor belongs to the mmproj file (the vision tower, the projector)."""
    return VISION.match(name) is not None


def _converter_name(name: str) -> str:
    """The name the converter maps to gguf-py's CLIP names: the Hub's layout of Gemma 3's checkpoints
    (vision_tower.vision_model..., which transformers 5 saves as vision_tower...), `_weight` as `.weight`."""
    name = re.sub(r"^model\.", "", name)
    if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
        name = "vision_tower.vision_model." + name[len("vision_tower.") :]
    return name.replace("_weight", ".weight")


def plan_mmproj(
    file_type: str, outputs: list[OutputTensor], hparams: dict[str, Any], folder: Path, projector: str
) -> GGUFPlan:
    """The mmproj file's tensors, types, order and metadata, as the converter's `--mmproj` writes them. hparams: the
    config with its text_config's keys at the top (the text model's width) and its vision_config."""
    gguf = gguf_py()
    where = folder / "config.json"
    vision = hparams.get("vision_config") or {}
    if vision.get("vision_use_head"):
        raise ConfigMismatchError(
            f"{where}: the vision tower has a pooling head (vision_use_head), which llama.cpp's "
            "gemma3 projector does not run; serve this model with transformers or vLLM"
        )
    missing = [
        key
        for key in (
            "image_size",
            "patch_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        )
        if vision.get(key) is None
    ]
    if missing:
        raise ConfigMismatchError(
            f"{where}: vision_config lacks {', '.join(missing)}, which the mmproj file carries; "
            "pass --config-from the model's own folder"
        )
    mm_type = file_type if file_type in MMPROJ_TYPES else "f16"
    plan = GGUFPlan(mm_type, "clip", gguf.GGUFWriter(None, "clip"))
    if mm_type != file_type:
        plan.notes.append(f"the mmproj file is written in F16: llama-quantize makes {file_type} of the text model only")
    qtype = getattr(gguf.GGMLQuantizationType, mm_type.upper())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision["num_hidden_layers"])
    parameters = 0
    for output in sorted(outputs, key=lambda o: o.name):  # (the converter's order, from a one-file folder: sorted)
        source = _converter_name(output.name)
        name = names.get_name(source, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigMismatchError(
                f"{where}: the tensor {output.name} has no name in llama.cpp's mmproj (clip) "
                "file; llama.cpp cannot load it"
            )
        tensor_type = _tensor_type(gguf, source, name, output.shape, qtype)
        byte_shape = tuple(gguf.quant_shape_to_byte_shape(output.shape, tensor_type))
        shift = 1.0 if "soft_emb_norm.weight" in source else 0.0  # (Gemma's RMS norm: 1 + weight)
        stored = OutputTensor(name, byte_shape, dtypes.BY_NAME["uint8"])
        plan.encoded[output.name] = GGUFTensor((stored,), tensor_type, output.dtype, shift=shift)
        plan.positions[name] = (output.name,)
        parameters += math.prod(output.shape)
    _metadata(plan.writer, hparams, vision, folder, parameters, projector, mm_type)
    return plan


def _tensor_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype):
    """The converter's choice for an mmproj tensor: Gemma 3's projection in F16 and its embeddings (patches,
    positions) in F32 whatever the file's type; vectors and norms in F32; others in the file's type, or F16 where
    rows do not fill its blocks."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return gguf.GGMLQuantizationType.F32
    if "input_projection" in source:
        return gguf.GGMLQuantizationType.F16
    if ".embeddings." in source or name.startswith("v.position_embd"):
        return gguf.GGMLQuantizationType.F32
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    return gguf.GGMLQuantizationType.F16 if shape[-1] % block else qtype


def _metadata(writer, hparams: dict, vision: dict, folder: Path, parameters: int, projector: str, mm_type: str) -> None:
    """The converter's key-values for an mmproj, in its order: general ones, the file type, the vision tower's sizes
    and the image processor's normalisation, then the projector's."""
    gguf = gguf_py()
    writer.add_type(gguf.GGUFType.MMPROJ)
    general_metadata(writer, folder, (parameters, parameters, 0, 0))
    writer.add_file_type(
        gguf.LlamaFileType.ALL_F32 if mm_type == "f32" else getattr(gguf.LlamaFileType, "MOSTLY_" + mm_type.upper())
    )
    processor = _processor_config(folder)
    if "image_mean" not in processor or "image_std" not in processor:
        raise ConfigMismatchError(
            f"{folder}: no image processor's image_mean and image_std (preprocessor_config.json "
            "or processor_config.json), which the mmproj file carries; pass --config-from the "
            "model's own folder"
        )
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(hparams["hidden_size"])  # (the text model's width)
    writer.add_vision_image_size(vision["image_size"])
    writer.add_vision_patch_size(vision["patch_size"])
    writer.add_vision_embedding_length(vision["hidden_size"])
    writer.add_vision_feed_forward_length(vision["intermediate_size"])
    writer.add_vision_block_count(vision["num_hidden_layers"])
    writer.add_vision_head_count(vision["num_attention_heads"])
    writer.add_vision_image_mean(processor["image_mean"])
    writer.add_vision_image_std(processor["image_std"])
    writer.add_clip_projector_type(getattr(gguf.VisionProjectorType, projector))
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    writer.add_vision_use_gelu(True)
    # Patches are averaged n x n into the image's tokens: llama.cpp assumes 4 (Gemma 3's 64 x 64 patches into
    # 16 x 16 tokens) unless the file says otherwise.
    per_side = int(processor.get("image_seq_length", 256) ** 0.5)
    scale = (vision["image_size"] // vision["patch_size"]) // per_side
    if scale > 0 and scale != 4:
        writer.add_vision_projector_scale_factor(scale)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _processor_config(folder: Path) -> dict[str, Any]:
    """The image processor's settings as the converter reads them: preprocessor_config.json, then
    processor_config.json over it (its image_processor's settings at the top)."""
    settings: dict[str, Any] = {}
    for name in ("preprocessor_config.json", "processor_config.json"):
        found = json_or_empty(folder / name)
        for nested in ("media_proc_cfg", "image_processor"):
            if isinstance(found.get(nested), dict):
                found = {**found, **found[nested]}
        settings.update(found)
    return settings

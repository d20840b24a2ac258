"""A vision-language model's second GGUF file: the mmproj, which llama.cpp's multimodal library (mtmd: llama-mtmd-cli,
llama-server, llama-cpp-python) loads beside the text model's file to turn images into its input embeddings.

It holds the vision tower and the projector, as llama.cpp's converter writes them with `--mmproj`: gguf-py's CLIP
names (v.blk.0.attn_q.weight, mm.input_projection.weight), the `clip` architecture and the vision hyper-parameters
(image and patch size, widths, heads, the image processor's mean and std, the projector's type). What differs
between families (which tensors, their names and types, the projector's keys) each declares in its MmprojPart
(families/<family>.py): Gemma 3 (4B and up), whose SigLIP tower's patches are averaged into the tokens the projector
maps to the text model's width, and Qwen2-VL and Qwen2.5-VL, whose tower's patches are merged 2 x 2 by an MLP. A
model with an audio tower beside (Gemma 4's E2B and E4B) has both in the one file, as the converter writes them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ... import dtypes
from ...errors import ConfigMismatchError
from ...families.gguf_hooks import gguf_py, processor_config, tensor_name_map
from ...families.parts import MmprojPart
from ...types import OutputTensor
from .header import general_metadata, parameter_counts
from .tensors import GGUFPlan, GGUFTensor, Rearranged, WithRows

MMPROJ_TYPES = ("f32", "f16", "bf16", "q8_0")  # (llama-quantize leaves an mmproj alone: others write it in f16)
# The towers' sizes the mmproj file carries, as the converter's MmprojModel finds them (MmprojPart.sizes, .audio_sizes)
AUDIO_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
VISION_SIZES = ("image_size", "patch_size", *AUDIO_SIZES)
# the bounds of a clipped linear layer's input and output (Gemma 4's), which the converter names as suffixes
CLIPPED = (".input_max", ".input_min", ".output_max", ".output_min")
# q's and k's weights and biases, whose rows MmprojPart.permute_qk reorders within each head
QK = re.compile(r"\.[qk]_proj\.(weight|bias)$")


def is_vision(name: str, part: MmprojPart) -> bool:
    """Whether an output tensor belongs to the mmproj file (the vision tower, the projector)."""
    return re.match(part.vision, name) is not None


def plan_mmproj(
    file_type: str,
    outputs: list[OutputTensor],
    hparams: dict[str, Any],
    folder: Path,
    part: MmprojPart,
    read: Callable[[str], Any] | None = None,
) -> GGUFPlan:
    """The mmproj file's tensors, types, order and metadata, as the converter's `--mmproj` writes them. hparams: the
    config as the converter reads it (its text_config, vision_config and audio_config within); read: an output's
    values, for the few the converter folds into others (MmprojPart.fold)."""
    gguf = gguf_py()
    where = folder / "config.json"
    vision, audio = tower_sizes(part, hparams, where)
    mm_type = file_type if file_type in MMPROJ_TYPES else "f16"
    plan = GGUFPlan(mm_type, "clip", gguf.GGUFWriter(None, "clip"))
    plan.towers = tuple(kind for kind, sizes in (("vision", vision), ("audio", audio)) if sizes is not None)
    if mm_type != file_type:
        plan.notes.append(f"the mmproj file is written in F16: llama-quantize makes {file_type} of the text model only")
    if part.note:
        plan.notes.append(part.note)
    qtype = getattr(gguf.GGMLQuantizationType, mm_type.upper())
    # (the converter's names of a file of two towers are those of 128 blocks, whatever either tower has)
    names = tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 128 if vision and audio else (vision or audio)["num_hidden_layers"])

    def llama_name(source: str, output: str) -> str:
        if source.startswith(("v.", "mm.")):  # (named by the family as the converter names it)
            return source
        name = names.get_name(source, try_suffixes=(".weight", ".bias", *CLIPPED))
        if name is None:
            raise ConfigMismatchError(
                f"{where}: the tensor {output} has no name in llama.cpp's mmproj (clip) file; llama.cpp cannot load it"
            )
        return name

    def stored_as(source: str, name: str, shape: tuple[int, ...]):
        kind = _tensor_type(gguf, part, source, name, shape, qtype, mm_type)
        return OutputTensor(name, tuple(gguf.quant_shape_to_byte_shape(shape, kind)), dtypes.BY_NAME["uint8"]), kind

    parameters, head_dim = 0, 0  # (a tower without layers has no heads: Gemma 4 Unified's)
    if vision and part.permute_qk:
        head_dim = vision["hidden_size"] // vision["num_attention_heads"]
    folded = [o for o in outputs if part.folds and re.search(part.folds, o.name)]
    if folded:
        parameters += _folded(plan, folded, part, read, llama_name)
        outputs = [o for o in outputs if o not in folded]
    stacks, stack_shapes = _expert_stacks(outputs, part, where), {}
    for output in sorted(outputs, key=lambda o: o.name):  # (the converter's order, from a one-file folder: sorted)
        source = part.converter_name(output.name) if part.converter_name else output.name
        if output.name in stacks:  # (an expert's: a row of its block's stack, written after the block's last expert)
            stack, index, count, position = stacks[output.name]
            name = llama_name(stack, output.name)
            stack_shapes[name] = (count, *output.shape)
            member, kind = stored_as(stack, name, output.shape)
            plan.encoded[output.name] = GGUFTensor((replace(member, name=f"{name}[{index}]"),), kind, output.dtype)
            plan.positions[name] = position
            parameters += math.prod(output.shape)
            continue
        how = part.rearranged(source, output.shape, vision or audio) if part.rearranged else None
        # (the file's parameters, as gguf-py counts them for the size label: those it stores)
        parameters += sum(map(math.prod, how.tensors.values())) if how else math.prod(output.shape)
        if how is not None:  # (the file's tensors it becomes, in the converter's order)
            made = [stored_as(name, llama_name(name, output.name), shape) for name, shape in how.tensors.items()]
            stored, kinds = tuple(m[0] for m in made), tuple(m[1] for m in made)
            plan.encoded[output.name] = Rearranged(stored, kinds, output.dtype, how.pieces, how.rows_per_band)
            plan.positions.update((s.name, (output.name, i)) for i, s in enumerate(stored))
            continue
        # (a scalar as a vector of one, as the converter unsqueezes it: Gemma 4's clipped linears' bounds)
        stored, kind = stored_as(source, llama_name(source, output.name), output.shape or (1,))
        shift = 1.0 if "soft_emb_norm.weight" in source else 0.0  # (Gemma's RMS norm: 1 + weight)
        permuted = head_dim if part.permute_qk and QK.search(source) else 0
        plan.encoded[output.name] = GGUFTensor((stored,), kind, output.dtype, permuted, max(1, permuted), shift)
        plan.positions[stored.name] = (output.name,)
    if part.computed:  # (first in the file, as the converter writes the tensors it makes before those it reads)
        import numpy as np

        computed = {name: np.asarray(values, np.float32) for name, values in part.computed(vision, audio).items()}
        plan.computed.update(computed)
        plan.positions.update((name, ("", i)) for i, name in enumerate(computed))
        parameters += sum(values.size for values in computed.values())
    _metadata(plan.writer, hparams, (vision, audio), folder, _with_experts(parameters, stack_shapes), part, mm_type)
    return plan


# an expert's tensor in a tower (dots3-note's vision blocks'): the block's experts, the expert, the rest of its name
TOWER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(.*)$")


def _expert_stacks(
    outputs: list[OutputTensor], part: MmprojPart, where: Path
) -> dict[str, tuple[str, int, int, tuple]]:
    """The towers' experts, which the converter stacks per block and kind of tensor once it has read the block's
    last expert, in the order of their names: {output: (the stack's name as the converter maps it, the expert, the
    stack's experts, its place in the file)}. A block missing an expert's tensor is one line."""
    members: dict[str, dict[int, str]] = {}
    for output in outputs:
        source = part.converter_name(output.name) if part.converter_name else output.name
        if match := TOWER_EXPERT.match(source):
            members.setdefault(f"{match[1]}.{match[3]}", {})[int(match[2])] = output.name
    last: dict[str, str] = {}  # (each block's last expert tensor, as the converter reads them: by name)
    for stack, experts in members.items():
        block = stack.rsplit(".experts.", 1)[0]
        last[block] = max(last.get(block, ""), *experts.values())
        if sorted(experts) != list(range(len(experts))):
            raise ConfigMismatchError(f"{where}: {stack} lacks some experts' tensors; the checkpoint is incomplete")
    stacks = {}
    for rank, stack in enumerate(sorted(members)):
        block = stack.rsplit(".experts.", 1)[0]
        for index, output in members[stack].items():
            stacks[output] = (stack, index, len(members[stack]), (last[block], rank))
    return stacks


def _with_experts(parameters: int, stack_shapes: dict[str, tuple[int, ...]]) -> tuple[int, int, int, int]:
    """The file's parameters as gguf-py counts them for the size label: all, those outside the experts' stacks (the
    towers' with experts: dots3-note's), one expert's, and the experts."""
    _, _, expert, count = parameter_counts(stack_shapes)
    return parameters, parameters - sum(math.prod(shape) for shape in stack_shapes.values()), expert, count


def _folded(plan: GGUFPlan, folded: list[OutputTensor], part: MmprojPart, read, llama_name) -> int:
    """The tensors the converter folds from several (MmprojPart.fold), computed now from the few values each input
    holds, in F32 as it stores vectors, each where it writes it: after the last input it reads, in its order (by name).
    The inputs are left out of the file. Returns the file's parameters they make."""
    import numpy as np

    made = part.fold({o.name: read(o.name) for o in folded})
    for i, (source, (values, after)) in enumerate(made.items()):
        name = llama_name(part.converter_name(source) if part.converter_name else source, after)
        plan.computed[name] = np.asarray(values.float(), np.float32)
        plan.positions[name] = (after, i)
    plan.left_out.update(o.name for o in folded)
    return sum(values.numel() for values, _ in made.values())


def tower_sizes(part: MmprojPart, hparams: dict, where: Path) -> tuple[dict | None, dict | None]:
    """The vision and the audio tower's sizes, as the converter's MmprojModel reads them (None: no such tower); one
    line where the config lacks one the file carries."""
    vision = part.sizes(dict(hparams.get("vision_config") or {}), where) if part.sizes else None
    audio = part.audio_sizes(hparams, where) if part.audio_sizes else None
    for kind, sizes, keys in (("vision", vision, VISION_SIZES), ("audio", audio, AUDIO_SIZES)):
        missing = [key for key in keys if sizes is not None and sizes.get(key) is None]
        if missing:
            raise ConfigMismatchError(
                f"{where}: {kind}_config lacks {', '.join(missing)}, which the mmproj file carries; pass --config-from "
                "the model's own folder"
            )
    return vision, audio


def carry_text_rows(plan: GGUFPlan, outputs: list[OutputTensor], rows: dict[str, tuple[str, int]], where: Path) -> None:
    """Rows of the text model's tensors that the mmproj file holds too (MmprojPart.text_rows), each a vector in F32 as
    the converter stores one: the text tensor's output encoded WithRows in both files' plans, read once. Each row goes
    first in the mmproj file, where the converter's order (by name) puts the text model's tensors."""
    gguf = gguf_py()
    for name, (text_tensor, row) in rows.items():
        output = next((o for o in outputs if text_tensor in {s.name for s in plan.encoded[o.name].stored}), None)
        if output is None or not 0 <= row < output.shape[0]:
            raise ConfigMismatchError(
                f"{where}: the mmproj file holds row {row} of the text model's {text_tensor}, which "
                f"{'has ' + str(output.shape[0]) + ' rows' if output else 'the checkpoint lacks'}; pass --config-from "
                "the model's own folder"
            )
        f32 = gguf.GGMLQuantizationType.F32
        shape = tuple(gguf.quant_shape_to_byte_shape(output.shape[1:], f32))
        carried = OutputTensor(name, shape, dtypes.BY_NAME["uint8"])
        encoding = plan.encoded[output.name]
        if isinstance(encoding, WithRows):
            encoding = replace(encoding, rows=(*encoding.rows, (carried, row)))
        else:
            encoding = WithRows(encoding, ((carried, row),), f32)
        plan.encoded[output.name] = plan.mmproj.encoded[output.name] = encoding
        plan.elsewhere.add(name)
        plan.mmproj.elsewhere.add(text_tensor)
        plan.mmproj.positions[name] = ("", name)


def _tensor_type(gguf, part: MmprojPart, source: str, name: str, shape: tuple[int, ...], qtype, mm_type: str):
    """The converter's choice for an mmproj tensor: what the family forces (patch embeddings, Gemma 3's projection);
    vectors and norms in F32; others in the file's type, or F16 where rows do not fill its blocks."""
    forced = part.forced_type(gguf, source, name, shape, qtype, mm_type) if part.forced_type else None
    if forced is not None:
        return forced
    if len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return gguf.GGMLQuantizationType.F32
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    return gguf.GGMLQuantizationType.F16 if shape[-1] % block else qtype


def _metadata(
    writer,
    hparams: dict,
    towers: tuple[dict | None, dict | None],
    folder: Path,
    parameters: tuple[int, int, int, int],
    part: MmprojPart,
    mm_type: str,
) -> None:
    """The converter's key-values for an mmproj, in its order: general ones, the file type, the vision tower's sizes
    and the image processor's normalisation, the audio tower's sizes where there is one, then the projectors'."""
    gguf = gguf_py()
    vision, audio = towers
    writer.add_type(gguf.GGUFType.MMPROJ)
    general_metadata(writer, folder, parameters)
    writer.add_file_type(
        gguf.LlamaFileType.ALL_F32 if mm_type == "f32" else getattr(gguf.LlamaFileType, "MOSTLY_" + mm_type.upper())
    )
    processor = processor_config(folder)
    text_width = {**hparams, **(hparams.get("text_config") or {})}["hidden_size"]
    if vision:
        normalisation = part.image_normalisation or (processor.get("image_mean"), processor.get("image_std"))
        if None in normalisation:
            raise ConfigMismatchError(
                f"{folder}: no image processor's image_mean and image_std (preprocessor_config.json "
                "or processor_config.json), which the mmproj file carries; pass --config-from the "
                "model's own folder"
            )
        writer.add_clip_has_vision_encoder(True)
        writer.add_vision_projection_dim(text_width)
        writer.add_vision_image_size(vision["image_size"])
        writer.add_vision_patch_size(vision["patch_size"])
        writer.add_vision_embedding_length(vision["hidden_size"])
        writer.add_vision_feed_forward_length(vision["intermediate_size"])
        writer.add_vision_block_count(vision["num_hidden_layers"])
        writer.add_vision_head_count(vision["num_attention_heads"])
        writer.add_vision_image_mean(normalisation[0])
        writer.add_vision_image_std(normalisation[1])
    if audio:
        writer.add_clip_has_audio_encoder(True)
        writer.add_audio_projection_dim(text_width)
        writer.add_audio_embedding_length(audio["hidden_size"])
        writer.add_audio_feed_forward_length(audio["intermediate_size"])
        writer.add_audio_block_count(audio["num_hidden_layers"])
        writer.add_audio_head_count(audio["num_attention_heads"])
    projector = getattr(gguf.VisionProjectorType, part.projector)
    if part.projector_type_key == "clip.vision":
        writer.add_clip_vision_projector_type(projector)
    elif part.projector_type_key == "clip":
        writer.add_clip_projector_type(projector)
    part.projector_keys(writer, hparams, vision, processor)
    if part.projector_type_key == "clip.audio":
        writer.add_clip_audio_projector_type(projector)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

"""Planning a GGUF file: each tensor's llama.cpp name, type and place, the tensors the converter computes from the
config, and the header's metadata, from the family's GGUFPart (families/<family>.py) and gguf-py's tables."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import dtypes, families
from ...errors import ConfigMismatchError
from ...families.gguf_hooks import (
    ROPE_BY_FACTORS,
    first_of,
    gguf_py,
    rope_parameters,
    tensor_name_map,
    text_hyperparameters,
)
from ...families.parts import GGUFPart, Rearrangement
from ...types import OutputTensor
from . import kquants, vision
from .header import general_metadata, parameter_counts, zero_embedding_tokens
from .internlm2_vocabulary import write_internlm2_vocabulary
from .model import gguf_model
from .rwkv_world import write_rwkv_world_vocabulary
from .tensors import (
    EXPERT,
    HEAD_NORM,
    LAYER,
    LEGACY,
    QUANTIZED,
    GGUFPlan,
    GGUFTensor,
    Rearranged,
    in_file_type,
    stacked,
)
from .unigram import UNIGRAM_KINDS, write_unigram_vocabulary
from .vocabulary import write_vocabulary


def plan_gguf(
    requested: str,
    outputs: list[OutputTensor],
    config_folder: Path | None,
    dtype_name: str,
    config_changes: dict[str, Any] | None = None,
    read: Callable[..., Any] | None = None,
    target_from: str | None = None,
) -> GGUFPlan:
    """Names, types and metadata of the GGUF file for these output tensors, or a one-line error for a model
    llama.cpp (or this version of unshard) does not take, before anything is written. read: an output's values (or a
    slice of its rows), for the few a family's header carries (GGUFPart.header_tensors, suppresses_zero_embeddings)
    or that the converter writes as it makes them (GGUFPart.written_last). target_from: a drafter's target's folder."""
    gguf = gguf_py()
    model = gguf_model(requested, config_folder, dtype_name, config_changes, target_from)
    hparams, where, family, part, arch = model.hparams, model.where, model.family, model.part, model.arch
    file_type, unknown_projector = model.file_type, model.unknown_projector
    vision_outputs = []
    if families.supports(family, "mmproj") and not unknown_projector:  # the text model here, the towers in the mmproj
        vision_outputs = [o for o in outputs if vision.is_vision(o.name, family.mmproj)]
        outputs = [o for o in outputs if not vision.is_vision(o.name, family.mmproj)]
    ftype = (
        gguf.LlamaFileType.ALL_F32 if file_type == "f32" else getattr(gguf.LlamaFileType, "MOSTLY_" + file_type.upper())
    )
    plan = GGUFPlan(file_type, gguf.MODEL_ARCH_NAMES[arch], gguf.GGUFWriter(None, gguf.MODEL_ARCH_NAMES[arch]))
    plan.routers_in_file_type = part.routers_in_file_type and file_type not in QUANTIZED
    plan.kept_in_f32 = part.kept_in_f32 if file_type not in QUANTIZED else part.left_by_llama_quantize
    plan.q8_0_or_more = part.q8_0_or_more
    experts = first_of(hparams, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts") or 0
    plan.notes.extend(model.notes)
    heads = hparams.get("num_attention_heads")  # (none: a state-space model's, Mamba's)
    head_dim = hparams.get("head_dim") or (heads and hparams["hidden_size"] // heads) or 0
    blocks = hparams["num_hidden_layers"] + ((part.extra_blocks and hparams.get(part.extra_blocks)) or 0)
    why = part.towers_left_out or getattr(family.mmproj, "reason", "")
    towers = part.towers
    if unknown_projector:  # (and the towers' tensors the mmproj file leaves out too: Granite 4 Vision's SigLIP head)
        towers = "|".join(f"(?:{pattern})" for pattern in (family.mmproj.vision, part.towers) if pattern)
        why = (
            f"the installed gguf-py lacks llama.cpp's {family.mmproj.projector} projector; to write them too, install "
            "llama.cpp's own: pip install <llama.cpp>/gguf-py"
        )
    if getattr(family.mmproj, "applies", True):  # (a model with towers: none of their tensors in an mmproj file)
        why = f"no mmproj file of them ({why})"
    outputs = _without_layers_past(plan, _without_towers(plan, outputs, towers, why), blocks)
    if part.header_tensors:
        outputs = _into_header(plan, outputs, part, hparams, read, where)
    last = {o.name: read(o.name) for o in outputs if part.written_last and re.search(part.written_last, o.name)}
    outputs = [o for o in outputs if o.name not in last]
    for pattern, why in part.skipped:
        outputs = _leaving_out(plan, outputs, {o.name for o in outputs if re.search(pattern, o.name)}, why)
    if part.suppresses_zero_embeddings:
        hparams = {**hparams, "zero_embedding_tokens": zero_embedding_tokens(outputs, config_folder, read)}
    beside = part.beside_model(plan.writer, hparams, config_folder) if part.beside_model else {}
    if beside:
        plan.notes.append(
            f"{', '.join(beside)}: the sentence-transformers projections after the model, from {config_folder}, "
            "which llama.cpp applies to its embeddings as sentence-transformers does"
        )
    parameters = _plan_tensors(plan, outputs, hparams, part, arch, head_dim, experts, blocks, where, beside)
    _computed_tensors(plan, hparams, part, head_dim, where)
    if last:
        _written_last(plan, part.last_from_tensors(last, hparams, where), last)
    vocabulary = (model.vocabulary_folder, model.vocabulary_part or part)
    plan.vocabulary = _metadata(plan.writer, hparams, config_folder, vocabulary, ftype, parameters, blocks, part)
    if file_type in QUANTIZED:  # llama-quantize sets these two over what it copies, which puts them last
        fields = plan.writer.kv_data[0]
        if gguf.Keys.General.FILE_TYPE not in fields:  # (a header the converter writes without one: GPT-NeoX's)
            plan.writer.add_file_type(ftype)
        for key in (gguf.Keys.General.QUANTIZATION_VERSION, gguf.Keys.General.FILE_TYPE):
            fields[key] = fields.pop(key)
    if vision_outputs:
        plan.mmproj = vision.plan_mmproj(file_type, vision_outputs, model.config, config_folder, family.mmproj, read)
        plan.left_out |= plan.mmproj.left_out  # (the inputs it folds into others)
        plan.notes.extend(plan.mmproj.notes)
        if family.mmproj.text_rows:
            vision.carry_text_rows(plan, outputs, family.mmproj.text_rows(model.config, config_folder), where)
    return plan


def _plan_tensors(
    plan: GGUFPlan,
    outputs: list[OutputTensor],
    hparams: dict,
    part: GGUFPart,
    arch,
    head_dim: int,
    experts: int,
    blocks: int,
    where: Path,
    beside: dict[str, Any],
) -> tuple[int, int, int, int]:
    """Each output's name, type and place in the file (plan.encoded, plan.positions), and the tensors from beside the
    model's (GGUFPart.beside_model: llama.cpp's name -> float32 values) in their types (plan.computed); the parameters
    as gguf-py counts them for the size label: (all, those outside the experts, one expert's, experts)."""
    gguf = gguf_py()
    file_type = plan.file_type
    qtype = getattr(gguf.GGMLQuantizationType, kquants.MIXES.get(file_type, file_type).upper())
    names = tensor_name_map(arch, blocks)
    heads = hparams.get("num_attention_heads") or 0  # (none: Mamba-2's, which llama.cpp counts as 0)
    kv_heads = hparams.get("num_key_value_heads") or heads
    ordered = sorted(outputs, key=lambda o: o.name)  # (the converter's order, from a one-file folder: sorted)
    llama_names, stacks, row_of, rearranged = _file_names(plan, ordered, hparams, part, names, experts, where)
    placed_after = _placed_after(ordered, llama_names, stacks, part)
    # llama-quantize's output layer: output.weight, or the embedding where the model ties the two
    output_layer = "output.weight" if "output.weight" in llama_names else "token_embd.weight"
    mixed = {}
    if file_type in kquants.MIXES:
        shapes = [
            rearranged[o.name][1] if o.name in rearranged else {name: o.shape} for o, name in zip(ordered, llama_names)
        ]
        shapes.append({name: values.shape for name, values in beside.items()})
        first_kv_heads = part.first_kv_heads(hparams) if part.first_kv_heads else kv_heads
        model = kquants.Model(plan.architecture, blocks, heads, first_kv_heads, experts, plan.q8_0_or_more)
        mixed = _mixed_types(plan, shapes, model)
    file_shapes = {}  # (every tensor of the file, by llama.cpp's name: gguf-py counts the parameters from them)
    for output, name in zip(ordered, llama_names):
        if output.name in rearranged:
            how, made = rearranged[output.name]
            plan.encoded[output.name] = _rearranged(plan, output, how, made, qtype, experts, mixed)
            file_shapes.update(made)
            continue
        stack, index = stacks.get(name), row_of.get(output.name)
        rows = part.padded_rows(output.name, output.shape, hparams) if part.padded_rows else None
        padding = (output.shape[0], rows - output.shape[0]) if rows and rows > output.shape[0] else ()
        own_shape = (rows, *output.shape[1:]) if padding else output.shape
        shape = (len(stack), *own_shape) if stack else own_shape
        if name in plan.joined_rows:
            shape = (len(stack) * own_shape[0], *own_shape[1:])
        file_shapes[name] = shape
        tensor_type, note = gguf_type(plan, name, shape, qtype, name == output_layer, experts, mixed.get(name))
        if note and index in (None, 0):  # (a stack's note once)
            plan.notes.append(f"{output.name if stack is None else name}: {note}")
        permuted = 0  # (llama.cpp's llama alone wants q and k reordered; Qwen's rotate as transformers does)
        if part.permute_qk and output.name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            permuted = head_dim
            if output.shape[0] != head_dim * (heads if ".q_proj." in output.name else kv_heads):
                raise ConfigMismatchError(
                    f"{where}: {output.name} has {output.shape[0]} rows, not a whole number of heads of {head_dim}"
                )
        byte_shape = tuple(gguf.quant_shape_to_byte_shape(own_shape, tensor_type))
        if file_type in QUANTIZED and not stack:
            byte_shape = _as_llama_quantize_stores(byte_shape)
        stored = OutputTensor(name if stack is None else f"{name}[{index}]", byte_shape, dtypes.BY_NAME["uint8"])
        shifted = output.name.endswith("norm.weight") and not output.name.endswith(part.unshifted_norms)
        shift = part.norm_shift if shifted else 0.0
        scales = part.scaled(output.name, output.shape, hparams) if part.scaled else ()
        centred = output.name.endswith(part.centred)
        rows_per_band = output.shape[0] if centred else max(1, permuted)
        plan.encoded[output.name] = GGUFTensor(
            (stored,), tensor_type, output.dtype, permuted, rows_per_band, shift, scales, padding, centred
        )
        plan.positions[name] = _in_blocks(name) if file_type in QUANTIZED else placed_after[name]
    for name, values in beside.items():  # (the converter's first tensors: plan.computed's, placed with them)
        tensor_type, _ = gguf_type(plan, name, values.shape, qtype, False, experts, mixed.get(name))
        plan.computed[name] = in_file_type(values, tensor_type)
        plan.computed_types[name] = tensor_type
        file_shapes[name] = values.shape
    return parameter_counts(file_shapes)


def _placed_after(
    ordered: list[OutputTensor], llama_names: list[str], stacks: dict[str, dict], part: GGUFPart
) -> dict[str, tuple]:
    """Where the converter writes each tensor of a file it does not quantize: after the tensor it read it with. A
    block's experts are stacked once it has read the last of them (in its order), the stacks written in the order of
    their Hugging Face names (w1, w2, w3; down, gate, up); a norm's heads, and the family's stacks, once it has read
    the last of them; any other tensor as it reads it."""
    last_expert, last_head = {}, {}
    for output, name in zip(ordered, llama_names):
        if name in stacks and EXPERT.match(output.name):
            last_expert[name.split(".")[1]] = output.name
        elif name in stacks:
            last_head[name] = output.name
    placed = {}
    for output, name in zip(ordered, llama_names):
        if name in last_head:
            placed[name] = (last_head[name],)
        elif name in stacks:
            kind = EXPERT.match(output.name)[3]
            order = part.expert_stack_order
            placed[name] = (last_expert[name.split(".")[1]], order.index(kind) if order else kind)
        else:
            placed[name] = (output.name,)
    return placed


def _mixed_types(plan: GGUFPlan, shapes: list[dict[str, tuple]], model) -> dict[str, tuple[str, str | None]]:
    """llama-quantize's type of each tensor it quantizes in a K-quant mix (shapes: the file's tensors, by llama.cpp's
    name, in the converter's order; its choices follow its order of them, block by block)."""
    quantized = {
        name: shape[-1]
        for each in shapes
        for name, shape in each.items()
        if _quantized(name, shape, plan.file_type) and not any(part in name for part in plan.kept_in_f32)
    }
    return kquants.choose_types(plan.file_type, model, sorted(quantized.items(), key=lambda t: _in_blocks(t[0])))


def _file_names(
    plan: GGUFPlan, ordered: list[OutputTensor], hparams: dict, part: GGUFPart, names, experts: int, where: Path
) -> tuple[list[str], dict[str, dict[int, OutputTensor]], dict[str, int], dict[str, tuple[Rearrangement, dict]]]:
    """Each output's place in the file, in the converter's order: llama.cpp's name of the tensor it is (or the first
    it becomes, where the converter rearranges it), the stacks of several outputs (experts, a norm's heads, the
    family's stacks: GGUFPart.stacked) by name with each member's index, and the rearranged outputs with the tensors
    they become."""
    heads = hparams.get("num_attention_heads") or 0
    kv_heads = hparams.get("num_key_value_heads") or heads
    counts = {"attn_q_norm": (heads, "heads' norms"), "attn_k_norm": (kv_heads, "heads' norms")}
    llama_names, stacks, row_of, rearranged = [], {}, {}, {}
    for output in ordered:
        how = part.rearranged(output.name, output.shape, hparams, where) if part.rearranged else None
        if how is not None:  # (the file's tensors it becomes, by llama.cpp's names, in the converter's order)
            made = {_llama_name(names, n, plan, where, output.name, part): shape for n, shape in how.tensors.items()}
            rearranged[output.name] = (how, made)
            llama_names.append(next(iter(made)))
            continue
        own = re.match(part.stacked, output.name) if part.stacked else None
        member = EXPERT.match(output.name) or HEAD_NORM.match(output.name) or own
        name = _llama_name(names, f"{member[1]}.{member[3]}" if member else output.name, plan, where, output.name, part)
        if member:
            index = part.stack_order.index(member[2]) if own and part.stack_order else int(member[2])
            stacks.setdefault(name, {})[index] = output
            row_of[output.name] = index
        if own:  # (as many as there are, numbered from 0)
            counts[name.split(".")[-2]] = (max(stacks[name]) + 1, "tensors")
            if part.joined_rows:
                plan.joined_rows.add(name)
        llama_names.append(name)
    _check_stacks(stacks, counts, experts, where)
    return llama_names, stacks, row_of, rearranged


def _without_towers(plan: GGUFPlan, outputs: list[OutputTensor], pattern: str | None, why: str) -> list[OutputTensor]:
    """The outputs but a vision-language model's towers (matching GGUFPart.towers: EXAONE 4.5's) where unshard writes
    no mmproj file of them (why), which the converter's text model leaves out too."""
    towers = {o.name for o in outputs if pattern and re.match(pattern, o.name)}
    note = "tensors beside the text model left out, as llama.cpp's converter leaves them out of the text model's file"
    return _leaving_out(plan, outputs, towers, f"{note}; {why}")


def _leaving_out(plan: GGUFPlan, outputs: list[OutputTensor], left: set[str], note: str) -> list[OutputTensor]:
    """The outputs but those named in `left`, which go in plan.left_out, with a note of how many and why."""
    if left:
        plan.left_out.update(left)
        plan.notes.append(f"{len(left)} {note}")
    return [o for o in outputs if o.name not in left]


def _into_header(
    plan: GGUFPlan, outputs: list[OutputTensor], part: GGUFPart, hparams: dict, read: Callable, where: Path
) -> list[OutputTensor]:
    """The outputs but those whose values the converter writes into the header (part.header_tensors), read now (a
    few values each, integers as they are) and written there by the family's hook, first, as the converter adds them
    while reading its tensors, or by its hyperparameters hook, which finds them in hparams["header_tensors"]; they are
    left out of the file (plan.left_out), as there."""
    valued = [o for o in outputs if re.search(part.header_tensors, o.name)]
    values = {o.name: read(o.name).reshape(-1).tolist() for o in valued}
    if part.header_from_tensors:
        part.header_from_tensors(plan.writer, values, hparams, where)
    else:
        hparams["header_tensors"] = values
    plan.left_out.update(values)
    return [o for o in outputs if o.name not in values]


def _written_last(plan: GGUFPlan, made: dict[str, Any], read: dict[str, Any]) -> None:
    """The tensors the converter makes of those it reads whole (GGUFPart.written_last) and writes after every other,
    in their own types (an EAGLE-3 drafter's int64 map), in plan.computed; those it makes nothing of left out."""
    gguf = gguf_py()
    kinds = {"int64": "I64", "int32": "I32", "float32": "F32"}
    for name, values in made.items():
        plan.computed[name] = values
        plan.computed_types[name] = getattr(gguf.GGMLQuantizationType, kinds[str(values.dtype)])
        plan.positions[name] = _in_blocks(name) if plan.file_type in QUANTIZED else ("\U0010ffff", name)
    if unused := sorted(set(read) - set(made)):
        plan.notes.append(
            f"{', '.join(unused)}: left out, as llama.cpp's converter leaves it out (llama.cpp reads none)"
        )
    plan.left_out.update(read)  # (read now: the file's own tensors written from plan.computed)


def _without_layers_past(plan: GGUFPlan, outputs: list[OutputTensor], blocks: int) -> list[OutputTensor]:
    """The outputs but those of layers past the file's blocks, which the converter leaves out too (the multi-token
    prediction layers of DeepSeek-V3's folder on the Hub)."""
    past = {o.name for o in outputs if (layer := LAYER.match(o.name)) and int(layer[1]) >= blocks}
    note = f"tensors of layers past the {blocks} llama.cpp's {plan.architecture} runs (the multi-token prediction "
    return _leaving_out(plan, outputs, past, note + "layers) left out, as llama.cpp's converter leaves them")


def _llama_name(names, source: str, plan: GGUFPlan, where: Path, output: str, part: GGUFPart | None = None) -> str:
    """llama.cpp's name of a Hugging Face tensor, as the converter maps it (after its renames: a vision-language
    model's text part, a sigmoid router's expert bias as a bias, the family's); one line where it has none."""
    source = source.replace("language_model.", "").replace("e_score_correction_bias", "e_score_correction.bias")
    if part and part.dropped_prefix:
        source = source.removeprefix(part.dropped_prefix)
    for pattern, renamed in part.renames if part else ():
        source = re.sub(pattern, renamed, source)
    name = names.get_name(source, try_suffixes=(".weight", ".bias", ".scale"))
    if name is None and _is_model_tensor_name(source, plan.architecture):  # (llama.cpp's own name, which gguf-py's
        # map gives no Hugging Face name: HRM-Text's hrm.z_l_init, written under it by a rearrangement; RWKV-7's
        # token-shift mixes, which the converter stacks under it)
        name = source
    if name is None:
        raise ConfigMismatchError(
            f"{where}: the tensor {output} has no name in llama.cpp's {plan.architecture} model; llama.cpp cannot "
            "load it"
        )
    return name


def _is_model_tensor_name(name: str, architecture: str) -> bool:
    """Whether a name is llama.cpp's own name of one of an architecture's tensors, as gguf-py lists them (a block's
    with its number; with or without its suffix)."""
    gguf = gguf_py()
    arch = next(a for a, named in gguf.MODEL_ARCH_NAMES.items() if named == architecture)
    base = re.sub(r"\.(weight|bias)$", "", name)
    return any(
        re.fullmatch(re.escape(gguf.TENSOR_NAMES[t]).replace(re.escape("{bid}"), r"\d+"), base)
        for t in gguf.MODEL_TENSORS[arch]
    )


def _rearranged(
    plan: GGUFPlan,
    output: OutputTensor,
    how: Rearrangement,
    made: dict[str, tuple[int, ...]],
    qtype,
    experts: int,
    mixed: dict,
) -> Rearranged:
    """The encoding of an output the converter stores rearranged, as the file's tensors `made` (llama.cpp's name ->
    shape), each of its own type (DeepSeek's k_b has rows of a head's key width, which may not fill the type's blocks
    where v_b's do), in the converter's place (one after the other) or llama-quantize's."""
    gguf = gguf_py()
    stored, qtypes = [], []
    for order, (name, shape) in enumerate(made.items()):  # (the converter's order of the pieces)
        tensor_type, note = gguf_type(plan, name, shape, qtype, False, experts, mixed.get(name))
        if note:
            plan.notes.append(f"{name}: {note}")
        byte_shape = tuple(gguf.quant_shape_to_byte_shape(shape, tensor_type))
        if plan.file_type in QUANTIZED:
            byte_shape = _as_llama_quantize_stores(byte_shape)
        stored.append(OutputTensor(name, byte_shape, dtypes.BY_NAME["uint8"]))
        qtypes.append(tensor_type)
        plan.positions[name] = _in_blocks(name) if plan.file_type in QUANTIZED else (output.name, f"{order:04d}")
    return Rearranged(tuple(stored), tuple(qtypes), output.dtype, how.pieces, how.rows_per_band)


def _as_llama_quantize_stores(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A tensor's shape as llama-quantize writes it: without ggml's trailing dimensions of 1 (our leading ones)."""
    return shape[next((i for i, d in enumerate(shape) if d != 1), len(shape) - 1) :]


def _in_blocks(name: str) -> tuple[int, str]:
    """llama-quantize's order of a file's tensors (its loader's): those outside the blocks, then block by block,
    by name."""
    return (int(name.split(".")[1]) if name.startswith("blk.") else -1, name)


# Parts of names llama.cpp keeps in f32 whatever the type (MoE routers, a recurrent layer's convolution kernel, LFM2's
# short convolution's, Gemma 3n's AltUp coefficients, learned positions and BERT's segment types); those the converter
# alone keeps so (the sparse attention's indexer's head weights, which llama-quantize quantizes as any matrix); and
# those llama-quantize alone leaves as the converter's f32 file has them (the projection into the per-layer
# embeddings, "not too big"; Gemma 3n's AltUp and LAuReL tensors, "very small"; MiniMax-M3's indexer's projections,
# "tiny")
KEPT_IN_F32 = (
    "ffn_gate_inp",
    "ssm_conv1d",
    "shortconv.conv",
    "altup_correct_coef",
    "altup_predict_coef",
    "position_embd.weight",
    "token_types.weight",
    # (RWKV's small matrices: its token-shift mixes, the decay's low-rank projections)
    *(f"time_mix_{kind}.weight" for kind in ("first", "w1", "w2", "decay_w1", "decay_w2", "lerp_fused")),
)
KEPT_BY_THE_CONVERTER = ("indexer.proj",)
NOT_REQUANTIZED = (
    "per_layer_model_proj",
    "altup",
    "laurel",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    # (RWKV-7's other low-rank projections, which the converter writes in the file's type)
    *(f"time_mix_{kind}.weight" for kind in ("w0", "v0", "v1", "v2", "a0", "a1", "a2", "g1", "g2")),
)


def _quantized(name: str, shape: tuple[int, ...], file_type: str) -> bool:
    """Whether llama.cpp quantizes a tensor of this name and shape into a file of this type: not vectors, norms or
    KEPT_IN_F32 (nor KEPT_BY_THE_CONVERTER into the converter's types, nor NOT_REQUANTIZED into llama-quantize's)."""
    # (llama-quantize counts a tensor's dimensions as ggml does, without its trailing ones: DSpark's confidence head,
    # one row, is a vector there; the converter counts them all)
    dims = len(_as_llama_quantize_stores(shape)) if file_type in QUANTIZED else len(shape)
    vector_or_norm = dims <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
    kept = (*KEPT_IN_F32, *(NOT_REQUANTIZED if file_type in QUANTIZED else KEPT_BY_THE_CONVERTER))
    return not vector_or_norm and not any(part in name for part in kept)


def gguf_type(
    plan: GGUFPlan,
    name: str,
    shape: tuple[int, ...],
    qtype,
    output_layer: bool,
    experts: int,
    mixed: tuple[str, str | None] | None,
):
    """The GGUF type of a tensor of this llama.cpp name and shape, as the converter or llama-quantize chooses it
    (`mixed`: a K-quant mix's choice, kquants.py), and a note where it is not the file's type for a reason inspect
    should tell (or None)."""
    gguf = gguf_py()
    legacy, tensor_type, note = plan.file_type in LEGACY, qtype, None
    forced = plan.routers_in_file_type and "ffn_gate_inp" in name and len(shape) > 1
    if not _quantized(name, shape, plan.file_type) and not forced:  # (what llama.cpp keeps in f32: the routers too)
        return gguf.GGMLQuantizationType.F32, None
    if any(part in name for part in plan.kept_in_f32):
        return gguf.GGMLQuantizationType.F32, None
    if mixed:
        return getattr(gguf.GGMLQuantizationType, mixed[0]), mixed[1]
    if legacy and any(part in name for part in plan.q8_0_or_more):
        tensor_type = gguf.GGMLQuantizationType.Q8_0  # (llama-quantize's least for them in this architecture)
    elif legacy and output_layer:
        tensor_type = gguf.GGMLQuantizationType.Q8_0
        note = (
            "in Q8_0, as `llama-quantize --output-tensor-type q8_0` writes it (llama-quantize's own q6_K is a "
            "K-quant gguf-py cannot compute)"
        )
    elif legacy and experts == 8 and name.endswith(("attn_k.weight", "attn_v.weight")):
        tensor_type = gguf.GGMLQuantizationType.Q8_0  # (llama-quantize's choice for a model of 8 experts)
    block, _ = gguf.GGML_QUANT_SIZES[tensor_type]
    if shape[-1] % block:  # (the converter and llama-quantize fall back to f16 where rows do not fill blocks)
        return gguf.GGMLQuantizationType.F16, (
            f"rows of {shape[-1]} do not fill {tensor_type.name}'s blocks of "
            f"{block}: written in F16, as llama.cpp's converter and llama-quantize do"
        )
    return tensor_type, note


def _computed_tensors(plan: GGUFPlan, hparams: dict, part: GGUFPart, head_dim: int, where: Path) -> None:
    """The tensors the converter computes from the config, first in its file (plan.computed): the family's (Llama 3's
    rope frequency factors, Phi-3's long and short ones); and those llama.cpp loads that the model lacks, as zeros
    (GGUFPart.unused)."""
    import numpy as np

    _, rope = rope_parameters(hparams)
    if part.computed:
        computed = part.computed(plan.writer, hparams, rope, head_dim, where)
        plan.computed.update({name: np.asarray(values, dtype=np.float32) for name, values in computed.items()})
    if part.unused:
        held = {stacked(s.name)[0] for encoding in plan.encoded.values() for s in encoding.stored}
        lacking = {name: shape for name, shape in part.unused(hparams).items() if name not in held}
        if lacking:
            plan.notes.append(
                f"{len(lacking)} tensors llama.cpp loads and does not compute with, which the model has none of, "
                f"written as zeros ({', '.join(list(lacking)[:3])}...): the converter's file without them does not load"
            )
        # (np.zeros' pages are the kernel's zero page until written: no memory held for them)
        plan.computed.update({name: np.zeros(shape, np.float32) for name, shape in lacking.items()})
    rope_type = str(rope.get("rope_type")).lower()
    if rope_type in ROPE_BY_FACTORS and "rope_freqs.weight" not in plan.computed:
        raise ConfigMismatchError(
            f"{where}: rope type {rope_type!r} on a {plan.architecture} model, which llama.cpp's "
            "converter does not write; write a folder and use llama.cpp's convert_hf_to_gguf.py"
        )
    for i, name in enumerate(plan.computed):  # (before every other tensor; llama-quantize's order is by name)
        plan.positions[name] = _in_blocks(name) if plan.file_type in QUANTIZED else ("", i)


def _check_stacks(
    stacks: dict[str, dict[int, OutputTensor]], counts: dict[str, tuple[int, str]], experts: int, where: Path
) -> None:
    """Every stack has the config's experts (or as many of the kind as `counts` says: a norm's heads), numbered from
    0, all of one shape: llama.cpp's tensor is whole."""
    for name, stack in stacks.items():
        shapes = {o.shape for o in stack.values()}
        count, what = counts.get(name.split(".")[-2], (experts, "experts"))
        if sorted(stack) != list(range(count)) or len(shapes) != 1:
            found = f"{what} {sorted(stack)}" if len(shapes) == 1 else f"{what} of shapes {sorted(shapes)}"
            raise ConfigMismatchError(
                f"{where}: {name} stacks {count} {what} of one shape in llama.cpp, and the "
                f"checkpoint has {found}; pass --config-from the model's own folder"
            )


def _metadata(
    writer,
    hparams: dict,
    folder: Path,
    vocabulary: tuple[Path, GGUFPart],
    ftype,
    parameters: tuple[int, int, int, int],
    blocks: int,
    part: GGUFPart,
) -> str:
    """The key-values the converter writes, in its order (general, hyper-parameters, tokenizer), with the family's
    hooks: its own hyper-parameters, a `llama`'s (the converter's LlamaModel) space prefix, what follows the
    vocabulary; the vocabulary from its folder as that part writes it (a drafter's target's, as the converter reads
    it: the target family's part where the converter writes it by the target's class)."""
    gguf = gguf_py()
    if part.opening_keys:
        part.opening_keys(writer, hparams)
    writer.add_type(gguf.GGUFType.MODEL)
    general_metadata(writer, folder, parameters)
    (part.hyperparameters or text_hyperparameters)(writer, hparams, ftype, blocks, folder)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocabulary_folder, words = vocabulary
    if words.before_vocabulary:
        words.before_vocabulary(writer, hparams, vocabulary_folder)
    if words.vocabulary in UNIGRAM_KINDS:
        written = write_unigram_vocabulary(writer, hparams, vocabulary_folder, words.vocabulary)
    elif words.vocabulary == "rwkv":
        written = write_rwkv_world_vocabulary(writer, hparams, vocabulary_folder)
    elif words.vocabulary == "internlm2":
        written = write_internlm2_vocabulary(writer, hparams, vocabulary_folder)
    else:
        written = write_vocabulary(
            writer,
            hparams,
            vocabulary_folder,
            words.llama_vocabulary,
            phi3=words.phi3_tokens,
            kind=words.vocabulary,
            special_tokens=words.special_tokens,
            gpt2_split_as=words.gpt2_split_as,
            control_tokens=words.control_tokens,
            unnamed_special_tokens=part.unnamed_special_tokens,
        )
    for hooks in (words, part) if words is not part else (part,):  # (the target's, then the drafter's own)
        if hooks.after_vocabulary:
            hooks.after_vocabulary(writer, hparams, vocabulary_folder)
    return written

"""GGUF: the one file llama.cpp reads (and Ollama, LM Studio, llama-cpp-python with it).

The file is what llama.cpp's own `convert_hf_to_gguf.py` writes from the Hugging Face folder unshard
would have written (same dtype), without that folder: the header (metadata, tensor infos, aligned
offsets) comes from the plan, then each tensor is converted a band of rows at a time and written to
its place. The format's constants, names, metadata writer and quantization kernels are gguf-py's
(llama.cpp's own Python library); what is written here is which of them the converter uses, and when.

So far: Llama and Mistral (`llama` in llama.cpp), Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3 (its vision tower and
projector in a second file, the mmproj: gguf_vision.py), Phi-3 and the MoE models Mixtral, Qwen2-MoE and
Qwen3-MoE (each layer's experts stacked in one tensor), whose
tokenizer is a SentencePiece model (tokenizer.model) or a byte-level BPE (tokenizer.json), in f32, f16, bf16
and q8_0 (the converter's own types), and q4_0, q4_1, q5_0 and q5_1 as llama-quantize makes them from the
converter's file (LEGACY).
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import dtypes
from ..errors import ConfigMismatchError, OutputExistsError, UnshardError, read_json
from ..names import known
from ..types import FormatRequest, Group, OutputTensor, Plan
from .hf_folder import OutputFolder
from .safetensors import SafetensorsFile, WrittenFile

if TYPE_CHECKING:
    import numpy as np

    from ..dtypes import DType

SUMMARY_KEY = "gguf"


# --gguf-type: llama.cpp's names of the file types the converter writes; "auto" is its default:
# bf16 or f16 as the model's (the folder's) 2-D tensors are, else f16.
# llama-quantize's legacy types, which gguf-py computes: every 2-D weight in the type, but the output layer (and
# the embedding it is tied to), which llama-quantize writes in q6_K, a K-quant gguf-py cannot compute: unshard
# writes it in q8_0, as `llama-quantize --output-tensor-type q8_0` does.
LEGACY = ("q4_0", "q4_1", "q5_0", "q5_1")
TYPES = ("f32", "f16", "bf16", "q8_0", *LEGACY)
FILE_NAME = "model.gguf"  # inside the staging folder; committed as OUT itself
MMPROJ_FILE_NAME = "mmproj.gguf"  # a vision-language model's vision part; committed beside OUT (mmproj_path)
# Hugging Face architectures -> llama.cpp's (gguf.MODEL_ARCH's members): those written so far.
ARCHITECTURES = {"LlamaForCausalLM": "LLAMA", "MistralForCausalLM": "LLAMA", "Qwen2ForCausalLM": "QWEN2",
                 "Qwen3ForCausalLM": "QWEN3", "GemmaForCausalLM": "GEMMA", "Gemma2ForCausalLM": "GEMMA2",
                 "Gemma3ForCausalLM": "GEMMA3", "Gemma3ForConditionalGeneration": "GEMMA3", "Phi3ForCausalLM": "PHI3",
                 "MixtralForCausalLM": "LLAMA", "Qwen2MoeForCausalLM": "QWEN2MOE", "Qwen3MoeForCausalLM": "QWEN3MOE"}


def _gguf():
    try:
        import gguf
    except ImportError:
        raise UnshardError("GGUF output needs the gguf package: pip install 'unshard[gguf]'") from None
    logging.getLogger("gguf").setLevel(logging.WARNING)  # (it says at INFO which endianness each file has)
    return gguf


@dataclass(frozen=True)
class GGUFTensor:
    """How one output tensor is stored in the file (an Encoding, see sinks/__init__.py): under llama.cpp's
    name, as the bytes of its GGUF type; q and k rows reordered within each head as llama.cpp's rotary
    embedding expects (the converter's `permute`), so a band holds whole heads; Gemma's norms shifted by one,
    as llama.cpp applies them as they are where transformers applies 1 + weight."""

    stored: tuple[OutputTensor, ...]
    qtype: Any  # gguf.GGMLQuantizationType
    dtype: DType  # the tensor's own, which bands hold
    head_dim: int = 0  # q/k rows to reorder per head; 0: none
    rows_per_band: int = 1
    shift: float = 0.0  # added to every value first
    surveys = False  # (each band is encoded as it comes)

    def encode(self, band: np.ndarray, start: int) -> dict[str, np.ndarray]:
        import numpy as np

        gguf = _gguf()
        if band.dtype not in (np.float16, np.float32):  # (as the converter: other floats via float32)
            band = _as_float32(band, self.dtype)
        if self.shift:
            band = band + self.shift  # (in the band's dtype, as torch adds it)
        if self.head_dim:
            half = self.head_dim // 2
            band = band.reshape(-1, 2, half, *band.shape[1:]).swapaxes(1, 2).reshape(band.shape)
        data = gguf.quants.quantize(np.ascontiguousarray(band), self.qtype)
        return {self.stored[0].name: data.reshape(-1).view(np.uint8)}


def _as_float32(band: np.ndarray, dtype: DType) -> np.ndarray:
    """A band of another float dtype (bfloat16 as its bits, float64) as float32, rounded as torch's cast rounds."""
    import numpy as np

    if dtype.name == "bfloat16":
        return dtypes.cast(band.view(np.uint8).reshape(-1), dtype, dtypes.float32).view(np.float32).reshape(band.shape)
    return band.astype(np.float32)


@dataclass
class GGUFPlan:
    """The file's metadata and tensor types, decided with the plan."""

    file_type: str  # llama.cpp's name (q8_0, ...)
    architecture: str
    writer: Any  # a gguf.GGUFWriter holding the metadata (no file yet)
    encoded: dict[str, GGUFTensor] = field(default_factory=dict)  # by output (Hugging Face) name
    # Where each tensor of the file goes, by llama.cpp's name: the converter's order, or for llama-quantize's types,
    # the order it writes (llama.cpp's loader's: the tensors outside the blocks, then block by block, by name).
    positions: dict[str, tuple] = field(default_factory=dict)
    # Tensors the converter computes from the config (Llama 3's rope frequencies...): llama.cpp's name -> f32 values
    computed: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    vocabulary: str = ""  # what the tokenizer became, as inspect says it
    made_header: tuple = ()  # (the tensors, header()'s answer for them): a large vocabulary takes a while to pack
    mmproj: GGUFPlan | None = None  # a vision-language model's second file, its vision part (gguf_vision.py)

    def files(self) -> dict[str, GGUFPlan]:
        """The plan of each file written, by its name in the staging folder."""
        return {FILE_NAME: self, **({MMPROJ_FILE_NAME: self.mmproj} if self.mmproj else {})}

    def position(self, output: OutputTensor) -> tuple:
        """Where the file's tensor holding this output goes."""
        return self.positions[stacked(self.encoded[output.name].stored[0].name)[0]]

    def computed_stored(self) -> list[OutputTensor]:
        """The computed tensors as the file stores them (their f32 bytes)."""
        from ..types import OutputTensor

        return [OutputTensor(name, (values.nbytes,), dtypes.BY_NAME["uint8"]) for name, values in self.computed.items()]

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        types = {**{stacked(e.stored[0].name)[0]: e.qtype.name for e in self.encoded.values()},
                 **dict.fromkeys(self.computed, "F32")}
        for qtype in types.values():
            counts[qtype] = counts.get(qtype, 0) + 1
        return {"type": self.file_type, "architecture": self.architecture, "tensor_types": counts,
                "vocabulary": self.vocabulary, "mmproj": self.mmproj.summary() if self.mmproj else None}


# A MoE layer's experts, one Hugging Face tensor each (model.layers.0.mlp.experts.3.up_proj.weight), are one
# tensor in llama.cpp (blk.0.ffn_up_exps.weight), stacked on a first axis. The plan writes each expert into its
# place in the stack as a part of its own, known as the stack's name with the expert's number: name[3].
EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(.+)$")
PART = re.compile(r"^(.*)\[(\d+)\]$")


def stacked(name: str) -> tuple[str, int | None]:
    """(the file's tensor, the expert) of a stored tensor's name: (name, None) for a tensor stored whole."""
    part = PART.match(name)
    return (part[1], int(part[2])) if part else (name, None)


def plan_gguf(requested: str, outputs: list[OutputTensor], config_folder: Path | None, dtype_name: str,
              config_changes: dict[str, Any] | None = None) -> GGUFPlan:
    """Names, types and metadata of the GGUF file for these output tensors, or a one-line error for a model
    llama.cpp (or this version of unshard) does not take, before anything is written."""
    gguf = _gguf()
    if requested.lower().startswith(("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq")):
        raise UnshardError(f"--gguf-type {requested}: a type llama-quantize computes and gguf-py does not; write "
                           f"f16 (or f32) here and run `llama-quantize OUT.gguf OUT-{requested}.gguf {requested}`, "
                           f"or choose one of {', '.join(TYPES)}")
    if requested not in (*TYPES, "auto"):
        raise UnshardError(f"--gguf-type {requested}: not one unshard writes; choose one of {', '.join(TYPES)} (or auto)")
    if config_folder is None or not (config_folder / "config.json").is_file():
        raise UnshardError("GGUF output needs the model's config.json and tokenizer: pass --config-from DIR")
    hparams = {**_hparams(config_folder), **(config_changes or {})}
    where = config_folder / "config.json"
    architecture = (hparams.get("architectures") or [None])[0]
    if architecture is None:
        raise ConfigMismatchError(f"{where}: names no architecture (no `architectures`), which a GGUF file's is "
                                  f"made from; pass --architecture (one of {', '.join(ARCHITECTURES)})")
    if architecture not in ARCHITECTURES:
        raise ConfigMismatchError(f"{where}: {architecture} is not an architecture unshard writes as GGUF yet "
                                  f"({', '.join(ARCHITECTURES)}); write a folder and use llama.cpp's convert_hf_to_gguf.py")
    from . import gguf_vision

    vision = []
    if architecture in gguf_vision.PROJECTORS:  # the text model here, the vision part in the mmproj file
        vision = [o for o in outputs if gguf_vision.is_vision(o.name)]
        outputs = [o for o in outputs if not gguf_vision.is_vision(o.name)]
        # (as the converter reads a text model's; the vision_config stays, for the mmproj)
        hparams = {**hparams, **(hparams.get("text_config") or {})}
    arch = getattr(gguf.MODEL_ARCH, ARCHITECTURES[architecture])
    file_type = requested if requested != "auto" else {"bfloat16": "bf16", "float16": "f16"}.get(dtype_name, "f16")
    ftype = (gguf.LlamaFileType.ALL_F32 if file_type == "f32"
             else getattr(gguf.LlamaFileType, "MOSTLY_" + file_type.upper()))
    plan = GGUFPlan(file_type, gguf.MODEL_ARCH_NAMES[arch], gguf.GGUFWriter(None, gguf.MODEL_ARCH_NAMES[arch]))
    experts = _check_experts(hparams, arch, where)
    head_dim = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    parameters = _plan_tensors(plan, outputs, hparams, arch, head_dim, experts, where)
    _computed_tensors(plan, hparams, arch, head_dim, where)
    plan.vocabulary = _metadata(plan.writer, hparams, config_folder, ftype, parameters, head_dim, arch)
    if file_type in LEGACY:  # llama-quantize sets these two over what it copies, which puts them last
        fields = plan.writer.kv_data[0]
        for key in (gguf.Keys.General.QUANTIZATION_VERSION, gguf.Keys.General.FILE_TYPE):
            fields[key] = fields.pop(key)
    if vision:
        plan.mmproj = gguf_vision.plan_mmproj(file_type, vision, hparams, config_folder,
                                              gguf_vision.PROJECTORS[architecture])
        plan.notes.extend(plan.mmproj.notes)
    return plan


def _plan_tensors(plan: GGUFPlan, outputs: list[OutputTensor], hparams: dict, arch, head_dim: int, experts: int,
                  where: Path) -> tuple[int, int, int, int]:
    """Each output's name, type and place in the file (plan.encoded, plan.positions); the parameters as gguf-py
    counts them for the size label: (all, those outside the experts, one expert's, experts)."""
    from ..types import OutputTensor

    gguf = _gguf()
    blocks, file_type = hparams["num_hidden_layers"], plan.file_type
    qtype = getattr(gguf.GGMLQuantizationType, file_type.upper())
    names = gguf.get_tensor_name_map(arch, blocks)
    heads, kv_heads = hparams["num_attention_heads"], hparams.get("num_key_value_heads") or hparams["num_attention_heads"]
    ordered = sorted(outputs, key=lambda o: o.name)  # (the converter's order, from a one-file folder: sorted)
    llama_names, stacks, expert_of = [], {}, {}
    for output in ordered:
        expert = EXPERT.match(output.name)
        source = output.name.replace("language_model.", "")  # (a vision-language model's text part, as the converter)
        name = names.get_name(f"{expert[1]}.{expert[3]}" if expert else source, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigMismatchError(f"{where}: the tensor {output.name} has no name in llama.cpp's {plan.architecture} "
                                      "model; llama.cpp cannot load it")
        if expert:
            stacks.setdefault(name, {})[int(expert[2])] = output
            expert_of[output.name] = int(expert[2])
        llama_names.append(name)
    _check_stacks(stacks, experts, where)
    # The converter stacks a block's experts once it has read the last of them (in its order), then writes the
    # stacks in the order of their Hugging Face names (w1, w2, w3; down, gate, up).
    last_expert = {}
    for output, name in zip(ordered, llama_names):
        if name in stacks:
            last_expert[name.split(".")[1]] = output.name
    # llama-quantize's output layer: output.weight, or the embedding where the model ties the two
    output_layer = "output.weight" if "output.weight" in llama_names else "token_embd.weight"
    gemma = arch in (gguf.MODEL_ARCH.GEMMA, gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3)  # (norms as 1 + weight)
    shared = expert_params = 0
    for output, name in zip(ordered, llama_names):
        stack, index = stacks.get(name), expert_of.get(output.name)
        shape = (len(stack), *output.shape) if stack else output.shape
        tensor_type, note = _tensor_type(plan, name, shape, qtype, name == output_layer, experts)
        if note and index in (None, 0):  # (a stack's note once)
            plan.notes.append(f"{output.name if stack is None else name}: {note}")
        permuted = 0  # (llama.cpp's llama alone wants q and k reordered; Qwen's rotate as transformers does)
        if arch == gguf.MODEL_ARCH.LLAMA and output.name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight",
                                                                   "k_proj.bias")):
            permuted = head_dim
            if output.shape[0] != head_dim * (heads if ".q_proj." in output.name else kv_heads):
                raise ConfigMismatchError(f"{where}: {output.name} has {output.shape[0]} rows, not a whole number of "
                                          f"heads of {head_dim}")
        byte_shape = tuple(gguf.quant_shape_to_byte_shape(output.shape, tensor_type))
        if file_type in LEGACY and not stack:  # (llama-quantize drops ggml's trailing dimensions of 1: our leading)
            byte_shape = byte_shape[next((i for i, d in enumerate(byte_shape) if d != 1), len(byte_shape) - 1):]
        if stack:
            stored = OutputTensor(f"{name}[{index}]", byte_shape, dtypes.BY_NAME["uint8"])
            expert_params += math.prod(output.shape) if index == 0 else 0
        else:
            stored = OutputTensor(name, byte_shape, dtypes.BY_NAME["uint8"])
            shared += math.prod(output.shape)
        shift = 1.0 if gemma and output.name.endswith("norm.weight") else 0.0
        plan.encoded[output.name] = GGUFTensor((stored,), tensor_type, output.dtype, permuted, max(1, permuted), shift)
        if file_type in LEGACY:
            plan.positions[name] = (int(name.split(".")[1]) if name.startswith("blk.") else -1, name)
        elif stack:
            plan.positions[name] = (last_expert[name.split(".")[1]], EXPERT.match(output.name)[3])
        else:
            plan.positions[name] = (output.name,)
    return shared + expert_params * experts, shared, expert_params, experts if stacks else 0


def _tensor_type(plan: GGUFPlan, name: str, shape: tuple[int, ...], qtype, output_layer: bool, experts: int):
    """The GGUF type of a tensor of this llama.cpp name and shape, as the converter or llama-quantize chooses it,
    and a note where it is not the file's type for a reason inspect should tell (or None)."""
    gguf = _gguf()
    legacy, tensor_type, note = plan.file_type in LEGACY, qtype, None
    if (len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
            or ".ffn_gate_inp" in name):  # (what llama.cpp keeps in f32: the routers too)
        return gguf.GGMLQuantizationType.F32, None
    if legacy and output_layer:
        tensor_type = gguf.GGMLQuantizationType.Q8_0
        note = ("in Q8_0, as `llama-quantize --output-tensor-type q8_0` writes it (llama-quantize's own q6_K is a "
                "K-quant gguf-py cannot compute)")
    elif legacy and experts == 8 and name.endswith(("attn_k.weight", "attn_v.weight")):
        tensor_type = gguf.GGMLQuantizationType.Q8_0  # (llama-quantize's choice for a model of 8 experts)
    block, _ = gguf.GGML_QUANT_SIZES[tensor_type]
    if shape[-1] % block:  # (the converter and llama-quantize fall back to f16 where rows do not fill blocks)
        return gguf.GGMLQuantizationType.F16, (f"rows of {shape[-1]} do not fill {tensor_type.name}'s blocks of "
                                               f"{block}: written in F16, as llama.cpp's converter and llama-quantize do")
    return tensor_type, note


def _computed_tensors(plan: GGUFPlan, hparams: dict, arch, head_dim: int, where: Path) -> None:
    """The tensors the converter computes from the config, first in its file (plan.computed): Llama 3's rope
    frequency factors (rope_type llama3), Phi-3's long and short rope factors (its 128k models' longrope, whose
    attention factor goes into the header first too)."""
    import numpy as np

    gguf = _gguf()
    _, rope = _rope(hparams)
    if str(rope.get("rope_type")).lower() == "llama3":
        if arch != gguf.MODEL_ARCH.LLAMA:
            raise ConfigMismatchError(f"{where}: rope type 'llama3' on a {plan.architecture} model, which llama.cpp's "
                                      "converter does not write; write a folder and use llama.cpp's convert_hf_to_gguf.py")
        plan.computed["rope_freqs.weight"] = _llama3_rope_factors(rope, head_dim)
    elif arch == gguf.MODEL_ARCH.PHI3 and rope.get("long_factor"):
        plan.computed.update(_phi3_rope_factors(plan.writer, hparams, rope, where))
    for i, name in enumerate(plan.computed):  # (before every other tensor; llama-quantize's order is by name)
        plan.positions[name] = (-1, name) if plan.file_type in LEGACY else ("", i)
    plan.computed = {name: np.asarray(values, dtype=np.float32) for name, values in plan.computed.items()}


def _llama3_rope_factors(rope: dict, head_dim: int) -> list[float]:
    """Llama 3's rope frequencies, divided by these factors per pair of dimensions: by `factor` for wavelengths
    longer than the original context over `low_freq_factor`, by 1 for those shorter than it over
    `high_freq_factor`, smoothly between (as transformers' and the converter's rope of type llama3)."""
    import torch

    base = rope.get("rope_theta", 10000.0)
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    context = rope.get("original_max_position_embeddings", 8192)
    factors = []  # (computed in float32 as the converter computes them, so the values are its own to the bit)
    for frequency in 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)):
        wavelength = 2 * math.pi / frequency
        if wavelength < context / high:
            factors.append(1)
        elif wavelength > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return [float(f) for f in factors]


def _phi3_rope_factors(writer, hparams: dict, rope: dict, where: Path) -> dict[str, list[float]]:
    """Phi-3's 128k models: the long and short rope factors as tensors, and the attention factor their scaling
    implies, which the converter writes into the header before anything else of the model."""
    long, short, original = rope.get("long_factor"), rope.get("short_factor"), rope.get("original_max_position_embeddings")
    rotary, rope_type = _rotary_dimensions(hparams, rope), str(rope.get("rope_type") or "").lower()
    if rope_type not in ("su", "longrope", "yarn") or not original or not short:
        raise ConfigMismatchError(f"{where}: rope long and short factors with rope type {rope_type!r}, which "
                                  "llama.cpp's converter does not take; pass --config-from the model's own folder")
    if len(long) != len(short) or len(long) != rotary / 2:
        raise ConfigMismatchError(f"{where}: {len(long)} long and {len(short)} short rope factors for {rotary} rotary "
                                  f"dimensions (one per pair, {rotary // 2}); pass --config-from the model's own folder")
    scale = hparams["max_position_embeddings"] / original
    if scale <= 1.0:
        attention = 1.0
    elif rope_type == "yarn":
        attention = 0.1 * math.log(scale) + 1.0
    else:
        attention = math.sqrt(1 + math.log(scale) / math.log(original))
    writer.add_rope_scaling_attn_factors(attention)
    return {"rope_factors_long.weight": long, "rope_factors_short.weight": short}


def _check_experts(hparams: dict, arch, where: Path) -> int:
    """The config's experts per MoE layer (0: a dense model), where llama.cpp computes the model as transformers
    does: Qwen2-MoE's top experts' weights as they are, Qwen3-MoE's renormalised, every layer a MoE one."""
    gguf = _gguf()
    experts = _first(hparams, "num_local_experts", "num_experts", "n_routed_experts") or 0
    if arch not in (gguf.MODEL_ARCH.QWEN2MOE, gguf.MODEL_ARCH.QWEN3MOE):
        return experts
    renormalised = arch == gguf.MODEL_ARCH.QWEN3MOE
    if bool(hparams.get("norm_topk_prob")) != renormalised:
        raise ConfigMismatchError(f"{where}: norm_topk_prob is {hparams.get('norm_topk_prob')}, but llama.cpp's "
                                  f"{gguf.MODEL_ARCH_NAMES[arch]} {'always' if renormalised else 'never'} renormalises "
                                  "the chosen experts' weights and would compute another model; serve this one with "
                                  "transformers or vLLM")
    if hparams.get("mlp_only_layers") or hparams.get("decoder_sparse_step", 1) != 1:
        raise ConfigMismatchError(f"{where}: some layers are dense (mlp_only_layers, decoder_sparse_step), which "
                                  f"llama.cpp's {gguf.MODEL_ARCH_NAMES[arch]} does not run; serve this model with "
                                  "transformers or vLLM")
    return experts


def _check_stacks(stacks: dict[str, dict[int, OutputTensor]], experts: int, where: Path) -> None:
    """Every stack has the config's experts, numbered from 0, all of one shape: llama.cpp's tensor is whole."""
    for name, stack in stacks.items():
        shapes = {o.shape for o in stack.values()}
        if sorted(stack) != list(range(experts)) or len(shapes) != 1:
            found = f"experts {sorted(stack)}" if len(shapes) == 1 else f"experts of shapes {sorted(shapes)}"
            raise ConfigMismatchError(f"{where}: {name} stacks {experts} experts of one shape in llama.cpp, and the "
                                      f"checkpoint has {found}; pass --config-from the model's own folder")


def _first(hparams: dict, *keys: str) -> Any:
    """The value of the first of these keys the config has (as the converter's find_hparam)."""
    return next((hparams[key] for key in keys if key in hparams), None)


def _hparams(folder: Path) -> dict[str, Any]:
    """config.json with the defaults its config class fills in, as the converter reads it (AutoConfig's to_dict,
    where transformers is installed). Importing transformers costs seconds, so the answer is kept (known.py)
    for the next checkpoint of the same config."""
    import json

    config = read_json(folder / "config.json", "fix it or pass --config-from DIR", ConfigMismatchError)
    text = (folder / "config.json").read_text()
    version = known.transformers_version()
    if version is None:  # (no transformers: the file as it is, as the converter would have it)
        return config
    entry = known.key("gguf-hparams", version, text)
    full = known.recall("configs", entry)
    if full is None:
        try:
            from transformers import AutoConfig
            from transformers.utils import logging as transformers_logging

            level = transformers_logging.get_verbosity()
            transformers_logging.set_verbosity_error()  # (its warnings on a config: the checks here say what matters)
            try:
                full = AutoConfig.from_pretrained(folder, trust_remote_code=False).to_dict()
            finally:
                transformers_logging.set_verbosity(level)
        except Exception:  # (a config transformers cannot read: the file as it is, as the converter does)
            return config
        full = json.loads(json.dumps(full, default=str))  # (as it is kept: the same values first time and after)
        known.remember("configs", entry, full)
    return {**full, **{k: v for k, v in config.items() if k not in full}}


def _metadata(writer, hparams: dict, folder: Path, ftype, parameters: tuple[int, int, int, int], head_dim: int,
              arch) -> str:
    """The key-values the converter writes, in its order (general, hyper-parameters, tokenizer); a `llama`
    (the converter's LlamaModel) adds its vocabulary size, rope dimensions and space prefix, and Gemma 2 has
    hyper-parameters of its own."""
    gguf = _gguf()
    writer.add_type(gguf.GGUFType.MODEL)
    general_metadata(writer, folder, parameters)
    blocks = hparams["num_hidden_layers"]
    llama = arch == gguf.MODEL_ARCH.LLAMA
    if arch in (gguf.MODEL_ARCH.GEMMA, gguf.MODEL_ARCH.GEMMA2):
        _gemma_hyperparameters(writer, hparams, ftype, blocks, folder / "config.json", arch == gguf.MODEL_ARCH.GEMMA2)
    elif arch == gguf.MODEL_ARCH.GEMMA3:
        _gemma3_hyperparameters(writer, hparams, ftype, blocks, folder)
    elif arch == gguf.MODEL_ARCH.PHI3:
        _phi3_hyperparameters(writer, hparams, ftype, blocks, folder / "config.json")
    else:
        _text_hyperparameters(writer, hparams, ftype, blocks, folder / "config.json")
    if arch in (gguf.MODEL_ARCH.QWEN2MOE, gguf.MODEL_ARCH.QWEN3MOE):  # (the experts' widths, after the file type)
        if hparams.get("moe_intermediate_size") is not None:
            writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
        if hparams.get("shared_expert_intermediate_size") is not None:
            writer.add_expert_shared_feed_forward_length(hparams["shared_expert_intermediate_size"])
    if llama:
        writer.add_vocab_size(hparams["vocab_size"])
        writer.add_rope_dimension_count(head_dim)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocabulary = _vocabulary(writer, hparams, folder, llama, phi3=arch == gguf.MODEL_ARCH.PHI3,
                             bpe=arch in (gguf.MODEL_ARCH.QWEN2MOE, gguf.MODEL_ARCH.QWEN3MOE))
    if arch == gguf.MODEL_ARCH.GEMMA:
        _gemma_special_tokens(writer, folder)
    if arch in (gguf.MODEL_ARCH.GEMMA, gguf.MODEL_ARCH.GEMMA2) or (
            arch == gguf.MODEL_ARCH.GEMMA3 and (folder / "tokenizer.model").is_file()):
        writer.add_add_space_prefix(False)
    return vocabulary


def general_metadata(writer, folder: Path, parameters: tuple[int, int, int, int]) -> None:
    """The general key-values: gguf-py's Metadata of the folder (model card, generation config's sampling), its name
    the folder's (which names the converter's file; OUT's name would do as well), the size label from the parameters
    of the file's tensors (all, outside the experts, one expert's, experts)."""
    gguf = _gguf()
    general = gguf.Metadata.load(None, folder, None, parameters[0])
    general.name = general.name or folder.name
    if general.sampling_penalty_repeat is None:  # (llama.cpp's own gguf-py, newer than PyPI's 0.19.0, reads this too)
        general.sampling_penalty_repeat = _json(folder / "generation_config.json").get("repetition_penalty")
    if general.size_label is None and parameters[0] > 0:
        general.size_label = gguf.size_label(*parameters)  # ("8x7B" for experts)
    general.set_gguf_meta_model(writer)


def _rope(hparams: dict) -> tuple[dict, dict]:
    """The config's rope parameters as the converter reads them, and the global layers' (a model with rope of its
    own per kind of layer, as Gemma 3, keeps them under full_attention; the others have one set, into which the
    converter mirrors the config's rope_theta, partial_rotary_factor and original_max_position_embeddings, and
    `type` as `rope_type`, as transformers 4 wrote them)."""
    by_layer = dict(hparams.get("rope_parameters") or hparams.get("rope_scaling") or {})
    if "full_attention" not in by_layer and "sliding_attention" not in by_layer:
        for key in ("rope_theta", "partial_rotary_factor", "original_max_position_embeddings"):
            if key not in by_layer and hparams.get(key) is not None:
                by_layer[key] = hparams[key]
        if "rope_type" not in by_layer and by_layer.get("type") is not None:
            by_layer["rope_type"] = by_layer["type"]
    return by_layer, dict(by_layer.get("full_attention", by_layer))


def _rotary_dimensions(hparams: dict, rope: dict) -> int:
    """The dimensions of a head that rope rotates (all but for a partial rotary factor)."""
    return int(rope.get("partial_rotary_factor", 1.0) * hparams["hidden_size"]) // hparams["num_attention_heads"]


def _text_hyperparameters(writer, hparams: dict, ftype, blocks: int, where: Path) -> None:
    """The converter's TextModel's: sizes, heads, rope (linear and YaRN scaling), norm epsilon, head width."""
    gguf = _gguf()
    writer.add_block_count(blocks)
    for key, add in (("max_position_embeddings", writer.add_context_length), ("hidden_size", writer.add_embedding_length),
                     ("intermediate_size", writer.add_feed_forward_length), ("num_attention_heads", writer.add_head_count),
                     ("num_key_value_heads", writer.add_head_count_kv)):
        if hparams.get(key) is not None:
            add(hparams[key])
    if hparams.get("is_causal") is False:
        writer.add_causal_attention(False)
    rope_by_layer, rope = _rope(hparams)
    rope_type = rope.get("rope_type")
    if rope_type == "linear" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope_type == "yarn" and rope.get("factor") is not None:
        if rope.get("original_max_position_embeddings") is None:
            raise ConfigMismatchError(f"{where}: YaRN rope scaling without original_max_position_embeddings, which "
                                      "llama.cpp needs; add the context the model was trained with to rope_parameters")
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for value, add in ((rope.get("extrapolation_factor"), writer.add_rope_scaling_yarn_ext_factor),
                           (rope.get("attention_factor", rope.get("attn_factor")), writer.add_rope_scaling_yarn_attn_factor),
                           (rope.get("beta_fast"), writer.add_rope_scaling_yarn_beta_fast),
                           (rope.get("beta_slow"), writer.add_rope_scaling_yarn_beta_slow)):
            if value is not None:
                add(value)
    elif rope_type not in (None, "default") and rope_type.lower() != "llama3":  # (llama3: _computed_tensors)
        raise ConfigMismatchError(f"{where}: rope type {rope_type!r} is not written as GGUF by unshard "
                                  "yet; write a folder and use llama.cpp's convert_hf_to_gguf.py")
    if rope.get("rope_theta") is not None:
        writer.add_rope_freq_base(rope["rope_theta"])
    if rope_by_layer.get("sliding_attention", {}).get("rope_theta") is not None:
        writer.add_rope_freq_base_swa(rope_by_layer["sliding_attention"]["rope_theta"])
    if hparams.get("rms_norm_eps") is not None:
        writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    if (experts := _first(hparams, "num_local_experts", "num_experts", "n_routed_experts")) is not None:
        writer.add_expert_count(experts)
    if (used := _first(hparams, "num_experts_per_tok", "num_experts_per_token", "top_k_experts")) is not None:
        writer.add_expert_used_count(used)
    for key in ("n_group", "topk_group", "score_function", "scoring_func", "score_func", "moe_router_activation",
                "moe_router_activation_func", "expert_selection_fn"):  # (expert groups, gating other than softmax)
        if hparams.get(key) is not None:
            raise ConfigMismatchError(f"{where}: {key} is set, an expert routing unshard does not write as GGUF yet; "
                                      "write a folder and use llama.cpp's convert_hf_to_gguf.py")
    if hparams.get("head_dim") is not None:
        writer.add_key_length(hparams["head_dim"])
        writer.add_value_length(hparams["head_dim"])
    writer.add_file_type(ftype)


GEMMA_HPARAMS = ("max_position_embeddings", "hidden_size", "intermediate_size", "num_attention_heads", "rms_norm_eps",
                 "head_dim")
GEMMA2_HPARAMS = (*GEMMA_HPARAMS, "attn_logit_softcapping", "final_logit_softcapping", "sliding_window")


def _gemma_hyperparameters(writer, hparams: dict, ftype, blocks: int, where: Path, gemma2: bool) -> None:
    """Gemma's and Gemma 2's, as the converter writes them: no rope frequency (llama.cpp's default is Gemma's);
    Gemma 2 adds the logits' soft caps and the sliding window."""
    needed, name = (GEMMA2_HPARAMS, "gemma2") if gemma2 else (GEMMA_HPARAMS, "gemma")
    missing = [key for key in needed if hparams.get(key) is None]
    if missing:
        raise ConfigMismatchError(f"{where}: no {', '.join(missing)}, which llama.cpp's {name} needs; "
                                  "pass --config-from the model's own folder")
    if gemma2:  # (Gemma scales queries by head width alone, as llama.cpp's gemma does)
        _check_query_scale(hparams, name, 46, where)
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(hparams.get("num_key_value_heads") or hparams["num_attention_heads"])
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    writer.add_key_length(hparams["head_dim"])
    writer.add_value_length(hparams["head_dim"])
    writer.add_file_type(ftype)
    if gemma2:
        writer.add_attn_logit_softcapping(hparams["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(hparams["final_logit_softcapping"])
        writer.add_sliding_window(hparams["sliding_window"])


# CodeGemma's fill-in-the-middle tokens, which the converter writes for every Gemma (its ids, as it has them)
GEMMA_SPECIAL_TOKENS = {"prefix": 67, "suffix": 69, "middle": 68, "fsep": 70, "eot": 107}


def _gemma_special_tokens(writer, folder: Path) -> None:
    special = _special_vocab(folder, load_merges=False, special_token_types=list(GEMMA_SPECIAL_TOKENS))
    for kind, token in GEMMA_SPECIAL_TOKENS.items():
        special.special_token_ids.setdefault(kind, token)
    special.chat_template = None  # (written with the vocabulary)
    quiet = logging.getLogger("gguf")
    level, quiet.level = quiet.level, logging.ERROR  # (gguf-py has no field for some, and says so for each)
    try:
        special.add_to_gguf(writer, quiet=True)
    finally:
        quiet.level = level


def _phi3_hyperparameters(writer, hparams: dict, ftype, blocks: int, where: Path) -> None:
    """Phi-3's, as the converter writes them: the original context length, the rotary dimensions (of a partial
    rotary factor), a sliding window of 0 for none. (The 128k models' rope factors: _phi3_rope_factors.)"""
    _, rope = _rope(hparams)
    original, theta = rope.get("original_max_position_embeddings"), rope.get("rope_theta")
    missing = [key for key, value in (("original_max_position_embeddings", original), ("rope_theta", theta))
               if value is None]
    if missing:
        raise ConfigMismatchError(f"{where}: no {', '.join(missing)}, which llama.cpp's phi3 needs; "
                                  "pass --config-from the model's own folder")
    heads = hparams["num_attention_heads"]
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_block_count(blocks)
    writer.add_head_count(heads)
    writer.add_head_count_kv(hparams.get("num_key_value_heads") or heads)
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    writer.add_rope_dimension_count(_rotary_dimensions(hparams, rope))
    writer.add_rope_freq_base(theta)
    writer.add_file_type(ftype)
    writer.add_sliding_window(hparams.get("sliding_window") or 0)


def _check_query_scale(hparams: dict, arch_name: str, largest_blocks: int, where: Path) -> None:
    """llama.cpp scales Gemma's queries by 1/sqrt(head_dim), or 1/sqrt(hidden_size / heads) for the layer count of
    the 27B model, whatever query_pre_attn_scalar says: where they differ it would compute another model."""
    blocks = hparams["num_hidden_layers"]
    scale = hparams["hidden_size"] // hparams["num_attention_heads"] if blocks == largest_blocks else hparams["head_dim"]
    if hparams.get("query_pre_attn_scalar", scale) != scale:
        raise ConfigMismatchError(f"{where}: query_pre_attn_scalar is {hparams['query_pre_attn_scalar']}, but "
                                  f"llama.cpp's {arch_name} scales queries by 1/sqrt({scale}) and would compute another "
                                  "model; serve this one with transformers or vLLM")


def _gemma3_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Gemma 3's text model, as the converter writes it: TextModel's fields (the global layers' rope base, the
    sliding ones' as rope.freq_base_swa), with Gemma 3's defaults where the config lacks a value, then the final
    soft cap and the sliding window. llama.cpp makes every sixth layer global and scales queries by head width:
    a config otherwise is one line."""
    where = folder / "config.json"
    if hparams.get("attn_logit_softcapping") is not None:
        raise ConfigMismatchError(f"{where}: attn_logit_softcapping is set, which llama.cpp's gemma3 does not apply; "
                                  "serve this model with transformers or vLLM")
    defaults = {"max_position_embeddings": 131072, "num_attention_heads": 8, "rms_norm_eps": 1e-6, "head_dim": 256,
                "num_key_value_heads": 4}
    hparams = {**hparams, **{key: value for key, value in defaults.items() if hparams.get(key) is None}}
    _check_query_scale(hparams, "gemma3", 62, where)
    _text_hyperparameters(writer, hparams, ftype, blocks, where)
    if hparams.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(hparams["final_logit_softcapping"])
    if hparams.get("sliding_window_pattern") != 1:
        writer.add_sliding_window(hparams["sliding_window"])
        global_every_sixth = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(blocks)]
        if hparams.get("layer_types") not in (None, global_every_sixth):
            raise ConfigMismatchError(f"{where}: layer_types is not one global layer in six, the only pattern "
                                      "llama.cpp's gemma3 runs; serve this model with transformers or vLLM")
    if not (folder / "tokenizer.model").is_file():
        # The converter cuts the embedding to the tokens tokenizer.json lists (its vocabulary plus its added tokens,
        # counted again where they are in both) but lists the config's count of tokens, so fewer rows than that
        # make a file llama.cpp refuses to load ("token_embd.weight has wrong shape").
        tokenizer = _json(folder / "tokenizer.json")
        tokens = len(tokenizer.get("model", {}).get("vocab", {})) + len(tokenizer.get("added_tokens", []))
        if tokens < hparams["vocab_size"]:
            raise ConfigMismatchError(f"{folder / 'tokenizer.json'}: {tokens} tokens for an embedding of "
                                      f"{hparams['vocab_size']} rows; llama.cpp's converter would cut the embedding "
                                      "to the tokens, and llama.cpp then refuses the file; give the folder the model's "
                                      "tokenizer.model (SentencePiece), with which every row is kept")


def _vocabulary(writer, hparams: dict, folder: Path, llama: bool, phi3: bool = False, bpe: bool = False) -> str:
    """The vocabulary as the converter writes it: from a SentencePiece model (tokenizer.model) where there is
    one, else from a byte-level BPE tokenizer.json; a `bpe` model's (Qwen's MoE ones) from tokenizer.json
    alone. Says which."""
    tokenizer_config = _json(folder / "tokenizer_config.json")
    if llama and tokenizer_config.get("add_prefix_space") is not None:
        writer.add_add_space_prefix(tokenizer_config["add_prefix_space"])
    # (Phi-4's tokenizer, as the converter reads it; Qwen's MoE models, whose converter reads no other)
    if bpe or phi3 and tokenizer_config.get("tokenizer_class") == "GPT2Tokenizer":
        size, pre = _bpe_vocabulary(writer, hparams, folder)
        return f"{size} tokens from tokenizer.json (byte-level BPE, pre-tokenizer {pre})"
    if (folder / "tokenizer.model").is_file():
        size = _sentencepiece_vocabulary(writer, hparams, folder, tokenizer_config, phi3)
        return f"{size} tokens from tokenizer.model (SentencePiece)"
    if (folder / "tokenizer.json").is_file():
        size, pre = _bpe_vocabulary(writer, hparams, folder)
        return f"{size} tokens from tokenizer.json (byte-level BPE, pre-tokenizer {pre})"
    raise ConfigMismatchError(f"{folder}: no tokenizer.model or tokenizer.json; a GGUF file holds the "
                              "vocabulary: pass --config-from a folder with the model's tokenizer")


def _sentencepiece_vocabulary(writer, hparams: dict, folder: Path, tokenizer_config: dict, phi3: bool = False) -> int:
    """Every id up to the config's vocab_size, with its piece, score and type; tokens added by
    tokenizer_config.json over them; then gguf-py's SpecialVocab (special ids, add_bos/eos, chat template).
    Phi-3's converter takes the added tokens as they are written, control tokens where marked special, and
    tokenizer.json's added tokens after them."""
    gguf = _gguf()
    model = folder / "tokenizer.model"
    from sentencepiece import SentencePieceProcessor

    processor = SentencePieceProcessor()
    try:
        processor.LoadFromFile(str(model))
    except (OSError, RuntimeError) as e:
        raise ConfigMismatchError(f"{model}: not a SentencePiece model ({str(e)[:120]}); restore it") from None
    size = hparams.get("vocab_size") or processor.vocab_size()
    types = gguf.TokenType
    tokens = [f"[PAD{i}]".encode() for i in range(size)]
    scores, kinds = [-10000.0] * size, [types.UNUSED] * size
    for i in range(min(size, processor.vocab_size())):
        kind = (types.UNKNOWN if processor.IsUnknown(i) else types.CONTROL if processor.IsControl(i)
                else types.UNUSED if processor.IsUnused(i) else types.BYTE if processor.IsByte(i) else types.NORMAL)
        try:
            piece = processor.IdToPiece(i)
        except UnicodeDecodeError:  # (SentencePiece writes its pieces as UTF-8: this file was damaged since)
            raise ConfigMismatchError(f"{model}: token {i}'s piece is not UTF-8 text; restore the file") from None
        tokens[i], scores[i], kinds[i] = piece.encode(), processor.GetScore(i), kind
    for text, i in _json(folder / "added_tokens.json").items():
        if i < size:
            tokens[i], scores[i], kinds[i] = text.encode(), -1000.0, types.USER_DEFINED
    added_tokens = [(int(key), added) for key, added in tokenizer_config.get("added_tokens_decoder", {}).items()]
    if phi3:
        added_tokens += [(int(added["id"]), added) for added in _json(folder / "tokenizer.json").get("added_tokens", [])]
    for i, added in added_tokens:
        text = added["content"]
        if i >= size:
            continue
        if phi3:
            kinds[i] = types.CONTROL if added.get("special") else types.USER_DEFINED
        elif added.get("special") or _looks_special(text):
            kinds[i] = types.CONTROL
        else:
            text, kinds[i] = text.replace("\u2581", " "), types.USER_DEFINED
        tokens[i], scores[i] = text.encode(), -1000.0
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(kinds)
    _special_vocab(folder, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)
    return size


# llama.cpp's names of the byte-level BPE pre-tokenizers it implements, by the split that tokenizer.json's
# pre-tokenizer makes before the byte-level step: GPT-2's own split (ByteLevel with its regex), or a Split
# by one of these regexes (Llama 3's, Qwen2's: digits one at a time).
GPT2_PRE = "gpt-2"
PRE_TOKENIZER_SPLITS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "qwen2",
}


def _bpe_vocabulary(writer, hparams: dict, folder: Path) -> tuple[int, str]:
    """A byte-level BPE vocabulary (tokenizer.json) as the converter writes it (its `gpt2` tokenizer model):
    every id up to the config's vocab_size, read through transformers' tokenizer; added tokens as control or
    user-defined; the pre-tokenizer's llama.cpp name; then gguf-py's SpecialVocab with the merges.

    The converter names the pre-tokenizer by a hash of one text's token ids, listed per model it knows, so
    it refuses a tokenizer trained anew; unshard names it by the split tokenizer.json declares, which is what
    llama.cpp reproduces, so a new vocabulary over a known split is taken too."""
    gguf = _gguf()
    path = folder / "tokenizer.json"
    described = read_json(path, "fix it or pass --config-from a folder with the model's tokenizer", ConfigMismatchError)
    model = described.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        kind = "BPE with byte fallback" if model.get("type") == "BPE" else model.get("type")
        raise ConfigMismatchError(f"{path}: a {kind} tokenizer, not a byte-level BPE; unshard writes GGUF vocabularies "
                                  "from SentencePiece models and byte-level BPE so far: write a folder and use "
                                  "llama.cpp's convert_hf_to_gguf.py")
    if not model.get("vocab") or not model.get("merges"):  # (llama.cpp could not tokenize with it)
        raise ConfigMismatchError(f"{path}: a BPE tokenizer without {'merges' if model.get('vocab') else 'a vocabulary'}; "
                                  "pass --config-from a folder with the model's own tokenizer")
    pre = _pre_tokenizer_name(described.get("pre_tokenizer"), model)
    if pre is None:
        raise ConfigMismatchError(f"{path}: its pre-tokenizer is not one unshard can name for llama.cpp (the splits "
                                  f"of {', '.join([GPT2_PRE, *PRE_TOKENIZER_SPLITS.values()])}); write a folder and "
                                  "use llama.cpp's convert_hf_to_gguf.py, which knows more by their hashes")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UnshardError("a GGUF file's BPE vocabulary is read by transformers: pip install 'unshard[gguf]'") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except Exception as e:  # (transformers raises many kinds on a broken tokenizer folder)
        raise ConfigMismatchError(f"{path}: transformers cannot read the tokenizer ({type(e).__name__}: "
                                  f"{str(e)[:120]}); restore it") from None
    vocab = tokenizer.get_vocab()
    size, top = hparams.get("vocab_size") or len(vocab), max(vocab.values(), default=-1)
    if top >= size:
        raise ConfigMismatchError(f"{path}: token id {top} is beyond the config's vocab_size {size}; "
                                  "pass --config-from the folder the model was trained with")
    by_id = {i: token for token, i in vocab.items()}
    added, decoder = tokenizer.get_added_vocab(), tokenizer.added_tokens_decoder
    types = gguf.TokenType
    tokens, kinds = [], []
    for i in range(size):
        token = by_id.get(i)
        kind = types.NORMAL
        if token is None:
            token, kind = f"[PAD{i}]", types.UNUSED
        elif token in added:
            if not decoder[i].normalized:  # (llama.cpp takes added tokens as they read once normalized)
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or _looks_special(token):
                kind = types.CONTROL
            else:
                token, kind = token.replace("\u2581", " "), types.USER_DEFINED
        tokens.append(token)
        kinds.append(kind)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    _special_vocab(folder, load_merges=True).add_to_gguf(writer, quiet=True)
    return size, pre


def _pre_tokenizer_name(pre_tokenizer: dict | None, model: dict) -> str | None:
    """llama.cpp's name of a byte-level pre-tokenizer as tokenizer.json describes it, or None. llama.cpp's
    llama-bpe also looks a word up whole before merging (as Llama 3's `ignore_merges`), so only such a
    tokenizer is named so."""
    steps = pre_tokenizer.get("pretokenizers", [pre_tokenizer]) if pre_tokenizer else []
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        return None
    if len(steps) == 1 and steps[0].get("use_regex", True):
        return GPT2_PRE
    if (len(steps) == 2 and steps[0].get("type") == "Split" and steps[0].get("behavior") == "Isolated"
            and not steps[0].get("invert") and not steps[1].get("use_regex", True)):
        name = PRE_TOKENIZER_SPLITS.get((steps[0].get("pattern") or {}).get("Regex"))
        return None if name == "llama-bpe" and not model.get("ignore_merges") else name
    return None


def _looks_special(text: str) -> bool:
    """The converter's guess at a token added as not special that ought to be a control token: a few known
    ones (deepseek-coder's, gemma's), <|...|>, <｜...｜> and gemma's <unused...>."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or text.startswith("<|") and text.endswith("|>")
            or text.startswith("<\uff5c") and text.endswith("\uff5c>") or text.startswith("<unused") and text.endswith(">"))


def _special_vocab(folder: Path, **options):
    """gguf-py's SpecialVocab of the folder (special token ids, merges, chat template), which reads its files
    as UTF-8 and JSON: one of them that is neither is one line (--no-check lets such files through the plan)."""
    try:
        return _gguf().SpecialVocab(folder, **options)
    except ValueError as e:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        from .hf_folder import unreadable_model_files

        path, why = next(iter(unreadable_model_files(folder)), (folder, str(e)[:200]))
        raise ConfigMismatchError(f"{path}: {why}; a GGUF file holds the tokenizer's files: fix or remove it") from None


def _json(path: Path) -> dict:
    return read_json(path, "fix or remove it", ConfigMismatchError) if path.is_file() else {}


def header(plan: GGUFPlan, tensors: list[OutputTensor]):
    """The file's header as gguf-py writes it (metadata, then tensor infos, in the plan's positions), and where
    each stored tensor goes (an expert, in its place in its stack):
    (header bytes, {name: (dtype, shape, offset from the data's start, bytes)}, data start, file size)."""
    import io

    import numpy as np

    asked = tuple((t.name, t.shape, t.nbytes) for t in tensors)
    if plan.made_header and plan.made_header[0] == asked:
        return plan.made_header[1]
    gguf = _gguf()
    writer = plan.writer
    writer.tensors = [{}]  # (one writer makes every header of the plan: --dry-run's, the file's)
    qtypes = {stacked(e.stored[0].name)[0]: e.qtype for e in plan.encoded.values()}
    qtypes.update(dict.fromkeys(plan.computed, gguf.GGMLQuantizationType.F32))
    parts: dict[str, dict[int | None, OutputTensor]] = {}  # the file's tensors: their experts, or themselves (None)
    for tensor in [*tensors, *plan.computed_stored()]:
        name, expert = stacked(tensor.name)
        parts.setdefault(name, {})[expert] = tensor
    entries, offset = {}, 0
    for name in sorted(parts, key=plan.positions.__getitem__):
        each = [parts[name][expert] for expert in sorted(parts[name], key=lambda e: e or 0)]
        shape = (len(each), *each[0].shape) if None not in parts[name] else each[0].shape
        nbytes = sum(t.nbytes for t in each)
        writer.add_tensor_info(name, shape, np.dtype(np.uint8), nbytes, raw_dtype=qtypes[name])
        at = offset
        for tensor in each:
            entries[tensor.name] = (tensor.dtype, tensor.shape, at, tensor.nbytes)
            at += tensor.nbytes
        offset += writer.ggml_pad(nbytes, writer.data_alignment)
    made = io.BytesIO()
    writer.fout, writer.path, writer.state = [made], None, gguf.WriterState.EMPTY
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
    finally:
        writer.fout, writer.state, writer.tensors = None, gguf.WriterState.NO_FILE, [{}]
    raw = made.getvalue()
    data_start = writer.ggml_pad(len(raw), writer.data_alignment)
    plan.made_header = (asked, (raw, entries, data_start, data_start + offset))
    return plan.made_header[1]


class GGUFFile(SafetensorsFile):
    """The GGUF file, written as a safetensors file is (sinks/safetensors.py): the header first, every
    tensor's offset known, each tensor's bytes to its place, in any order."""

    def __init__(self, path: Path, tensors: list[OutputTensor], plan: GGUFPlan):
        self._start(path, *header(plan, tensors))
        for stored in plan.computed_stored():  # (a few values each, known from the config)
            self.write_parts(stored.name, stored.dtype, stored.shape, [memoryview(plan.computed[stored.name]).cast("B")])


class WrittenGGUF(WrittenFile):
    """A GGUF file read back by gguf-py's reader, for --verify: its tensors as the plan stores them (the bytes of
    their GGUF type), at the offsets the reader finds."""

    def __init__(self, path: Path, stacks: set[str]):
        """stacks: the file's tensors that stack experts (read back as the plan stores them, one per expert)."""
        gguf = _gguf()
        self.path = path
        try:
            reader = gguf.GGUFReader(path)
        except Exception as e:  # (the reader raises ValueError and others on a malformed file)
            raise UnshardError(f"{path}: gguf-py cannot read it back ({type(e).__name__}: {e})") from None
        self.data_start = reader.data_offset
        self.entries = {}
        for tensor in reader.tensors:
            shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
            byte_shape = tuple(gguf.quant_shape_to_byte_shape(shape, tensor.tensor_type))
            begin = int(tensor.data_offset) - reader.data_offset
            if tensor.name not in stacks:
                self.entries[tensor.name] = ("U8", byte_shape, begin, begin + int(tensor.n_bytes))
                continue
            step = int(tensor.n_bytes) // shape[0]  # (a stack of experts: each as the plan stores it, name[expert])
            for expert in range(shape[0]):
                at = begin + expert * step
                self.entries[f"{tensor.name}[{expert}]"] = ("U8", byte_shape[1:], at, at + step)


def mmproj_path(out: Path) -> Path:
    """Where a vision-language model's mmproj file goes: beside OUT, named after it (mmproj-OUT), as llama.cpp's
    users and LM Studio find it."""
    return out.with_name("mmproj-" + out.name)


class GGUFSink:
    """One GGUF file as the output (a Sink, see sinks/__init__.py), and a vision-language model's mmproj file beside
    it. OUT is the file itself: it is built in a staging folder beside OUT and moved into place when complete."""

    def __init__(self, plan: GGUFPlan):
        self.plans = plan.files()

    def lay_out(self, groups: dict[str, Group], max_shard_size: int | str) -> dict[str, list[Group]]:
        files: dict[str, list[Group]] = {name: [] for name in self.plans}
        for group in groups.values():
            files[next(name for name, plan in self.plans.items() if group.outputs[0].name in plan.encoded)].append(group)
        return {name: sorted(found, key=lambda g: self.plans[name].position(g.outputs[0])) for name, found in files.items()}

    def stage(self, out: Path, overwrite: bool) -> OutputFile:
        return OutputFile(out, overwrite, {MMPROJ_FILE_NAME: mmproj_path(out)} if MMPROJ_FILE_NAME in self.plans else {})

    def open(self, path: Path, tensors: list[OutputTensor]) -> GGUFFile:
        return GGUFFile(path, tensors, self.plans[path.name])

    def file_size(self, filename: str, tensors: list[OutputTensor]) -> int:
        return header(self.plans[filename], tensors)[3]

    def read_back(self, path: Path) -> WrittenGGUF:
        """The file's tensors read back: the computed ones checked here, the others left to --verify."""
        plan = self.plans[path.name]
        written = WrittenGGUF(path, {stacked(e.stored[0].name)[0] for e in plan.encoded.values()
                                     if PART.match(e.stored[0].name)})
        for name, values in plan.computed.items():
            data = memoryview(values).cast("B")
            if name not in written.entries or written.size_of(name) != data.nbytes or not written.holds_at(name, 0, data):
                raise UnshardError(f"{path}: {name} is not the planned one; the file was changed during conversion")
            del written.entries[name]
        return written

    def finish(self, plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None):
        return [], []  # (everything is in the file's header)

    def notes(self) -> list[str]:
        return self.plans[FILE_NAME].notes

    def config_updates(self) -> dict[str, Any]:
        return {}

    def summary(self) -> dict[str, Any]:
        return {SUMMARY_KEY: self.plans[FILE_NAME].summary()}

    def card(self) -> tuple[list[str], list[str]]:
        return [], []  # (a GGUF file has no card: its header says what it is)


def plan_sink(request: FormatRequest) -> GGUFSink:
    """A .gguf OUT: the file's types and metadata, each output given its GGUF encoding."""
    if request.options.quantize or request.separate_adapter:
        raise UnshardError(f"{request.where}: a GGUF file takes neither --quantize (use --gguf-type) nor --lora separate")
    outputs = [o for g in request.groups.values() for o in g.outputs]
    gguf = plan_gguf(request.options.gguf, outputs, request.config_folder, request.dtype.name, request.config_updates)
    encodings = {name: e for file in gguf.files().values() for name, e in file.encoded.items()}
    for group in request.groups.values():
        group.outputs = [replace(o, encoding=encodings[o.name]) for o in group.outputs]
    return GGUFSink(gguf)


def summary_lines(gguf: dict[str, Any]) -> list[str]:
    """inspect's lines for a summary's `gguf`."""
    mmproj = gguf.get("mmproj")
    lines = [f"gguf         one file for llama.cpp ({gguf['architecture']}), type {gguf['type']}: "
             + ", ".join(f"{n} tensor(s) in {t}" for t, n in gguf["tensor_types"].items()),
             f"vocabulary   {gguf['vocabulary']}"]
    if mmproj:
        lines.append(f"mmproj       the vision part, for llama.cpp's multimodal library, in a second file beside OUT "
                     f"(mmproj-OUT), type {mmproj['type']}: "
                     + ", ".join(f"{n} tensor(s) in {t}" for t, n in mmproj["tensor_types"].items()))
    return lines


class OutputFile(OutputFolder):
    """The staging folder of a one-file output: committed by moving the file to OUT (and any other file made, as
    a vision model's mmproj, to its place beside OUT, before OUT: OUT in place means the output is whole)."""

    def __init__(self, out: Path, overwrite: bool = False, others: dict[str, Path] | None = None):
        self.places = {**(others or {}), FILE_NAME: out}  # file in the staging folder -> where it goes
        for place in self.places.values():
            if place.is_dir():
                raise UnshardError(f"{place}: is a folder; a GGUF output is one file: choose OUT ending in .gguf")
            if place.exists() and not overwrite:
                raise OutputExistsError(f"{place}: already exists; choose another OUT or pass --overwrite")
        super().__init__(out, overwrite=True)
        self.overwrite = overwrite

    def commit(self) -> None:
        for name, place in self.places.items():
            self._move(self.path / name, place)
        shutil.rmtree(self.path, ignore_errors=True)

    def _move(self, made: Path, place: Path) -> None:
        if self.overwrite:
            os.replace(made, place)
            return
        try:  # a hard link fails if another run put a file at OUT since this one started
            os.link(made, place)
        except PermissionError:  # (a filesystem without hard links: no run put a file there before the check)
            if place.exists():
                raise OutputExistsError(f"{place}: another run wrote it while this one was running; choose "
                                        "another OUT or pass --overwrite") from None
            os.replace(made, place)
        except FileExistsError:
            shutil.rmtree(self.path, ignore_errors=True)
            raise OutputExistsError(f"{place}: another run wrote it while this one was running; this run's "
                                    "output was dropped: choose another OUT or pass --overwrite") from None


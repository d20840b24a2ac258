"""A GGUF file's plan as values: each output tensor's encoding (its llama.cpp name, type and the band work of
the converter), and the file's types, metadata writer, positions and computed tensors."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ... import dtypes
from ...families.gguf_hooks import gguf_py
from ...types import OutputTensor
from . import kquants

if TYPE_CHECKING:
    import numpy as np

    from ...dtypes import DType


# --gguf-type: llama.cpp's names of the file types the converter writes; "auto" is its default:
# bf16 or f16 as the model's (the folder's) 2-D tensors are, else f16.
# llama-quantize's legacy types, which gguf-py computes: every 2-D weight in the type, but the output layer (and
# the embedding it is tied to), which llama-quantize writes in q6_K, a K-quant gguf-py cannot compute: unshard
# writes it in q8_0, as `llama-quantize --output-tensor-type q8_0` does.
LEGACY = ("q4_0", "q4_1", "q5_0", "q5_1")
# and its K-quant mixes (kquants.MIXES: the output layer in its own q6_K), computed by llama.cpp's library
QUANTIZED = (*LEGACY, *kquants.MIXES)  # the types llama-quantize makes from the converter's file
TYPES = ("f32", "f16", "bf16", "q8_0", *QUANTIZED)
FILE_NAME = "model.gguf"  # inside the staging folder; committed as OUT itself
MMPROJ_FILE_NAME = "mmproj.gguf"  # a vision or speech model's towers; committed beside OUT (mmproj_path)


@dataclass(frozen=True)
class GGUFTensor:
    """How one output tensor is stored in the file (a types.Encoding): under llama.cpp's
    name, as the bytes of its GGUF type; q and k rows reordered within each head as llama.cpp's rotary
    embedding expects (the converter's `permute`), so a band holds whole heads; Gemma's norms shifted by one,
    as llama.cpp applies them as they are where transformers applies 1 + weight."""

    stored: tuple[OutputTensor, ...]
    qtype: Any  # gguf.GGMLQuantizationType
    dtype: DType  # the tensor's own, which bands hold
    head_dim: int = 0  # q/k rows to reorder per head; 0: none
    rows_per_band: int = 1
    shift: float = 0.0  # added to every value first
    scales: tuple[tuple[int, int, float], ...] = ()  # (first row, end row, factor): rows multiplied first, in order
    # (the tensor's rows, zero rows after them in the file): the last band is stored with them (GGUFPart.padded_rows)
    padding: tuple[int, int] = ()
    centred: bool = False  # its mean taken away, as torch takes it (a vector's: one band holds it whole)
    surveys = False  # (each band is encoded as it comes)

    def types(self) -> dict[str, Any]:
        """The file's tensors this output is stored in, with their GGUF types."""
        return {stacked(self.stored[0].name)[0]: self.qtype}

    def encode(self, band: np.ndarray, start: int) -> dict[str, np.ndarray]:
        band = _as_float(band, self.dtype)
        if self.scales:
            band = _scaled(band, start, self.scales)
        if self.shift:
            band = band + self.shift  # (in the band's dtype, as torch adds it)
        if self.centred:
            import torch

            values = torch.from_numpy(band)
            band = (values - values.mean()).numpy()
        if self.head_dim:
            half = self.head_dim // 2
            band = band.reshape(-1, 2, half, *band.shape[1:]).swapaxes(1, 2).reshape(band.shape)
        if self.padding and start + band.shape[0] == self.padding[0]:
            import numpy as np

            band = np.concatenate([band, np.zeros((self.padding[1], *band.shape[1:]), band.dtype)])
        return {self.stored[0].name: _quantized(band, self.qtype)}


@dataclass(frozen=True)
class Rearranged:
    """An output tensor the converter stores rearranged, as one or more of the file's tensors (a types.Encoding):
    `pieces` (a family's module function, families/parts.Rearrangement) cuts each band of whole `rows_per_band` rows
    into each stored tensor's piece, which is then quantized in its own type (DeepSeek's kv_b_proj as k_b and v_b,
    gpt-oss's fused experts transposed and their gate and up apart)."""

    stored: tuple[OutputTensor, ...]
    qtypes: tuple[Any, ...]
    dtype: DType
    pieces: Callable[[Any], tuple[Any, ...]]
    rows_per_band: int = 1
    surveys = False

    def types(self) -> dict[str, Any]:
        return {stored.name: qtype for stored, qtype in zip(self.stored, self.qtypes)}

    def encode(self, band: np.ndarray, start: int) -> dict[str, np.ndarray]:
        parts = zip(self.stored, self.qtypes, self.pieces(_as_float(band, self.dtype)))
        return {stored.name: _quantized(part, qtype) for stored, qtype, part in parts}


@dataclass(frozen=True)
class WithRows:
    """An output stored as `stored_as` stores it, and some of its rows besides, each as a tensor of its own in another
    file (a types.Encoding; sinks.GGUFSink places them): Pixtral's [IMG_BREAK] token, the text model's embedding row
    that llama.cpp's pixtral projector reads from the mmproj file. `rows`: each such tensor's llama.cpp name and row."""

    stored_as: GGUFTensor | Rearranged
    rows: tuple[tuple[OutputTensor, int], ...]
    qtype: Any  # the rows' GGUF type (F32, as the converter stores vectors)
    surveys = False

    @property
    def stored(self) -> tuple[OutputTensor, ...]:
        return (*self.stored_as.stored, *(tensor for tensor, _ in self.rows))

    @property
    def rows_per_band(self) -> int:
        return self.stored_as.rows_per_band

    def types(self) -> dict[str, Any]:
        return {**self.stored_as.types(), **{tensor.name: self.qtype for tensor, _ in self.rows}}

    def encode(self, band: np.ndarray, start: int) -> dict[str, np.ndarray]:
        pieces = self.stored_as.encode(band, start)
        for tensor, row in self.rows:  # (in the band that holds it, else nothing)
            held = band[row - start : row - start + 1] if start <= row < start + len(band) else band[:0]
            pieces[tensor.name] = _quantized(_as_float(held, self.stored_as.dtype), self.qtype)
        return pieces


def _as_float(band: np.ndarray, dtype: DType) -> np.ndarray:
    """A band as float16 or float32 (as the converter: other floats via float32; bfloat16, held as its bits, rounded
    as torch's cast rounds)."""
    import numpy as np

    if band.dtype in (np.float16, np.float32):
        return band
    if dtype.name == "bfloat16":
        return dtypes.cast(band.view(np.uint8).reshape(-1), dtype, dtypes.float32).view(np.float32).reshape(band.shape)
    return band.astype(np.float32)


def _scaled(band: np.ndarray, start: int, scales: tuple[tuple[int, int, float], ...]) -> np.ndarray:
    """A band (from row `start`) with rows multiplied as GGUFTensor.scales says, in the band's dtype as torch
    multiplies a float16 or float32 tensor by a number: in float32, rounded to the band's dtype each time."""
    import numpy as np

    band = band.copy()
    for first, end, factor in scales:
        rows = slice(max(first - start, 0), max(min(end - start, band.shape[0]), 0))
        band[rows] = (band[rows].astype(np.float32) * np.float32(factor)).astype(band.dtype)
    return band


def _quantized(values: np.ndarray, qtype) -> np.ndarray:
    """Rows of values as the bytes of a GGUF type: gguf-py's kernels, or llama.cpp's library for the K-quants (gguf-py
    has none)."""
    import numpy as np

    if qtype.name in kquants.KERNEL_TYPES:
        data = kquants.quantize(np.ascontiguousarray(values, dtype=np.float32), qtype.name)
    else:
        data = gguf_py().quants.quantize(np.ascontiguousarray(values), qtype)
    return data.reshape(-1).view(np.uint8)


def in_file_type(values: np.ndarray, qtype) -> np.ndarray:
    """A whole tensor's values as the file stores them in that type: float32 as they are, else rows of its bytes."""
    import numpy as np

    if qtype == gguf_py().GGMLQuantizationType.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    return _quantized(values, qtype).reshape(gguf_py().quant_shape_to_byte_shape(values.shape, qtype))


@dataclass
class GGUFPlan:
    """The file's metadata and tensor types, decided with the plan."""

    file_type: str  # llama.cpp's name (q8_0, ...)
    architecture: str
    writer: Any  # a gguf.GGUFWriter holding the metadata (no file yet)
    encoded: dict[str, GGUFTensor | Rearranged] = field(default_factory=dict)  # by output (Hugging Face) name
    # Where each tensor of the file goes, by llama.cpp's name: the converter's order, or for llama-quantize's types,
    # the order it writes (llama.cpp's loader's: the tensors outside the blocks, then block by block, by name).
    positions: dict[str, tuple] = field(default_factory=dict)
    # Tensors the converter computes from the config (Llama 3's rope frequencies...) or reads from beside the model
    # (GGUFPart.beside_model): llama.cpp's name -> its values as the file stores them (in_file_type), written whole
    computed: dict[str, Any] = field(default_factory=dict)
    computed_types: dict[str, Any] = field(default_factory=dict)  # (those not in F32, by name: the GGUF type)
    notes: list[str] = field(default_factory=list)
    left_out: set[str] = field(default_factory=set)  # outputs the file has no place for (by output name)
    vocabulary: str = ""  # what the tokenizer became, as inspect says it
    made_header: tuple = ()  # (the tensors, header()'s answer for them): a large vocabulary takes a while to pack
    routers_in_file_type: bool = False  # (GGUFPart's: DBRX's)
    # (GGUFPart's: MiniMax-M3's indexer, which its converter keeps in F32; into llama-quantize's types, those it leaves)
    kept_in_f32: tuple[str, ...] = ()
    q8_0_or_more: tuple[str, ...] = ()  # (GGUFPart's: what llama-quantize quantizes to no fewer bits than Q8_0)
    # the file's tensors whose members (name[i]) are rows one after another, not a stack (GGUFPart.joined_rows)
    joined_rows: set[str] = field(default_factory=set)
    mmproj: GGUFPlan | None = None  # a vision-language model's second file, its towers (vision.py)
    towers: tuple[str, ...] = ()  # (an mmproj file's: the towers it holds, vision and audio, as inspect says them)
    # One file of a split (split.py): (its number from 0, the count of files, the tensors of all), and its tensors
    split: tuple[int, int, int] | tuple[()] = ()
    tensors: set[str] | None = None  # (by llama.cpp's name; None: every tensor of the plan)
    # Tensors of its outputs' encodings that another file holds (WithRows: Pixtral's embedding row, in the mmproj
    # file; the embedding itself, in the text model's), by llama.cpp's name
    elsewhere: set[str] = field(default_factory=set)

    def files(self) -> dict[str, GGUFPlan]:
        """The plan of each file written, by its name in the staging folder."""
        return {FILE_NAME: self, **({MMPROJ_FILE_NAME: self.mmproj} if self.mmproj else {})}

    def position(self, output: OutputTensor) -> tuple:
        """Where the file's tensor holding this output goes."""
        held = (stacked(s.name)[0] for s in self.encoded[output.name].stored)
        return self.positions[next(name for name in held if name not in self.elsewhere)]

    def computed_type(self, name: str):
        return self.computed_types.get(name, gguf_py().GGMLQuantizationType.F32)

    def computed_stored(self) -> list[OutputTensor]:
        """The computed tensors as the file stores them (their bytes, row by row)."""
        return [
            OutputTensor(name, (*values.shape[:-1], values.shape[-1] * values.itemsize), dtypes.BY_NAME["uint8"])
            for name, values in self.computed.items()
        ]

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        types = {
            **{
                name: qtype.name
                for e in self.encoded.values()
                for name, qtype in e.types().items()
                if name not in self.elsewhere
            },
            **{name: self.computed_type(name).name for name in self.computed},
        }
        for qtype in types.values():
            counts[qtype] = counts.get(qtype, 0) + 1
        return {
            "type": self.file_type,
            "architecture": self.architecture,
            "tensor_types": counts,
            "vocabulary": self.vocabulary,
            "mmproj": self.mmproj.summary() if self.mmproj else None,
            **({"towers": list(self.towers)} if self.towers else {}),
        }


# A MoE layer's experts, one Hugging Face tensor each (model.layers.0.mlp.experts.3.up_proj.weight), are one
# tensor in llama.cpp (blk.0.ffn_up_exps.weight), stacked on a first axis. The plan writes each expert into its
# place in the stack as a part of its own, known as the stack's name with the expert's number: name[3].
EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(.+)$")
# StableLM 2's q and k norms, a LayerNorm per head (model.layers.0.self_attn.q_layernorm.norms.5.weight), are one
# tensor in llama.cpp too (blk.0.attn_q_norm.weight), stacked as experts are, a head a row.
HEAD_NORM = re.compile(r"^(.*\.[qk]_layernorm)\.norms\.(\d+)\.(weight)$")
LAYER = re.compile(r"^(?:model\.(?:language_model\.)?)?layers\.(\d+)\.")  # (a decoder layer's tensor, its number)
PART = re.compile(r"^(.*)\[(\d+)\]$")


def stacked(name: str) -> tuple[str, int | None]:
    """(the file's tensor, the expert) of a stored tensor's name: (name, None) for a tensor stored whole."""
    part = PART.match(name)
    return (part[1], int(part[2])) if part else (name, None)

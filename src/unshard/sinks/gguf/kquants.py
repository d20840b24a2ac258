"""llama-quantize's K-quant mixes (q2_k ... q6_k, q4_k_m, iq4_nl, iq4_xs) in the one streaming pass: which type
each tensor takes, as llama.cpp's llama-quant.cpp chooses it without an importance matrix, and its blocks, computed
by llama.cpp's own kernels (`ggml_quantize_chunk` in libggml-base) rather than written again here.

Why bind the library rather than write the kernels in numpy: the K-quants search each block's scales in float32
loops a compiler may fuse (multiply-add) as it likes; the same library llama-quantize calls gives its bytes by
construction, and runs in C without the GIL. The library comes with llama-cpp-python (its `llama_cpp/lib/`), or
from UNSHARD_GGML_LIBRARY, the path of a libggml-base of a llama.cpp build.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import UnshardError
from ...families.gguf_hooks import gguf_py

if TYPE_CHECKING:
    import numpy as np

# --gguf-type -> the type of the tensors the mix does not single out (llama.cpp's llama_ftype_get_default_type)
MIXES = {
    "q2_k": "Q2_K",
    "q3_k_s": "Q3_K",
    "q3_k_m": "Q3_K",
    "q3_k_l": "Q3_K",
    "q4_k_s": "Q4_K",
    "q4_k_m": "Q4_K",
    "q5_k_s": "Q5_K",
    "q5_k_m": "Q5_K",
    "q6_k": "Q6_K",
    "iq4_nl": "IQ4_NL",
    "iq4_xs": "IQ4_XS",
}
# The types only llama.cpp's kernels compute (gguf-py computes the fallbacks, q4_0 ... q8_0, as llama.cpp does)
KERNEL_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
# A tensor whose rows do not fill the type's blocks takes the type of 32-value blocks llama-quantize falls back to
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}
LIBRARY_VARIABLE = "UNSHARD_GGML_LIBRARY"


@dataclass(frozen=True)
class Model:
    """What llama-quantize's choices read of the model besides the tensors' names."""

    architecture: str  # llama.cpp's (llama, qwen2...)
    blocks: int
    heads: int
    kv_heads: int
    experts: int
    q8_0_or_more: tuple[str, ...] = ()  # (GGUFPart's: parts of the names of tensors quantized to Q8_0 at least)


def choose_types(file_type: str, model: Model, tensors: list[tuple[str, int]]) -> dict[str, tuple[str, str | None]]:
    """The type of each quantized tensor (llama.cpp's name, its row length), in llama-quantize's order, and a note
    where a row does not fill the type's blocks: llama-quant.cpp's choices for this mix, with no importance matrix
    and no overrides (its counters follow the file's order: the attention's values per block, ffn_down's)."""
    state = _State(file_type, model, [name for name, _ in tensors])
    return {name: _fallback(state.mixed_type(name, columns), columns) for name, columns in tensors}


def _category(name: str) -> str:
    """llama-quant.cpp's tensor categories, by the same substrings (attn_qkv and attn_kv_b count as attn_v)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, category in (
        ("attn_qkv.weight", "attn_v"),
        ("attn_kv_b.weight", "attn_v"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if part in name:
            return category
    return "other"


def _more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class _State:
    """llama-quant.cpp's llama_tensor_get_type_impl for the mixes of MIXES, with its counters."""

    def __init__(self, file_type: str, model: Model, names: list[str]):
        self.mix, self.model, self.tied = file_type, model, "output.weight" not in names
        self.default = MIXES[file_type]
        self.gqa = model.heads // model.kv_heads if model.kv_heads else 0
        # (llama.cpp's 70B: a Llama of 80 blocks whose keys and values are shared by query groups)
        self.is_70b = model.architecture == "llama" and model.blocks == 80 and model.heads != model.kv_heads
        self.falcon = model.architecture == "falcon"
        self.attn_v_seen = self.ffn_down_seen = 0
        self.attn_v_total = sum(_category(name) == "attn_v" for name in names)

    def mixed_type(self, name: str, columns: int) -> str:
        category, kind = _category(name), self.default
        if any(part in name for part in self.model.q8_0_or_more):  # (before any other choice, as llama.cpp's)
            return "Q8_0"
        if category == "output" or (self.tied and category == "token_embd"):
            block = gguf_py().GGML_QUANT_SIZES[getattr(gguf_py().GGMLQuantizationType, kind)][0]
            return "Q8_0" if self.falcon or columns % block else "Q6_K"
        if category == "attn_v":
            kind = self._attention_values(kind)
            self.attn_v_seen += 1
        elif category == "attn_k" and self.model.experts == 8:
            kind = "Q8_0"  # (llama.cpp's choice for 8 experts: "trades just ~128MB")
        elif category == "ffn_down":
            kind = self._ffn_down(kind, name)
            self.ffn_down_seen += 1
        elif category == "attn_output":
            kind = self._attention_output(kind)
        return kind

    def _attention_values(self, kind: str) -> str:
        mix, i, n = self.mix, self.attn_v_seen, self.attn_v_total
        if mix == "q2_k":
            kind = "Q4_K" if self.gqa >= 4 else "Q3_K"
        elif mix == "q3_k_m":
            kind = "Q5_K" if i < 2 else "Q4_K"
        elif mix == "q3_k_l":
            kind = "Q5_K"
        elif mix in ("iq4_nl", "iq4_xs") and self.gqa >= 4:
            kind = "Q5_K"
        elif mix in ("q4_k_m", "q5_k_m") and _more_bits(i, n):
            kind = "Q6_K"
        elif mix == "q4_k_s" and i < 4:
            kind = "Q5_K"
        if self.is_70b and kind in ("Q3_K", "Q4_K"):
            kind = "Q5_K"
        return "Q8_0" if self.model.experts == 8 else kind

    def _ffn_down(self, kind: str, name: str) -> str:
        mix, n = self.mix, self.model.blocks
        # (with experts, the block from the name: llama.cpp's experts' tensors need not come in block order)
        i = int(re.match(r"blk\.(\d+)\.", name)[1]) if self.model.experts > 1 else self.ffn_down_seen
        if mix == "q2_k":
            kind = "Q3_K"
        elif mix == "q3_k_m":
            kind = "Q5_K" if i < n // 16 else "Q4_K" if not self.falcon or _more_bits(i, n) else "Q3_K"
        elif mix == "q3_k_l":
            kind = "Q4_K" if self.falcon else "Q5_K"
        elif mix == "q4_k_m":
            if self.falcon:
                kind = "Q6_K" if i < n // 16 else "Q5_K" if _more_bits(i, n) else "Q4_K"
            elif _more_bits(i, n):
                kind = "Q6_K"
        elif i < n // 8 and mix in ("iq4_nl", "iq4_xs"):
            kind = "Q5_K"
        elif mix == "q5_k_m" and _more_bits(i, n):
            kind = "Q6_K"
        elif mix == "q4_k_s" and not self.falcon and i < n // 8:
            kind = "Q5_K"
        return kind

    def _attention_output(self, kind: str) -> str:
        mix = self.mix
        if self.falcon:
            return "Q4_K" if mix == "q3_k_l" else kind
        if self.model.experts == 8:
            return "Q5_K" if mix in ("q2_k", "q3_k_s", "q3_k_m", "iq4_nl", "q4_k_s", "q4_k_m", "iq4_xs") else kind
        return {"q2_k": "Q3_K", "q3_k_m": "Q4_K", "q3_k_l": "Q5_K"}.get(mix, kind)


def _fallback(kind: str, columns: int) -> tuple[str, str | None]:
    """llama-quant.cpp's tensor_type_fallback: a type of 32-value blocks where rows do not fill 256, else F16."""
    sizes, types = gguf_py().GGML_QUANT_SIZES, gguf_py().GGMLQuantizationType
    if columns % sizes[getattr(types, kind)][0] == 0:
        return kind, None
    instead = FALLBACK.get(kind, kind)
    if columns % sizes[getattr(types, instead)][0]:
        instead = "F16"
    return instead, f"rows of {columns} do not fill {kind}'s blocks: written in {instead}, as llama-quantize does"


def quantize(rows: np.ndarray, kind: str) -> np.ndarray:
    """The blocks of these float32 rows in one of KERNEL_TYPES, by llama.cpp's ggml_quantize_chunk (no importance
    matrix), as bytes."""
    import numpy as np

    rows = np.ascontiguousarray(rows, dtype=np.float32)
    count, width = rows.size // rows.shape[-1], rows.shape[-1]
    qtype = getattr(gguf_py().GGMLQuantizationType, kind)
    block, block_bytes = gguf_py().GGML_QUANT_SIZES[qtype]
    out = np.empty(count * (width // block) * block_bytes, dtype=np.uint8)
    # (a band's rows in a slice per core: the blocks are the quantizing's cost, and each call runs without the GIL)
    starts = sorted({count * i // _CORES for i in range(_CORES)} | {count})
    calls = [
        (int(qtype), rows.ctypes.data, out.ctypes.data, a * width, b - a, width, None)
        for a, b in zip(starts, starts[1:])
    ]
    written = sum(_pool().map(lambda call: _library().ggml_quantize_chunk(*call), calls))
    if written != out.size:  # (the library and gguf-py disagree on the type's size: another llama.cpp)
        raise UnshardError(
            f"{_library()._name}: wrote {written} bytes of {kind} for {out.size} by gguf-py's sizes; use the "
            "llama.cpp build that goes with the installed gguf-py (or unset " + LIBRARY_VARIABLE + ")"
        )
    return out


_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(_CORES, thread_name_prefix="unshard-kquants")


if hasattr(os, "register_at_fork"):  # (a forked writer starts a pool of its own: the parent's threads are not there)
    os.register_at_fork(after_in_child=_pool.cache_clear)


@functools.cache
def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(str(library_path("")))
    library.ggml_quantize_chunk.restype = ctypes.c_size_t
    library.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    return library


def library_path(file_type: str) -> Path:
    """libggml-base: UNSHARD_GGML_LIBRARY's, else llama-cpp-python's (found without importing it)."""
    asked = f"--gguf-type {file_type}: " if file_type else ""
    if os.environ.get(LIBRARY_VARIABLE):
        path = Path(os.environ[LIBRARY_VARIABLE])
        if not path.is_file():
            raise UnshardError(f"{asked}{LIBRARY_VARIABLE}={path} is not a file; point it at a libggml-base.so")
        return path
    spec = importlib.util.find_spec("llama_cpp")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            found = sorted((Path(folder) / "lib").glob("libggml-base.*"))
            if found:
                return found[0]
    raise UnshardError(
        f"{asked}llama.cpp's K-quant kernels come from its library, which unshard finds in llama-cpp-python: "
        f"`pip install llama-cpp-python`, or set {LIBRARY_VARIABLE} to a libggml-base of a llama.cpp build"
    )

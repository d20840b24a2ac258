"""Element types, as torch names them, known without importing torch.

A plan, `inspect` and a same-dtype conversion (bytes copied file to file) need only a type's name,
size and safetensors code. Importing torch takes over a second on every run, more than planning
a 70B checkpoint, so torch is imported only where a tensor is built: `DType.torch`. The usual
casts (fp32 training weights to a bf16 or fp16 model) are bit arithmetic, done here with numpy
(`cast`) exactly as torch's `tensor.to` rounds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # torch's name: torch.<name>
    itemsize: int
    safetensors: str  # the safetensors header's code
    is_floating_point: bool = True

    @property
    def torch(self):
        import torch

        return getattr(torch, self.name)

    def __str__(self) -> str:
        return self.name


ALL = [
    DType("float64", 8, "F64"),
    DType("float32", 4, "F32"),
    DType("float16", 2, "F16"),
    DType("bfloat16", 2, "BF16"),
    DType("float8_e4m3fn", 1, "F8_E4M3"),
    DType("float8_e5m2", 1, "F8_E5M2"),
    *(DType(f"int{bits}", bits // 8, f"I{bits}", False) for bits in (64, 32, 16, 8)),
    DType("uint8", 1, "U8", False),
    DType("bool", 1, "BOOL", False),
]
BY_NAME = {d.name: d for d in ALL}
BY_SAFETENSORS = {d.safetensors: d for d in ALL}
float32 = BY_NAME["float32"]
# What --dtype offers.
OUTPUT = {name: BY_NAME[name] for name in ("float32", "bfloat16", "float16")}


@dataclass(frozen=True)
class Unhandled:
    """A torch dtype unshard has no use for (complex, quantized), as a pickle names it: fine in an
    optimizer's state, an error in a tensor that would be written."""

    name: str

    def __str__(self) -> str:
        return self.name


def of(dtype) -> DType:
    """The DType of a torch dtype (torch.float32), or of its name ("float32")."""
    if isinstance(dtype, DType):
        return dtype
    name = str(dtype).removeprefix("torch.")
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unshard does not handle tensors of dtype {name}") from None


# Elements per numpy pass: a pass's arrays stay in the CPU's cache (4.5 GB/s; 0.8 GB/s at 16M), and
# its temporaries stay under 1 MB, which malloc serves again from its heap rather than mapping (and
# page-faulting) afresh each time (see execute.return_freed_memory).
CAST_STEP = 1 << 17


def cast(raw, source: DType, target: DType, out=None):
    """`raw`, whole elements of `source` as bytes (a uint8 numpy array), as `target`'s bytes (into `out`
    if given), bit for bit as torch's `tensor.to` on this CPU makes them: round to nearest, ties to
    even; a NaN becomes the NaN torch gives. None for a pair torch must do (see `casts_without_torch`)."""
    import numpy as np

    convert = _CASTS.get((source.name, target.name))
    if convert is None:
        return None
    count = raw.nbytes // source.itemsize
    out = np.empty(count * target.itemsize, np.uint8) if out is None else out[: count * target.itemsize]
    for start in range(0, count, CAST_STEP):
        stop = min(start + CAST_STEP, count)
        convert(
            raw[start * source.itemsize : stop * source.itemsize], out[start * target.itemsize : stop * target.itemsize]
        )
    return out


# numpy's element type for a dtype's elements: bfloat16, which numpy lacks, as its bits (and the float8s as bytes).
NUMPY = {
    "float64": "<f8",
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<u2",
    "float8_e4m3fn": "u1",
    "float8_e5m2": "u1",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "i1",
    "uint8": "u1",
    "bool": "?",
}


def as_numpy(raw, dtype: DType):
    """`raw`, whole elements of `dtype` as bytes (a uint8 numpy array), as a numpy array of them (see NUMPY)."""
    return raw.view(NUMPY[dtype.name])


def casts_without_torch(source: DType, target: DType) -> bool:
    """Whether `target`'s bytes are made from `source`'s without torch (kept as they are, or `cast`)."""
    return source == target or (source.name, target.name) in _CASTS


def _float32_to_bfloat16(raw, out) -> None:
    import numpy as np

    bits = raw.view("<u4")
    rounded = bits >> 16  # the kept half, plus 0x7FFF and the lowest kept bit: ties go to even
    rounded &= 1
    rounded += 0x7FFF
    rounded += bits  # (no wrap: only NaNs lie above -inf's 0xFF800000, and they are replaced below)
    rounded >>= 16
    kept = out.view("<u2")
    kept[:] = rounded
    nan = np.isnan(bits.view("<f4"))
    if nan.any():
        kept[nan] = 0xFFFF  # what torch's vectorised cast gives every NaN


def _float32_to_float16(raw, out) -> None:
    import numpy as np

    values = raw.view("<f4")
    with np.errstate(over="ignore", invalid="ignore"):  # (beyond fp16's range is inf, as in torch)
        out.view("<f2")[:] = values
    nan = np.isnan(values)
    if nan.any():  # torch keeps the sign and the payload's top bits, and makes the NaN quiet
        bits = raw.view("<u4")[nan]
        out.view("<u2")[nan] = ((bits >> 16) & 0x8000) | 0x7E00 | ((bits >> 13) & 0x3FF)


def _bfloat16_to_float32(raw, out) -> None:
    import numpy as np

    np.left_shift(raw.view("<u2"), 16, out=out.view("<u4"), dtype=np.uint32)  # (one pass: widened as shifted)


_CASTS = {
    ("float32", "bfloat16"): _float32_to_bfloat16,
    ("float32", "float16"): _float32_to_float16,
    ("bfloat16", "float32"): _bfloat16_to_float32,
}

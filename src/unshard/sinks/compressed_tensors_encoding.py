"""How compressed-tensors stores one Linear weight under a scheme (QuantizedWeight, the sink's Encoding), and
its arithmetic on a band of the weight's rows, in numpy.

compressed-tensors quantizes with torch operations in the weight's dtype: on a CPU each one computes in float32
and rounds its result to that dtype (bfloat16, float16), or is float32 throughout. Here every value is held in
float32 (each weight dtype widens to it exactly), each operation is numpy's float32 one, and its result is
rounded to the weight's dtype wherever torch's would be (`Rounding`). So the values are torch's, bit for bit
(tests/test_quantize.py: llm-compressor as the oracle, on weights made to meet every rounding case), without
importing torch: a second or two on every run, more than encoding a 1 GB model takes.

The band is worked through a few rows at a time (`CHUNK` elements), in this thread's scratch arrays kept from
band to band, so that each numpy pass finds its operands in the cache and nothing band-sized is mapped and
page-faulted afresh (see write/execute.return_freed_memory).
"""

from __future__ import annotations

import functools
import math
import sys
import threading
from typing import TYPE_CHECKING

import numpy as np

from .. import dtypes
from ..errors import UnshardError
from ..sources.base import thread_buffer
from ..types import OutputTensor
from .compressed_tensors_schemes import Args, Scheme

if TYPE_CHECKING:
    from ..dtypes import DType

# Elements worked at a time (1 MB of float32). Each numpy call holds the GIL for its Python part, a microsecond or two:
# with 64K-element chunks that was half of a call's time, and two threads encoded no faster than one (FP8, fp32: 2.0
# GB/s and 1.9); at 256K, 2.4 and 3.6. Larger chunks fall out of the cache (1M: 1.6 and 2.7).
CHUNK = 1 << 18

WEIGHT_DTYPES = ("float32", "bfloat16", "float16")  # (what a model is quantized from)
FP8_LARGEST = 448.0  # float8_e4m3fn's largest value
FP4_LARGEST = 6.0  # FP4 (E2M1)'s
_EXPONENT_BITS = np.uint32(0x7F800000)  # a float32 whose magnitude's bits reach these is infinite or NaN
_FP8_SMALLEST_NORMAL = np.float32(2.0**-6)
# Added to a float32 of magnitude below 2 ** 22, rounds it to an integer (ties to even), held in its lowest bits
_ROUNDING_MAGIC = np.float32(1.5 * 2**23)
_SCALE_BAND_ROWS = 8  # asymmetric int4 zero points are packed 8 rows to an int32


class QuantizedWeight:
    """A Linear weight [out, in] as compressed-tensors stores it under the scheme (see Encoding)."""

    def __init__(self, scheme: Scheme, weight: OutputTensor, source: str = ""):

        self.args, self.format = scheme.weights, scheme.format
        self.name = f"{source}: {weight.name}" if source else weight.name  # (as errors name it)
        self.rounding = Rounding(weight.dtype)  # (plan_quantization took only these dtypes)
        self.global_scale: GlobalScale | None = None  # tensor_group: shared with fused siblings (plan_quantization)
        rows, cols = weight.shape
        name = weight.name.removesuffix("weight")
        args = self.args
        if args.grouped:
            scale_shape = (rows, cols // args.group_size)
        elif args.strategy == "channel":
            scale_shape = (rows, 1)
        else:
            height, width = args.block_structure
            scale_shape = (-(-rows // height), -(-cols // width))
        self.rows_per_band = args.block_structure[0] if args.strategy == "block" else _SCALE_BAND_ROWS
        self.shape = weight.shape
        stored = []
        if self.format == "pack-quantized":
            stored.append(
                OutputTensor(f"{name}weight_packed", (rows, -(-cols * args.num_bits // 32)), dtypes.BY_NAME["int32"])
            )
        elif self.format.endswith("fp4-pack-quantized"):  # two values to a byte
            stored.append(OutputTensor(f"{name}weight_packed", (rows, cols // 2), dtypes.BY_NAME["uint8"]))
        else:
            code = "int8" if args.type == "int" else "float8_e4m3fn"
            stored.append(OutputTensor(f"{name}weight", (rows, cols), dtypes.BY_NAME[code]))
        scale_dtype = {"torch.uint8": "uint8", "torch.float8_e4m3fn": "float8_e4m3fn"}.get(args.scale_dtype)
        stored.append(
            OutputTensor(
                f"{name}weight_scale", scale_shape, dtypes.BY_NAME[scale_dtype] if scale_dtype else weight.dtype
            )
        )
        if args.strategy == "tensor_group":
            stored.append(OutputTensor(f"{name}weight_global_scale", (1,), dtypes.BY_NAME["float32"]))
        if self.format == "pack-quantized":
            stored.append(OutputTensor(f"{name}weight_shape", (2,), dtypes.BY_NAME["int64"]))
            if not args.symmetric:  # packed along the rows, 32 // num_bits rows to an int32
                stored.append(
                    OutputTensor(
                        f"{name}weight_zero_point",
                        (-(-rows * args.num_bits // 32), scale_shape[1]),
                        dtypes.BY_NAME["int32"],
                    )
                )
        self.stored = tuple(stored)
        self.names = {s.name.rsplit(".", 1)[-1]: s.name for s in stored}

    @property
    def surveys(self) -> bool:
        """Whether every band must be seen (`survey`) before the first is encoded."""
        return self.global_scale is not None

    def survey(self, band: np.ndarray, start: int = 0) -> None:
        peak = 0.0
        for _, _, rows in self._widened(band):
            peak = max(peak, float(peaks(rows.reshape(1, -1), self.name)[0]))
        self.global_scale.survey(peak)

    def encode(self, band: np.ndarray, start: int) -> dict[str, np.ndarray]:
        """The stored tensors' pieces from a band of rows (their elements: bfloat16 as its bits, uint16)."""
        args, names, rounding = self.args, self.names, self.rounding
        rows, cols = band.shape
        if args.type == "int":
            values = scratch("values", (rows, cols), np.int8)
        else:
            values = scratch("values", (rows, cols // 2 if args.num_bits == 4 else cols), np.uint8)
        if args.strategy == "block":
            height, width = args.block_structure
            scale_shape = (-(-rows // height), -(-cols // width))
        else:
            scale_shape = (rows, 1 if args.strategy == "channel" else cols // args.group_size)
        scales = scratch("scales", scale_shape, np.uint8 if args.mx else np.float32)
        zeros = None if args.symmetric else scratch("zero points", scale_shape, np.int8)
        for first, last, x in self._widened(band):
            if args.strategy == "block":
                grouped = x.reshape(last - first, -1, args.block_structure[1])  # (rows, blocks, columns of each)
                scales[first // args.block_structure[0]], divisor = self._scale_of_blocks(grouped)
                zero = None
            else:
                grouped = x.reshape(last - first, scale_shape[1], -1)  # (rows, groups, columns of each)
                scales[first:last], divisor, zero = self._scales(grouped)
                if zero is not None:
                    zeros[first:last] = zero
                divisor, zero = divisor[..., None], None if zero is None else zero[..., None]
            self._quantize(x, grouped, divisor, zero, values[first:last])
        pieces = {}
        if args.strategy == "tensor_group":
            pieces[names["weight_scale"]] = fp8_codes(scales, np.empty(scale_shape, np.uint8))
            if start == 0:
                pieces[names["weight_global_scale"]] = np.array([self.global_scale.value(rounding)], np.float32)
        else:
            pieces[names["weight_scale"]] = scales if args.mx else rounding.stored(scales)
        if self.format == "pack-quantized":
            pieces[names["weight_packed"]] = packed_rows(values, args.num_bits)
            if start == 0:
                pieces[names["weight_shape"]] = np.array(self.shape, np.int64)
            if zeros is not None:
                packed = packed_rows(zeros.T, args.num_bits, "packed zero points")
                pieces[names["weight_zero_point"]] = np.ascontiguousarray(packed.T)
        else:
            pieces[names["weight_packed" if args.num_bits == 4 else "weight"]] = values
        return pieces

    def _widened(self, band: np.ndarray):
        """(first row, last row, those rows as float32) through the band: a block's rows at a time, or as many as
        make CHUNK elements (at least one). float32 rows are the band's own, worked in place (a band is its
        thread's, and each is used once); others are widened into scratch."""
        rows, cols = band.shape
        step = self.args.block_structure[0] if self.args.strategy == "block" else max(1, CHUNK // max(1, cols))
        for first in range(0, rows, step):
            last = min(rows, first + step)
            if band.dtype == np.float32:
                yield first, last, band[first:last]
                continue
            x = scratch("x", (last - first, cols), np.float32)
            self.rounding.widen(band[first:last], x)
            yield first, last, x

    def _scales(self, grouped: np.ndarray):
        """(the scales stored, the divisors of the values, the zero points) of these rows' groups."""
        args, rounding = self.args, self.rounding
        if not args.symmetric:
            scale, zero = asymmetric_scale_and_zero(*least_and_greatest(grouped, self.name), *_range(args), rounding)
            return scale, scale, zero
        peak = peaks(grouped, self.name)
        if args.mx:
            exponent, scale = mx_exponents(peak, rounding, args.num_bits)
            return exponent, scale, None
        if args.strategy == "tensor_group":
            global_scale = self.global_scale.value(rounding)
            scale = scale_under_global(peak, global_scale, rounding)
            return scale, scale / global_scale, None  # (the values divided in float32, as torch promotes them)
        q_min, q_max = _range(args)
        scale = symmetric_scale(peak, (q_max - q_min) / 2, rounding)
        return scale, scale, None

    def _scale_of_blocks(self, grouped: np.ndarray):
        """A block row's scales (block strategy: one for each block of columns), and its divisors."""
        scale = symmetric_scale(peaks(grouped, self.name, axes=(0, 2)), FP8_LARGEST, self.rounding)
        return scale, scale.reshape(1, -1, 1)

    def _quantize(self, x: np.ndarray, grouped: np.ndarray, divisor: np.ndarray, zero, values: np.ndarray) -> None:
        """x / divisor + zero point (each group's, `grouped` being x by groups), clamped to the range, rounded to the
        integer, FP8 or FP4 grid, into `values`; in the weight's dtype (but under NVFP4's global scale: float32, as
        torch promotes it)."""
        args = self.args
        np.divide(grouped, divisor, out=grouped)
        if args.type == "float" and args.num_bits == 8 and self.rounding.name == "bfloat16":
            # A bf16 value is one of 65536: its FP8 byte by table (half the time of fp8_codes' passes)
            np.take(_fp8_of_bfloat16(), self.rounding.bfloat16_bits(x), out=values)
            return
        if args.strategy != "tensor_group":
            self.rounding(x)
        if zero is not None:
            grouped += zero
            self.rounding(x)
        if args.type == "float" and args.num_bits == 8:
            fp8_codes(x, values)  # (which clamps, and drops a zero's sign as adding the zero point does)
            return
        if args.type == "float":
            x += 0  # (turns a -0.0 into +0.0, as the reference does: FP4 keeps the sign of a zero, an integer does not)
        q_min, q_max = _range(args)
        np.clip(x, q_min, q_max, out=x)
        if args.type == "int":
            x += _ROUNDING_MAGIC  # (rounds to the integer, held in the lowest byte: its int8)
            np.copyto(values, x.view(np.int32), casting="unsafe")
        else:
            fp4_codes_packed(x, values)


def _range(args: Args) -> tuple[float, float]:
    """The quantized values' range."""
    if args.type == "int":
        half = 2**args.num_bits // 2
        return float(-half), float(half - 1)
    largest = FP4_LARGEST if args.num_bits == 4 else FP8_LARGEST
    return -largest, largest


class GlobalScale:
    """The tensor-wide float32 scale of NVFP4 (tensor_group): 448 * 6 over the largest magnitude of the weight, or
    of its fused siblings together, so that its groups' FP8 scales span FP8's range. So every band of them must be
    seen (`survey`, write/threads.py's first pass) before the first is encoded; then `value` is that scale, computed as
    compressed-tensors computes it, in the weights' dtype."""

    def __init__(self):
        self.peak: float | None = None  # the largest magnitude seen (a value of the weights' dtype)
        self._lock = threading.Lock()  # (siblings are surveyed by different threads)
        self._value: np.float32 | None = None

    def survey(self, peak: float) -> None:
        with self._lock:
            self.peak = peak if self.peak is None else max(self.peak, peak)

    def value(self, dtype: Rounding) -> np.float32:
        if self._value is None:
            if self.peak is None:
                raise RuntimeError("an NVFP4 weight encoded before its global scale was surveyed")
            self._value = global_scale_of(self.peak, dtype)
        return self._value


def scratch(name: str, shape, dtype) -> np.ndarray:
    """An array over this thread's scratch buffer `name` (sources.base.thread_buffer): made once per thread,
    grown only when a larger one is asked for. What it holds lasts until the thread asks for it again."""
    dtype = np.dtype(dtype)
    return thread_buffer(f"encoding {name}", math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)


class NonFinite(UnshardError):
    pass


class Rounding:
    """The weight's dtype: how a float32 array of its values is widened from the band, and how a float32 result
    is rounded to it (in place) where torch computes in that dtype: to nearest, ties to even, as torch's casts
    do. Constants of the dtype as torch.finfo gives them."""

    def __init__(self, dtype: DType):
        if dtype.name not in WEIGHT_DTYPES:
            raise ValueError(f"no compressed-tensors arithmetic for {dtype.name} weights")
        self.name = dtype.name
        self.eps = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}[self.name]
        self.tiny = 2.0**-14 if self.name == "float16" else 2.0**-126  # the smallest normal value

    def widen(self, raw: np.ndarray, out: np.ndarray) -> None:
        """`raw`, the band's elements (bfloat16 as its bits, uint16), into the float32 array `out`."""
        if self.name == "bfloat16":
            dtypes.cast(
                raw.reshape(-1).view(np.uint8),
                dtypes.BY_NAME["bfloat16"],
                dtypes.float32,
                out.reshape(-1).view(np.uint8),
            )
        elif self.name == "float16":  # (by table: numpy's conversion takes 1.2 ns an element, this 0.9)
            indices = scratch("float16 bits", raw.shape, np.intp)  # (see bfloat16_bits)
            np.copyto(indices, raw.view(np.uint16))
            np.take(_FLOAT16_VALUES, indices, out=out)
        else:
            np.copyto(out, raw)

    def __call__(self, values: np.ndarray) -> np.ndarray:
        if self.name == "bfloat16":
            bits = _round_off(values.view(np.uint32), 16)
            bits &= np.uint32(0xFFFF0000)
        elif self.name == "float16":
            _round_to_float16(values)
        return values

    def bfloat16_bits(self, values: np.ndarray) -> np.ndarray:
        """float32 values rounded to bfloat16, as its bits, held as indices (numpy's intp, in scratch: np.take makes
        a fresh intp copy of any other indices, which costs it four times its work; `values` are overwritten)."""
        bits = _round_off(values.view(np.uint32), 16)
        return np.right_shift(bits, 16, out=scratch("bfloat16 bits", bits.shape, np.intp))

    def stored(self, values: np.ndarray) -> np.ndarray:
        """float32 values of this dtype, as the dtype's own elements (bfloat16 as its bits) to be written."""
        if self.name == "bfloat16":
            return (values.view(np.uint32) >> 16).astype(np.uint16)
        return values.astype(np.float16) if self.name == "float16" else values


def _round_off(bits: np.ndarray, dropped: int, add: int = 0) -> np.ndarray:
    """Floats' bits (in place) made such that the bits above the lowest `dropped` are the float rounded to that many
    fewer mantissa bits, to nearest, ties to even (a carry moves into the exponent, as it should); the caller masks or
    shifts the dropped bits off. `add` is added in the same pass."""
    lowest_kept = np.right_shift(bits, dropped, out=scratch("rounding", bits.shape, bits.dtype))
    lowest_kept &= 1
    bits += lowest_kept  # (with 2**(dropped-1) - 1: a half below the kept bits rounds up only onto an even one)
    bits += (1 << (dropped - 1)) - 1 + add
    return bits


_FLOAT16_VALUES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def _round_to_float16(values: np.ndarray) -> None:
    """float32 values rounded in place to float16's, to nearest, ties to even, beyond its range infinite, as torch
    casts them (numpy's own float16 conversion, there and back, takes 2.7 ns an element here; this 1 or so).
    float16 keeps 10 bits of mantissa from its smallest normal value, 2 ** -14, up; below it, multiples of
    2 ** -24, rounded from the magnitude by adding 1.5 * 2 ** 23 once it is scaled by 2 ** 24."""
    bits = values.view(np.uint32)
    shape = bits.shape
    sign = np.bitwise_and(bits, np.uint32(0x80000000), out=scratch("float16 sign", shape, np.uint32))
    bits &= np.uint32(0x7FFFFFFF)
    small = np.multiply(values, np.float32(2.0**24), out=scratch("float16 small", shape, np.float32))
    small += _ROUNDING_MAGIC
    small -= _ROUNDING_MAGIC
    small *= np.float32(2.0**-24)
    tiny = np.less(bits, np.uint32(0x38800000), out=scratch("float16 tiny", shape, np.bool_))  # (below 2 ** -14)
    _round_off(bits, 13)
    bits &= np.uint32(0xFFFFE000)
    np.copyto(values, small, where=tiny)
    if bits.max(initial=0) > 0x477FE000:  # (above 65504, float16's largest: infinite)
        bits[bits > 0x477FE000] = 0x7F800000
    bits |= sign


def peaks(grouped: np.ndarray, name: str, axes=-1) -> np.ndarray:
    """Each group's largest magnitude (float32), the groups along `axes`: compressed-tensors' max(|min(least, 0)|,
    max(greatest, 0)), which is the same value. Taken over the magnitudes' bits (integers: numpy reduces them
    groups of 128 at a time twice as fast as floats). A NaN or infinity is refused: no scale encodes it."""
    bits = np.bitwise_and(
        grouped.view(np.uint32), np.uint32(0x7FFFFFFF), out=scratch("magnitudes", grouped.shape, np.uint32)
    )
    peak = bits.max(axis=axes)
    if peak.size and peak.max() >= _EXPONENT_BITS:
        raise _non_finite(name)
    return peak.view(np.float32)


def least_and_greatest(grouped: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Each group's least and greatest values, with zero: compressed-tensors' min(least, 0), max(greatest, 0)."""
    least, greatest = np.minimum(grouped.min(-1), 0), np.maximum(grouped.max(-1), 0)
    if not (np.isfinite(least).all() and np.isfinite(greatest).all()):
        raise _non_finite(name)
    return least, greatest


def _non_finite(name: str) -> NonFinite:
    module = name.rpartition(": ")[2].removesuffix(".weight")
    return NonFinite(
        f"{name} holds NaN or infinite values, which no quantization scale encodes; leave it out with "
        f"--quantize-ignore {module}, or check the checkpoint that gave it"
    )


def symmetric_scale(peak: np.ndarray, half_range: float, dtype: Rounding) -> np.ndarray:
    """peak / half the quantized range, in the weight's dtype; a zero scale (an all-zero group) is its eps."""
    scale = dtype(peak / np.float32(half_range))
    scale[scale == 0] = dtype.eps
    return scale


def asymmetric_scale_and_zero(least, greatest, q_min: float, q_max: float, dtype: Rounding):
    """(greatest - least) / the range, and the zero point q_min - least / scale clamped to the range, in the
    weight's dtype, the zero point rounded to int8. An all-zero group's 0 / 0 is NaN there, which torch's cast
    makes 0; its scale, then, eps."""
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = dtype(dtype(greatest - least) / np.float32(q_max - q_min))
        zero = np.clip(dtype(np.float32(q_min) - dtype(least / scale)), q_min, q_max)
    zero = np.rint(np.clip(zero, -128, 127))
    zero[np.isnan(zero)] = 0
    scale[scale == 0] = dtype.eps
    return scale, zero.astype(np.int8)


def global_scale_of(peak: float, dtype: Rounding) -> np.float32:
    """NVFP4's tensor-wide scale: 448 * 6 over the largest magnitude (at least the dtype's smallest normal), in
    the weight's dtype, as torch divides a number by a tensor: the tensor's reciprocal, times the number; 1 where
    that overflows."""
    with np.errstate(over="ignore"):
        reciprocal = dtype(np.float32(1) / np.array([max(peak, dtype.tiny)], np.float32))
        quotient = dtype(reciprocal * np.float32(FP8_LARGEST * FP4_LARGEST))[0]
    return np.float32(quotient if np.isfinite(quotient) else 1.0)


def scale_under_global(peak: np.ndarray, global_scale: np.float32, dtype: Rounding) -> np.ndarray:
    """NVFP4's group scales: peak / 6 in the weight's dtype, times the global scale in float32, rounded to FP8
    (0 becoming 0.125, compressed-tensors' smallest), then held in the weight's dtype (exactly)."""
    scale = dtype(peak / np.float32(FP4_LARGEST)) * global_scale
    np.clip(scale, -FP8_LARGEST, FP8_LARGEST, out=scale)
    scale = FP8_VALUES[fp8_codes(scale, np.empty(scale.shape, np.uint8))]
    scale[scale == 0] = 0.125
    return scale


def mx_exponents(peak: np.ndarray, dtype: Rounding, element_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """MX scales as compressed-tensors computes them: each group's largest magnitude rounded to a power of two
    (down, but up from 1.75 times one: a carry into the exponent), in the weight's own bits; its exponent less
    the element type's largest (2 for FP4, 8 for FP8 E4M3), biased by 127 and clamped to a byte. Returns the
    stored exponents and the scales they mean in the weight's dtype (1 where that underflows; infinite where the
    power overflowed, whose exponent torch stores as 127)."""
    if dtype.name == "float16":
        word, mantissa = peak.astype(np.float16).view(np.uint16).astype(np.int64), 10
    elif dtype.name == "bfloat16":
        word, mantissa = (peak.view(np.uint32) >> 16).astype(np.int64), 7
    else:
        word, mantissa = peak.view(np.uint32).astype(np.int64), 23
    word = (word + (1 << (mantissa - 2))) >> mantissa << mantissa
    if dtype.name == "float16":
        power = word.astype(np.uint16).view(np.float16).astype(np.float32)
    else:
        power = (word << (16 if dtype.name == "bfloat16" else 0)).astype(np.uint32).view(np.float32)
    _, two_to = np.frexp(power)  # (power = 0.5 * 2 ** two_to, exactly: floor(log2(power)) = two_to - 1)
    log2 = np.where(power == 0, -np.inf, np.where(np.isinf(power), np.inf, two_to - 1))
    offset = 2 if element_bits == 4 else 8  # floor(log2(the element type's largest value))
    exponent = np.clip(127 + log2 - offset, 0, 255).astype(np.uint8)
    with np.errstate(over="ignore"):
        scale = dtype(np.ldexp(np.float32(1), exponent.astype(np.int32) - 127).astype(np.float32))
    scale[scale == 0] = 1
    stored = np.where(np.isinf(scale), 127, 127 + np.frexp(scale)[1] - 1).astype(np.uint8)
    return stored, scale


def fp8_codes(values: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float32 values as float8_e4m3fn bytes into `out`: clamped to FP8's range, then rounded to nearest, ties to
    even, as torch casts them; a negative value's sign kept where it rounds to zero, a zero's dropped (as after
    the reference adds its zero point, +0.0, to -0.0).

    From a normal value's bits: its exponent rebased (127 to 7) and three mantissa bits kept, rounded; below
    FP8's smallest normal, 2 ** -6, multiples of 2 ** -9. Both at once: the normal rounding of max(|x|, 2 ** -6),
    plus that of min(|x|, 2 ** -6) to 2 ** -9, less the 8 they share. The latter is rounded by adding 1.5 * 2 ** 23,
    which leaves the integer in the float's low bits: the byte kept is the sum's lowest."""
    shape = values.shape
    magnitude = np.abs(values, out=scratch("fp8 magnitude", shape, np.float32))
    small = np.multiply(magnitude, np.float32(512), out=scratch("fp8 small", shape, np.float32))
    np.clip(small, 0, 8, out=small)  # (np.clip: numpy's minimum and maximum with a number are several times slower)
    small += _ROUNDING_MAGIC
    normal = np.clip(magnitude, _FP8_SMALLEST_NORMAL, FP8_LARGEST, out=magnitude).view(np.int32)
    _round_off(normal, 20, -(((127 - 7) * 8 + 8) << 20))  # (and the exponent rebased)
    normal >>= 20
    normal += small.view(np.int32)
    np.copyto(out, normal, casting="unsafe")  # (the lowest byte)
    negative = np.less(values, 0, out=scratch("fp8 sign", shape, np.bool_)).view(np.uint8)
    negative <<= 7
    out |= negative
    return out


@functools.cache
def _fp8_of_bfloat16() -> np.ndarray:
    """The float8_e4m3fn byte of each bfloat16 value, by its bits (made on first use: fp8_codes on all 65536)."""
    values = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return fp8_codes(values, np.empty(1 << 16, np.uint8))  # (NaNs' bytes: never looked up)


def _fp8_values() -> np.ndarray:
    """float8_e4m3fn's 256 values, by code (float32; NaN for its two NaNs)."""
    code = np.arange(256)
    exponent, mantissa = (code >> 3) & 0xF, code & 7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    magnitude[(code & 0x7F) == 0x7F] = np.nan
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.float32)


FP8_VALUES = _fp8_values()


def fp4_codes_packed(values: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float32 values within FP4's range, rounded to FP4 (E2M1) and packed two to a byte, the first in the low
    nibble: three bits of magnitude code, and the sign (kept for a negative value rounding to zero, as
    compressed-tensors keeps it).

    FP4 holds 0, 0.5, 1, 1.5, 2, 3, 4 and 6, codes 0 to 7; rounding to nearest, ties to even, a magnitude m
    has the code round(2m) up to 4, plus round(m) clamped to 2..4, less 2, plus round(m / 2) clamped to 2..3, less
    2. That is float arithmetic, exact in float32. (No value here is -0.0: the zero point, +0.0, was added.)"""
    shape = values.shape
    code = np.copysign(np.float32(4), values, out=scratch("fp4 code", shape, np.float32))  # the sign's 8, as 4
    magnitude = np.abs(values, out=values)  # less this (the -2s cancel the 4)
    term = scratch("fp4 term", shape, np.float32)
    np.subtract(np.clip(np.rint(np.multiply(magnitude, 2, out=term), out=term), 0, 4, out=term), code, out=code)
    code += np.rint(np.clip(magnitude, 2, 4, out=term), out=term)
    code += np.rint(np.clip(np.multiply(magnitude, 0.5, out=term), 2, 3, out=term), out=term)
    pairs = code.reshape(*shape[:-1], -1, 2)
    np.multiply(pairs[..., 1], 16, out=pairs[..., 1])
    np.add(pairs[..., 0], pairs[..., 1], out=out, casting="unsafe")
    return out


def nibbles_paired(values: np.ndarray, out: np.ndarray) -> np.ndarray:
    """uint8 values below 16 (a last dimension of even length), two to a byte, the first in the low nibble, into
    `out`: each pair taken as one little-endian uint16 (contiguous passes). The values are overwritten."""
    if sys.byteorder != "little":
        raise NotImplementedError(f"packing 4-bit values on a {sys.byteorder}-endian machine")
    pairs = np.ascontiguousarray(values).view(np.uint16)
    packed = np.right_shift(pairs, 4, out=scratch("nibbles", pairs.shape, np.uint16))
    packed &= 0xF0  # (the second value's bits, 8 to 11, now 4 to 7)
    pairs &= 0x0F
    packed |= pairs
    np.copyto(out, packed, casting="unsafe")
    return out


def packed_rows(values: np.ndarray, bits: int, held_in: str = "packed values") -> np.ndarray:
    """int8 values packed into int32 along each row, densely: value i at bits [i*bits, (i+1)*bits) of the row's
    bit stream, little end first, each offset by 2**(bits-1) to be unsigned (compressed-tensors' packing), a row
    padded with zeros to whole int32s. For 8 and 4 bits: one value per byte, or two (the first in the low nibble),
    in the bytes of little-endian int32s. (The values are made unsigned in place; 4-bit ones are packed into this
    thread's scratch array `held_in`.)"""
    if bits not in (4, 8) or sys.byteorder != "little":
        raise NotImplementedError(f"packing {bits}-bit values on a {sys.byteorder}-endian machine")
    per_word = 32 // bits
    rows, cols = values.shape
    unsigned = values.view(np.uint8)
    unsigned += 2 ** (bits - 1)
    if cols % per_word:
        unsigned = np.pad(unsigned, ((0, 0), (0, per_word - cols % per_word)))
    if bits == 4:
        unsigned = nibbles_paired(unsigned, scratch(held_in, (rows, unsigned.shape[1] // 2), np.uint8))
    return np.ascontiguousarray(unsigned).view(np.int32)

"""Quantized Linear weights as compressed-tensors stores them: the checkpoint vLLM serves, written
straight from the shards.

The result is what llm-compressor's data-free path writes (`oneshot` with a `QuantizationModifier` of
a preset scheme, then `save_pretrained(save_compressed=True)`), checked bit for bit in
tests/test_quantize.py with llm-compressor as the oracle: scales from each group's (channel's, block's)
minimum and maximum, round to nearest, the same torch operations in the weight's dtype, so the same
roundings. What differs is the memory: a weight is quantized a band of rows at a time (every scheme
here keeps its groups within rows), so a 70B model needs what its conversion needs.

Schemes are compressed-tensors' presets, written down here as the data its config carries.
"""

from __future__ import annotations

import math
import re
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .. import dtypes
from ..errors import UnshardError
from ..sources.base import thread_buffer

if TYPE_CHECKING:
    import torch

    from ..names.hf_names import LinearLayers
    from ..plan import OutputTensor

# The compressed-tensors release whose output the tests compare with (llm-compressor 0.14.0.1's);
# its config says which release wrote it.
FORMAT_VERSION = "0.19.0"


@dataclass(frozen=True)
class Args:
    """One tensor's quantization, as compressed-tensors' QuantizationArgs says it."""

    num_bits: int
    type: str  # "int" or "float"
    strategy: str  # "group", "tensor_group", "channel", "block" (weights); "token", "group" (dynamic activations)
    symmetric: bool = True
    group_size: int | None = None
    block_structure: tuple[int, int] | None = None
    dynamic: bool = False
    zp_dtype: str | None = None
    scale_dtype: str | None = None  # "torch.uint8": MX, power-of-two scales stored as their biased exponents

    @property
    def mx(self) -> bool:
        return self.scale_dtype == "torch.uint8"

    @property
    def grouped(self) -> bool:
        """Columns in groups, each with its scale (tensor_group: times one scale for the whole tensor)."""
        return self.strategy in ("group", "tensor_group")

    def to_config(self, observer: str | None) -> dict[str, Any]:
        return {"actorder": None, "block_structure": list(self.block_structure) if self.block_structure else None,
                "dynamic": self.dynamic, "group_size": self.group_size, "num_bits": self.num_bits,
                "observer": observer, "observer_kwargs": {}, "scale_dtype": self.scale_dtype, "strategy": self.strategy,
                "symmetric": self.symmetric, "type": self.type, "zp_dtype": self.zp_dtype}


@dataclass(frozen=True)
class Scheme:
    name: str
    format: str  # compressed-tensors' name for how the weights are stored
    weights: Args
    input_activations: Args | None = None  # quantized by the serving engine, per token, as it runs

    def quantization_config(self, ignore: list[str]) -> dict[str, Any]:
        """config.json's `quantization_config`, as compressed-tensors writes it."""
        inputs = self.input_activations.to_config(None) if self.input_activations else None
        group = {"format": self.format, "input_activations": inputs, "output_activations": None,
                 "targets": ["Linear"], "weights": self.weights.to_config("memoryless_minmax")}
        return {"config_groups": {"group_0": group}, "format": self.format, "global_compression_ratio": None,
                "ignore": ignore, "kv_cache_scheme": None, "quant_method": "compressed-tensors",
                "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {},
                "version": FORMAT_VERSION}


def _int_weights(bits: int, symmetric: bool = True) -> Args:
    return Args(bits, "int", "group", symmetric, group_size=128, zp_dtype=None if symmetric else "torch.int8")


def _mx(bits: int, dynamic: bool = False) -> Args:
    """The OCP microscaling formats: floats in groups of 32 sharing a power-of-two scale."""
    return Args(bits, "float", "group", group_size=32, dynamic=dynamic, scale_dtype="torch.uint8")


_TOKEN_INT8 = Args(8, "int", "token", dynamic=True)
_TOKEN_FP8 = Args(8, "float", "token", dynamic=True)
SCHEMES = {scheme.name: scheme for scheme in (
    Scheme("W8A16", "pack-quantized", _int_weights(8)),
    Scheme("W4A16", "pack-quantized", _int_weights(4)),
    Scheme("W4A16_ASYM", "pack-quantized", _int_weights(4, symmetric=False)),
    Scheme("W8A8", "int-quantized", Args(8, "int", "channel"), _TOKEN_INT8),
    Scheme("FP8_DYNAMIC", "float-quantized", Args(8, "float", "channel"), _TOKEN_FP8),
    Scheme("FP8_BLOCK", "float-quantized", Args(8, "float", "block", block_structure=(128, 128)),
           Args(8, "float", "group", group_size=128, dynamic=True)),
    # NVIDIA's FP4: groups of 16 with FP8 scales, under a tensor-wide float32 scale (see GlobalScale)
    Scheme("NVFP4A16", "nvfp4-pack-quantized", Args(4, "float", "tensor_group", group_size=16,
                                                     scale_dtype="torch.float8_e4m3fn")),
    Scheme("MXFP4A16", "mxfp4-pack-quantized", _mx(4)),
    Scheme("MXFP4", "mxfp4-pack-quantized", _mx(4), _mx(4, dynamic=True)),
    Scheme("MXFP8A16", "mxfp8-quantized", _mx(8)),
    Scheme("MXFP8", "mxfp8-quantized", _mx(8), _mx(8, dynamic=True)),
)}
ALIASES = {"INT8": "W8A8"}  # as compressed-tensors names them too

# Left unquantized unless asked otherwise, as llm-compressor's examples leave them: the output head,
# MoE routers (tiny, and routing is sensitive to them), vision towers and their projectors.
DEFAULT_IGNORE = ("lm_head", r"re:.*mlp\.gate$", r"re:.*block_sparse_moe\.gate$", r"re:.*shared_expert_gate$",
                  "re:(model\\.)?visual\\..*", "re:(model\\.)?vision_tower\\..*", "re:(model\\.)?vision_model\\..*",
                  "re:(model\\.)?multi_modal_projector\\..*")

ROUTER = "(a MoE router)"  # why a router no pattern names is left out


def scheme_named(name: str) -> Scheme:
    key = ALIASES.get(name.upper(), name.upper())
    if key not in SCHEMES:
        raise UnshardError(f"--quantize {name}: unknown scheme; known: {', '.join(SCHEMES)} "
                           "(compressed-tensors' preset names)")
    return SCHEMES[key]


def matches(module: str, pattern: str) -> bool:
    """compressed-tensors' rule: a module's name itself, or `re:` and a regular expression matching its start."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return pattern == module


@dataclass
class Quantization:
    """What a scheme does to one model: which Linear weights it encodes, which it leaves and why."""

    scheme: Scheme
    encoded: dict[str, OutputTensor] = field(default_factory=dict)  # output name -> its encoded self
    ignored: dict[str, str] = field(default_factory=dict)  # Linear module left as it is -> the pattern naming it
    patterns: tuple[str, ...] = ()

    def config(self) -> dict[str, Any]:
        return self.scheme.quantization_config(list(self.ignored))  # (in the model's order)


def plan_quantization(scheme_name: str, extra_ignore: tuple[str, ...], outputs: list[OutputTensor],
                      linear: LinearLayers | None, source: str) -> Quantization:
    """Which outputs the scheme quantizes: the weights of the model's Linear layers (each expert of a MoE
    one's too), but those the ignore patterns name, as saved or as transformers holds them, and the MoE
    routers (which compressed-tensors lists as Linear layers left out, and llm-compressor never quantizes).
    Raises if a weight cannot take the scheme, as llm-compressor refuses it, naming the layers and the flag
    that leaves them out."""
    scheme = scheme_named(scheme_name)
    if linear is None:
        raise UnshardError(f"{source}: --quantize needs to know which tensors are Linear layers, and transformers "
                           "could not be asked (not installed, custom code, or no model class for this config); "
                           "install unshard[hf]")
    patterns = DEFAULT_IGNORE + tuple(extra_ignore)
    by_name = {o.name: o for o in outputs}
    quantization = Quantization(scheme, patterns=patterns)
    misfits = []
    for weight in linear.weights:
        module = weight.removesuffix(".weight")
        held_as = linear.held_as.get(weight, weight).removesuffix(".weight")
        pattern = next((p for p in patterns if matches(module, p) or matches(held_as, p)),
                       ROUTER if weight in linear.routers else None)
        if pattern is not None:
            quantization.ignored[module] = pattern
            continue
        output = by_name.get(weight)
        if output is None:  # tied to another tensor and not saved, or missing (--no-check)
            raise UnshardError(f"{source}: --quantize {scheme.name}: the Linear layer {module} is not among the "
                               f"tensors written (tied, or missing); leave it out with --quantize-ignore {module}")
        if not output.dtype.is_floating_point or len(output.shape) != 2:
            raise UnshardError(f"{source}: {weight} is {output.dtype} {list(output.shape)}; --quantize takes 2-D "
                               f"floating-point weights: leave it out with --quantize-ignore {module}")
        misfit = _misfit(scheme, output.shape)
        if misfit:
            misfits.append(f"{module} ({misfit})")
            continue
        quantization.encoded[weight] = replace(output, encoding=QuantizedWeight(scheme, output))
    if misfits:
        raise UnshardError(f"{source}: --quantize {scheme.name} groups a layer's columns by {_group_size(scheme)}, so "
                           f"they must be a multiple of it; not so for {len(misfits)} layer(s): "
                           f"{', '.join(misfits[:4])}{' ...' if len(misfits) > 4 else ''}; leave them unquantized "
                           f"with --quantize-ignore NAME or 're:REGEX' (e.g. {_suggestion(misfits[0])})")
    if scheme.weights.strategy == "tensor_group":
        _share_global_scales(quantization, linear, source)
    return quantization


# Linear layers that vLLM runs as one (q, k and v; gate and up, as Mixtral's w1 and w3), which llm-compressor has
# share one tensor-wide scale (its FUSED_LAYER_NAMES): siblings under one module that has all of the names.
FUSED_SIBLINGS = (("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj"), ("q_a_proj", "kv_a_proj_with_mqa"),
                  ("w1", "w3"))


def _share_global_scales(quantization: Quantization, linear: LinearLayers, source: str) -> None:
    """Give each encoded weight its GlobalScale, one for each set of fused siblings. llm-compressor refuses a set
    of which only some are quantized; so does this."""
    modules = {w.removesuffix(".weight") for w in linear.weights}
    shared: dict[str, GlobalScale] = {}
    for module in sorted(modules):
        parent, _, leaf = module.rpartition(".")
        for names in FUSED_SIBLINGS:
            siblings = [f"{parent}.{n}" if parent else n for n in names]
            if leaf != names[0] or not all(s in modules for s in siblings):
                continue
            left = [s for s in siblings if f"{s}.weight" not in quantization.encoded]
            if left and len(left) < len(siblings):
                raise UnshardError(f"{source}: --quantize {quantization.scheme.name}: {', '.join(siblings)} share one "
                                   f"global scale, as vLLM runs them as one layer, but {', '.join(left)} would be left "
                                   "unquantized; leave out all of them or none (--quantize-ignore)")
            if not left:
                scale = GlobalScale()
                shared.update((f"{s}.weight", scale) for s in siblings)
    for weight, output in quantization.encoded.items():
        output.encoding.global_scale = shared.get(weight) or GlobalScale()


_FP8_LARGEST = 448.0  # float8_e4m3fn's largest value


class GlobalScale:
    """The tensor-wide float32 scale of NVFP4 (tensor_group): 448 * 6 over the largest magnitude of the weight, or
    of its fused siblings together, so that its groups' FP8 scales span FP8's range. So every band of them must be
    seen (`survey`, write/threads.py's first pass) before the first is encoded; then `value` is that scale, computed as
    compressed-tensors computes it, in the weights' dtype."""

    def __init__(self):
        self.peak: torch.Tensor | None = None  # the largest magnitude seen, in the weights' dtype
        self._lock = threading.Lock()  # (siblings are surveyed by different threads)
        self._value: torch.Tensor | None = None

    def survey(self, band: torch.Tensor) -> None:
        import torch

        least, greatest = torch.aminmax(band)  # (whole: no band-sized |band| to make)
        peak = torch.maximum(-least, greatest).reshape(1)
        with self._lock:
            self.peak = peak if self.peak is None else torch.maximum(self.peak, peak)

    def value(self) -> torch.Tensor:
        import torch

        if self._value is None:
            if self.peak is None:
                raise RuntimeError("an NVFP4 weight encoded before its global scale was surveyed")
            peak = torch.clamp(self.peak, min=torch.finfo(self.peak.dtype).tiny)
            scale = _FP8_LARGEST * _FP4_LARGEST / peak  # (in the weights' dtype, as compressed-tensors divides)
            self._value = torch.nan_to_num(scale, nan=1.0, posinf=1.0, neginf=1.0).to(torch.float32)
        return self._value


def _group_size(scheme: Scheme) -> int | None:
    """The columns a layer's weights, or its inputs, are quantized in groups of (FP8_BLOCK: its inputs)."""
    return next((args.group_size for args in (scheme.weights, scheme.input_activations)
                 if args is not None and args.grouped), None)


def _misfit(scheme: Scheme, shape: tuple[int, ...]) -> str | None:
    """Why a weight cannot take the scheme. llm-compressor refuses group-quantized weights whose columns are
    not a multiple of the group; for FP8_BLOCK it writes such a layer, whose inputs compressed-tensors then
    cannot quantize when it runs (transformers fails at the first forward pass), so that is refused too."""
    group = _group_size(scheme)
    if group is not None and shape[1] % group:
        return f"{shape[1]} columns"
    return None


def _suggestion(misfit: str) -> str:
    module = misfit.split(" ")[0]
    return f"'re:.*{re.escape(module.rsplit('.', 1)[-1])}$'"


_SCALE_BAND_ROWS = 8  # asymmetric int4 zero points are packed 8 rows to an int32


class QuantizedWeight:
    """A Linear weight [out, in] as compressed-tensors stores it under the scheme (see Encoding)."""

    def __init__(self, scheme: Scheme, weight: OutputTensor):
        from ..plan import OutputTensor

        self.args, self.format, self.dtype = scheme.weights, scheme.format, weight.dtype
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
            scale_shape = (math.ceil(rows / height), math.ceil(cols / width))
        self.rows_per_band = args.block_structure[0] if args.strategy == "block" else _SCALE_BAND_ROWS
        self.shape = weight.shape
        stored = []
        if self.format == "pack-quantized":
            stored.append(OutputTensor(f"{name}weight_packed", (rows, math.ceil(cols * args.num_bits / 32)), dtypes.BY_NAME["int32"]))
        elif self.format.endswith("fp4-pack-quantized"):  # two values to a byte
            stored.append(OutputTensor(f"{name}weight_packed", (rows, cols // 2), dtypes.BY_NAME["uint8"]))
        else:
            code = "int8" if args.type == "int" else "float8_e4m3fn"
            stored.append(OutputTensor(f"{name}weight", (rows, cols), dtypes.BY_NAME[code]))
        scale_dtype = {"torch.uint8": "uint8", "torch.float8_e4m3fn": "float8_e4m3fn"}.get(args.scale_dtype)
        stored.append(OutputTensor(f"{name}weight_scale", scale_shape, dtypes.BY_NAME[scale_dtype] if scale_dtype
                                   else weight.dtype))
        if args.strategy == "tensor_group":
            stored.append(OutputTensor(f"{name}weight_global_scale", (1,), dtypes.BY_NAME["float32"]))
        if self.format == "pack-quantized":
            stored.append(OutputTensor(f"{name}weight_shape", (2,), dtypes.BY_NAME["int64"]))
            if not args.symmetric:  # packed along the rows, 32 // num_bits rows to an int32
                stored.append(OutputTensor(f"{name}weight_zero_point",
                                           (math.ceil(rows * args.num_bits / 32), scale_shape[1]), dtypes.BY_NAME["int32"]))
        self.stored = tuple(stored)
        self.names = {s.name.rsplit(".", 1)[-1]: s.name for s in stored}

    @property
    def surveys(self) -> bool:
        """Whether every band must be seen (`survey`) before the first is encoded."""
        return self.global_scale is not None

    def survey(self, band: torch.Tensor) -> None:
        self.global_scale.survey(band)

    def encode(self, band: torch.Tensor, start: int) -> dict[str, torch.Tensor]:
        import torch

        args, names = self.args, self.names
        q_min, q_max = _range(args)
        pieces = {}
        if args.strategy == "block":
            values, scale, zero = _quantize_blocks(band, args, q_min, q_max)
        elif args.mx:
            grouped = band.unflatten(-1, (-1, args.group_size))
            scale = _mx_scale(*_least_and_greatest(grouped), args)
            values = _quantize(grouped, scale.unsqueeze(-1), torch.zeros_like(scale).unsqueeze(-1), args, q_min,
                               q_max).flatten(-2)
            scale = (127 + torch.floor(torch.log2(scale)).to(torch.int32)).to(torch.uint8)  # the exponent, biased
        elif args.strategy == "tensor_group":
            grouped = band.unflatten(-1, (-1, args.group_size))
            scale, zero = _scale_and_zero_point(*_least_and_greatest(grouped), args, q_min, q_max,
                                                self.global_scale.value())
            values = _quantize(grouped, (scale / self.global_scale.value()).unsqueeze(-1), zero.unsqueeze(-1), args,
                               q_min, q_max).flatten(-2)
            scale = scale.to(torch.float8_e4m3fn)
            if start == 0:
                pieces[names["weight_global_scale"]] = self.global_scale.value()
        else:
            grouped = band.unflatten(-1, (-1, args.group_size)) if args.strategy == "group" else band.unsqueeze(1)
            scale, zero = _scale_and_zero_point(*_least_and_greatest(grouped), args, q_min, q_max)
            values = _quantize(grouped, scale.unsqueeze(-1), zero.unsqueeze(-1), args, q_min, q_max).flatten(-2)
            scale = scale if args.strategy == "group" else scale.reshape(-1, 1)
        pieces[names["weight_scale"]] = scale
        if self.format.endswith("fp4-pack-quantized"):
            pieces[names["weight_packed"]] = values
        elif self.format == "pack-quantized":
            pieces[names["weight_packed"]] = _pack_rows(values, args.num_bits)
            if start == 0:
                pieces[names["weight_shape"]] = torch.tensor(self.shape, dtype=torch.int64)
            if not args.symmetric:
                pieces[names["weight_zero_point"]] = _pack_rows(zero.t(), args.num_bits, "zero points").t().contiguous()
        else:
            pieces[names["weight"]] = values
        return pieces


def _least_and_greatest(grouped):
    """Each group's least and greatest values (the last dimension's). The same values as torch.aminmax, several
    times faster: on a CPU, aminmax is slower than amin and amax apart, and reducing bf16 slower than float32."""
    import torch

    wide = grouped if grouped.dtype == torch.float32 else _scratch("wide", grouped.shape, torch.float32).copy_(grouped)
    return wide.amin(-1).to(grouped.dtype), wide.amax(-1).to(grouped.dtype)


def _range(args: Args):
    """The quantized values' range, as 0-dimensional float32 tensors (as compressed-tensors makes them: the
    dtype matters, torch promotes a weight's bf16 with them by their kind only)."""
    import torch

    if args.type == "int":
        half = 2.0 ** args.num_bits / 2
        return torch.tensor(-half), torch.tensor(half - 1)
    largest = _FP4_LARGEST if args.num_bits == 4 else torch.finfo(torch.float8_e4m3fn).max
    return torch.tensor(-largest), torch.tensor(largest)


def _scale_and_zero_point(lowest, highest, args: Args, q_min, q_max, global_scale=None):
    """Scales (and zero points) from each group's least and greatest values, in the weight's dtype. Under a global
    scale (NVFP4), a group's scale is that times its own, rounded to FP8 (in float32), then held in the weight's
    dtype (as the module's parameter holds it, exactly)."""
    import torch

    lowest = torch.min(lowest, torch.zeros_like(lowest))  # zero must stay representable
    highest = torch.max(highest, torch.zeros_like(highest))
    span = q_max - q_min
    if args.symmetric:
        scale = torch.max(lowest.abs(), highest.abs()) / (span.to(lowest.dtype) / 2)
        zero = torch.zeros(scale.shape, dtype=lowest.dtype)
    else:
        scale = (highest - lowest) / span.to(highest.dtype)
        zero = torch.clamp(q_min - lowest / scale, q_min, q_max)
    if global_scale is not None:
        scale = (global_scale * scale).clamp(-_FP8_LARGEST, _FP8_LARGEST).to(torch.float8_e4m3fn).float()
        eps = torch.tensor(0.125)  # (compressed-tensors' smallest FP8 scale)
        return torch.where(scale == 0, eps, scale).to(lowest.dtype), zero
    scale = torch.where(scale == 0, torch.tensor(torch.finfo(scale.dtype).eps, dtype=scale.dtype), scale)
    if not args.symmetric:
        zero = torch.round(torch.clamp(zero, -128, 127)).to(torch.int8)
    return scale, zero


def _quantize(x, scale, zero, args: Args, q_min, q_max):
    """x / scale + zero point, clamped to the range, rounded to the integer or fp8 grid, or to fp4's and packed
    two to a byte. In this thread's scratch tensors, in place after the division: a fresh band-sized tensor is
    mapped and page-faulted afresh (execute.return_freed_memory), which costs more than the arithmetic."""
    import torch

    scaled = torch.div(x, scale, out=_scratch("scaled", x.shape, torch.result_type(x, scale)))
    if not (args.symmetric and args.type == "int"):
        # (+0.0 turns a -0.0 into +0.0, as the reference does: fp8 keeps the sign of a zero, an integer does not)
        scaled += zero.to(x.dtype)
    scaled.clamp_(q_min.item(), q_max.item())  # (bounds as numbers: as tensors, clamping takes 20 times as long)
    if args.type == "int":
        return _scratch("values", x.shape, torch.int8).copy_(scaled.round_())
    if args.num_bits == 4:
        return _fp4_packed(scaled)
    return _scratch("values", x.shape, torch.float8_e4m3fn).copy_(scaled)


def _scratch(name: str, shape, dtype):
    """A tensor over this thread's scratch buffer `name` (sources.base.thread_buffer), made once per thread, not
    per band. What it holds lasts until the thread's next band is encoded, by which time the writer has it."""
    import torch

    return torch.from_numpy(thread_buffer(f"encoding {name}", math.prod(shape) * dtype.itemsize)).view(dtype).view(shape)


_FP4_LARGEST = 6.0


def _fp4_packed(scaled):
    """Values already clamped to FP4's range, rounded to FP4 and packed two to a byte, the first in the low
    nibble: three bits of magnitude code, and the sign (kept for a negative value rounding to zero, as
    compressed-tensors keeps it).

    FP4 (E2M1) holds 0, 0.5, 1, 1.5, 2, 3, 4 and 6, codes 0 to 7; rounding to nearest, ties to even, a magnitude m
    has the code round(2m) up to 4, plus round(m) clamped to 2..4, less 2, plus round(m / 2) clamped to 2..3, less
    2. That is float arithmetic, exact in any float dtype, and on a CPU several times as fast as comparing m with
    the seven bounds. (No value here is -0.0: the zero point, +0.0, was added.)"""
    import torch

    code, term = _scratch("code", scaled.shape, scaled.dtype), _scratch("term", scaled.shape, scaled.dtype)
    torch.copysign(torch.tensor(4.0), scaled, out=code)  # the sign's 8, as 4 less this (the -2s cancel the 4)
    magnitude = scaled.abs_()
    torch.sub(torch.mul(magnitude, 2, out=term).round_().clamp_(max=4), code, out=code)
    code += torch.clamp(magnitude, 2, 4, out=term).round_()
    code += torch.mul(magnitude, 0.5, out=term).clamp_(2, 3).round_()
    half = (*scaled.shape[:-1], scaled.shape[-1] // 2)
    pairs = torch.add(code[..., 0::2], code[..., 1::2], alpha=16, out=_scratch("pairs", half, scaled.dtype))
    return _scratch("packed values", half, torch.uint8).copy_(pairs)


def _mx_scale(lowest, highest, args: Args):
    """MX scales as compressed-tensors computes them: each group's largest magnitude rounded to a power of
    two (down, but up from 1.75 times one, a carry into the exponent), its exponent less the element type's
    largest (2 for FP4, 8 for FP8 E4M3), biased by 127 and clamped to a byte; then the scale that exponent
    means, in the weight's dtype (1 where that underflows to 0)."""
    import torch

    dtype = lowest.dtype
    peak = torch.max(torch.min(lowest, torch.zeros_like(lowest)).abs(), torch.max(highest, torch.zeros_like(highest)))
    bits, mantissa = {torch.bfloat16: (torch.int16, 7), torch.float16: (torch.int16, 10),
                      torch.float32: (torch.int32, 23)}[dtype]
    word = peak.view(bits).to(torch.int64)  # (no sign: a magnitude)
    power = ((word + (1 << (mantissa - 2))) >> mantissa << mantissa).to(bits).view(dtype)
    offset = 2 if args.num_bits == 4 else 8  # floor(log2(the element type's largest value))
    exponent = torch.round(torch.clamp(127 + torch.floor(torch.log2(power)) - offset, 0, 255)).to(torch.uint8)
    scale = (2.00 ** (exponent.to(torch.int32) - 127).to(torch.float)).to(dtype)
    return torch.where(scale == 0, torch.tensor(1, dtype=dtype), scale)


def _quantize_blocks(band, args: Args, q_min, q_max):
    """Block strategy: each block of the (zero-padded) weight has one scale."""
    import torch

    height, width = args.block_structure
    rows, cols = band.shape
    padded = torch.nn.functional.pad(band, (0, -cols % width, 0, -rows % height))
    blocks = padded.unflatten(0, (-1, height)).unflatten(-1, (-1, width)).transpose(1, 2)  # [br, bc, h, w]
    flat = blocks.flatten(-2)
    scale, zero = _scale_and_zero_point(*_least_and_greatest(flat), args, q_min, q_max)
    values = _quantize(blocks, scale[..., None, None], zero[..., None, None], args, q_min, q_max)
    values = values.transpose(1, 2).reshape(padded.shape)[:rows, :cols]
    return values.contiguous(), scale, zero


def _pack_rows(values, bits: int, scratch: str = "values"):
    """int8 values packed into int32 along each row, densely: value i at bits [i*bits, (i+1)*bits) of the row's
    bit stream, little end first, each offset by 2**(bits-1) to be unsigned (compressed-tensors' packing).
    For 8 and 4 bits that is one value per byte, or two (the first in the low nibble), in the bytes of
    little-endian int32s. (The values are made unsigned in place: they are the encoder's own; packed 4-bit values
    are held in the thread's `scratch`.)"""
    import torch

    if bits not in (4, 8) or sys.byteorder != "little":
        raise NotImplementedError(f"packing {bits}-bit values on a {sys.byteorder}-endian machine")
    per_word = 32 // bits
    rows, cols = values.shape
    unsigned = values.view(torch.uint8)
    if bits == 8:
        unsigned ^= 0x80
    else:
        unsigned += 8
    if cols % per_word:  # (padded with zeros, as compressed-tensors pads)
        unsigned = torch.nn.functional.pad(unsigned, (0, per_word - cols % per_word))
    if bits == 4:
        unsigned = _nibbles_paired(unsigned, scratch)
    return unsigned.contiguous().view(torch.int32)


def _nibbles_paired(values, scratch: str = "values"):
    """uint8 values below 16 (a last dimension of even length), two to a byte, the first in the low nibble. Done on
    each pair as one little-endian int16 (contiguous passes: four times as fast as taking every other byte); the
    values are overwritten, the result held in the thread's `scratch` (one for each tensor an encoding packs)."""
    import torch

    pairs = values.contiguous().view(-1).view(torch.int16).view(*values.shape[:-1], -1)  # (flat first: a [1, n]
    # tensor may have any first stride)
    packed = torch.bitwise_right_shift(pairs, 4, out=_scratch("nibbles", pairs.shape, torch.int16))
    packed &= 0xF0  # (the second value's bits, 8 to 11, now 4 to 7)
    packed |= pairs.bitwise_and_(0x0F)
    return _scratch(f"packed {scratch}", pairs.shape, torch.uint8).copy_(packed)

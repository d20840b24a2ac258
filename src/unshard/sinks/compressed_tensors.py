"""Quantized Linear weights as compressed-tensors stores them: the checkpoint vLLM serves, written
straight from the shards.

The result is what llm-compressor's data-free path writes (`oneshot` with a `QuantizationModifier` of
a preset scheme, then `save_pretrained(save_compressed=True)`), checked bit for bit in
tests/test_quantize.py with llm-compressor as the oracle: scales from each group's (channel's, block's)
minimum and maximum, round to nearest, each of compressed-tensors' torch operations done in numpy with
the rounding torch gives it (compressed_tensors_encoding.py), so that no torch is imported. What differs is
the memory: a weight is quantized a band of rows at a time (every scheme here keeps its groups within
rows), so a 70B model needs what its conversion needs.

Schemes are compressed-tensors' presets, written down here as the data its config carries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import UnshardError

if TYPE_CHECKING:
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
    from .compressed_tensors_encoding import WEIGHT_DTYPES, QuantizedWeight

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
        if output.dtype.name not in WEIGHT_DTYPES:
            raise UnshardError(f"{source}: {weight} is {output.dtype}; --quantize takes {', '.join(WEIGHT_DTYPES)}"
                               " weights, as llm-compressor's models hold them: convert with --dtype bfloat16")
        misfit = _misfit(scheme, output.shape)
        if misfit:
            misfits.append(f"{module} ({misfit})")
            continue
        quantization.encoded[weight] = replace(output, encoding=QuantizedWeight(scheme, output, source))
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
    from .compressed_tensors_encoding import GlobalScale

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



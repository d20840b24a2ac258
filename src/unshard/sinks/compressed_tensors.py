"""Quantized Linear weights as compressed-tensors stores them: the checkpoint vLLM serves, written
straight from the shards.

The result is what llm-compressor's data-free path writes (`oneshot` with a `QuantizationModifier` of
a preset scheme, then `save_pretrained(save_compressed=True)`), checked bit for bit in
tests/test_quantize.py with llm-compressor as the oracle: scales from each group's (channel's, block's)
minimum and maximum, round to nearest, each of compressed-tensors' torch operations done in numpy with
the rounding torch gives it (compressed_tensors_encoding.py), so that no torch is imported. What differs is
the memory: a weight is quantized a band of rows at a time (every scheme here keeps its groups within
rows), so a 70B model needs what its conversion needs.

The schemes are compressed-tensors' presets (compressed_tensors_schemes.py). As an output format
(CompressedTensorsFolder) it is the Hugging Face folder, with config.json's quantization_config and the
model card's lines for the scheme.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from .. import families
from ..errors import UnshardError
from ..families.parts import DEFAULT_FUSED_SIBLINGS, Unsupported
from ..names.hf_names import read_config
from ..types import FormatRequest, OutputTensor
from ..units import human_bytes
from .compressed_tensors_encoding import WEIGHT_DTYPES, GlobalScale, QuantizedWeight
from .compressed_tensors_experts import LinearizedExperts, expert_name, linearized_experts
from .compressed_tensors_schemes import Scheme, scheme_named
from .hf_folder import HFFolder

SUMMARY_KEY = "quantize"

# Left unquantized unless asked otherwise, as llm-compressor's examples leave them: the output head,
# MoE routers (tiny, and routing is sensitive to them), vision and audio towers and their projectors.
DEFAULT_IGNORE = (
    "lm_head",
    r"re:.*mlp\.gate$",
    r"re:.*block_sparse_moe\.gate$",
    r"re:.*shared_expert_gate$",
    "re:(model\\.)?visual\\..*",
    "re:(model\\.)?vision_tower\\..*",
    "re:(model\\.)?vision_model\\..*",
    "re:(model\\.)?multi_modal_projector\\..*",
    "re:(model\\.)?vision_adapter\\..*",
    "re:(model\\.)?vision_projection$",
    "re:(model\\.)?audio_tower\\..*",
)

ROUTER = "(a MoE router)"  # why a router no pattern names is left out


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
    listed_as: dict[str, str] = field(default_factory=dict)  # module -> its name in the config, where that differs

    def config(self) -> dict[str, Any]:
        # (in the model's order, each module named as compressed-tensors lists it: LinearLayers.listed_as)
        return self.scheme.quantization_config([self.listed_as.get(m, m) for m in self.ignored])

    @property
    def weights(self) -> int:
        """The Linear weights quantized: a fused expert tensor's, each expert's projections."""
        return sum(
            o.encoding.weights if isinstance(o.encoding, LinearizedExperts) else 1 for o in self.encoded.values()
        )


def plan_sink(request: FormatRequest) -> CompressedTensorsFolder:
    """--quantize: the folder with its Linear weights' outputs given their encodings (`linear`: hf_names'
    LinearLayers, or None where transformers could not be asked)."""
    outputs = [o for g in request.groups.values() for o in g.outputs]
    options, family = request.options, families.by_model_type(request.model_type)
    siblings = DEFAULT_FUSED_SIBLINGS if family is None else family.fused_siblings
    if isinstance(siblings, Unsupported):
        raise UnshardError(f"{request.where}: --quantize: {family.name}: {siblings.reason}")
    quantization = plan_quantization(
        options.quantize, options.quantize_ignore, outputs, request.linear, request.where, siblings
    )
    if family is not None and family.linearized is not None:
        hparams = {**(read_config(request.config_folder) or {}), **request.config_updates}
        hparams.update(hparams.get("text_config") or {})  # (a vision-language model's experts: its text model's)
        _linearize(quantization, outputs, partial(family.linearized, hparams=hparams, where=request.where))
    for group in request.groups.values():
        group.outputs = [quantization.encoded.get(o.name, o) for o in group.outputs]
    return CompressedTensorsFolder(quantization)


class CompressedTensorsFolder(HFFolder):
    """The Hugging Face folder of a quantized model: its config says the scheme, its card the layers left out."""

    def __init__(self, quantization: Quantization):
        self.quantization = quantization

    def config_updates(self) -> dict[str, Any]:
        return {"quantization_config": self.quantization.config()}

    def summary(self) -> dict[str, Any]:
        q = self.quantization
        return {
            SUMMARY_KEY: {
                "scheme": q.scheme.name,
                "format": q.scheme.format,
                "quantized": q.weights,
                "ignored": q.ignored,
                "bytes_as_is": sum(o.nbytes_as_is for o in q.encoded.values()),
                "surveyed": sum(o.encoding.surveys for o in q.encoded.values()),
            }
        }

    def card(self) -> tuple[list[str], list[str]]:
        scheme, q = self.quantization.scheme, self.quantization
        line = (
            f"- quantized: {scheme.name} (compressed-tensors `{scheme.format}`, round to nearest, no calibration "
            f"data), {q.weights} Linear weights; left as they are: "
            + (", ".join(f"`{m}`" for m in q.ignored) or "none")
        )
        return ["compressed-tensors", scheme.name.lower()], [line]


def summary_lines(quantize: dict[str, Any]) -> list[str]:
    """inspect's lines for a summary's `quantize`."""
    lines = [
        f"quantize     {quantize['scheme']} (compressed-tensors {quantize['format']}): {quantize['quantized']} Linear "
        f"weights, {human_bytes(quantize['bytes_as_is'])} unquantized; other tensors as they are"
    ]
    if quantize.get("surveyed"):
        lines.append(
            "  read twice: a first pass finds each weight's largest magnitude (its global scale, shared by fused "
            "siblings) before any is written"
        )
    by_pattern: dict[str, list[str]] = {}
    for module, pattern in quantize["ignored"].items():
        by_pattern.setdefault(pattern, []).append(module)
    for pattern, modules in by_pattern.items():
        why = "that are MoE routers" if pattern == ROUTER else f"matching {pattern}"
        lines.append(f"  left as they are: {len(modules)} Linear layer(s) {why} (e.g. {modules[0]})")
    return lines


def plan_quantization(
    scheme_name: str,
    extra_ignore: tuple[str, ...],
    outputs: list[OutputTensor],
    linear,
    source: str,
    fused_siblings: tuple[tuple[str, ...], ...],
) -> Quantization:
    """Which outputs the scheme quantizes: the weights of the model's Linear layers (each expert of a MoE
    one's too), but those the ignore patterns name, as saved or as transformers holds them, and the MoE
    routers (which compressed-tensors lists as Linear layers left out, and llm-compressor never quantizes).
    Raises if a weight cannot take the scheme, as llm-compressor refuses it, naming the layers and the flag
    that leaves them out."""
    scheme = scheme_named(scheme_name)
    if linear is None:
        raise UnshardError(
            f"{source}: --quantize needs to know which tensors are Linear layers, and transformers "
            "could not be asked (not installed, custom code, or no model class for this config); "
            "install unshard[hf]"
        )
    patterns = DEFAULT_IGNORE + tuple(extra_ignore)
    by_name = {o.name: o for o in outputs}
    listed_as = {w.removesuffix(".weight"): m for w, m in linear.listed_as.items()}
    quantization = Quantization(scheme, patterns=patterns, listed_as=listed_as)
    misfits = []
    for weight in linear.weights:
        module = weight.removesuffix(".weight")
        held_as = linear.held_as.get(weight, weight).removesuffix(".weight")
        pattern = next(
            (p for p in patterns if matches(module, p) or matches(held_as, p)),
            ROUTER if weight in linear.routers else None,
        )
        if pattern is not None:
            quantization.ignored[module] = pattern
            continue
        output = by_name.get(weight)
        if output is None:  # tied to another tensor and not saved, or missing (--no-check)
            raise UnshardError(
                f"{source}: --quantize {scheme.name}: the Linear layer {module} is not among the "
                f"tensors written (tied, or missing); leave it out with --quantize-ignore {module}"
            )
        if not output.dtype.is_floating_point or len(output.shape) != 2:
            raise UnshardError(
                f"{source}: {weight} is {output.dtype} {list(output.shape)}; --quantize takes 2-D "
                f"floating-point weights: leave it out with --quantize-ignore {module}"
            )
        _check_dtype(output, source)
        misfit = _misfit(scheme, output.shape)
        if misfit:
            misfits.append(f"{module} ({misfit})")
            continue
        quantization.encoded[weight] = replace(output, encoding=QuantizedWeight(scheme, output, source))
    if misfits:
        raise UnshardError(
            f"{source}: --quantize {scheme.name} groups a layer's columns by {_group_size(scheme)}, so "
            f"they must be a multiple of it; not so for {len(misfits)} layer(s): "
            f"{', '.join(misfits[:4])}{' ...' if len(misfits) > 4 else ''}; leave them unquantized "
            f"with --quantize-ignore NAME or 're:REGEX' (e.g. {_suggestion(misfits[0])})"
        )
    if scheme.weights.strategy == "tensor_group":
        _share_global_scales(quantization, linear, source, fused_siblings)
    return quantization


def _check_dtype(output: OutputTensor, source: str) -> None:
    if output.dtype.name not in WEIGHT_DTYPES:
        raise UnshardError(
            f"{source}: {output.name} is {output.dtype}; --quantize takes {', '.join(WEIGHT_DTYPES)}"
            " weights, as llm-compressor's models hold them: convert with --dtype bfloat16"
        )


def _linearize(quantization: Quantization, outputs: list[OutputTensor], linearized) -> None:
    """The family's fused experts, each expert's projections Linear layers as llm-compressor makes them
    (compressed_tensors_experts.py), quantized but those the ignore patterns name."""
    scheme, source = quantization.scheme, linearized.keywords["where"]
    left: dict[str, str] = {}
    fused_of: dict[str, str] = {}  # (an expert's module left as it is -> the output it is made from)

    def ignored(module: str) -> str | None:
        return next((p for p in quantization.patterns if matches(module, p)), None)

    for output in outputs:
        how = linearized(output.name, output.shape)
        if how is None:
            continue
        _check_dtype(output, source)
        for stack, shape in how.tensors.items():
            misfit = _misfit(scheme, shape[1:]) if stack.endswith(".weight") else None
            if misfit and not ignored(expert_name(stack, 0).removesuffix(".weight")):
                module = expert_name(stack, 0).removesuffix(".weight")
                raise UnshardError(
                    f"{source}: --quantize {scheme.name} groups a layer's columns by {_group_size(scheme)}, so they "
                    f"must be a multiple of it; not so for the experts' {module} ({misfit}); leave them unquantized "
                    f"with --quantize-ignore 're:.*experts\\.\\d+\\.{stack.rsplit('.', 2)[-2]}$'"
                )
        encoding, experts_left = linearized_experts(scheme, output, how, ignored, source)
        quantization.encoded[output.name] = replace(output, encoding=encoding)
        left.update(experts_left)
        fused_of.update(dict.fromkeys(experts_left, output.name))
    if left:  # (the config lists the modules left in the model's order, as its tensors come: experts among them)
        position = {o.name: i for i, o in enumerate(outputs)}
        quantization.ignored = dict(
            sorted(
                {**quantization.ignored, **left}.items(),
                key=lambda item: position.get(fused_of.get(item[0], f"{item[0]}.weight"), len(outputs)),
            )
        )


def _share_global_scales(
    quantization: Quantization, linear, source: str, fused_siblings: tuple[tuple[str, ...], ...]
) -> None:
    """Give each encoded weight its GlobalScale, one for each set of fused siblings (the Linear layers vLLM runs as
    one: the family's, families/): siblings under one module that has all of the names. llm-compressor refuses a
    set of which only some are quantized; so does this."""
    modules = {w.removesuffix(".weight") for w in linear.weights}
    shared: dict[str, GlobalScale] = {}
    for module in sorted(modules):
        parent, _, leaf = module.rpartition(".")
        for names in fused_siblings:
            siblings = [f"{parent}.{n}" if parent else n for n in names]
            if leaf != names[0] or not all(s in modules for s in siblings):
                continue
            left = [s for s in siblings if f"{s}.weight" not in quantization.encoded]
            if left and len(left) < len(siblings):
                raise UnshardError(
                    f"{source}: --quantize {quantization.scheme.name}: {', '.join(siblings)} share one "
                    f"global scale, as vLLM runs them as one layer, but {', '.join(left)} would be left "
                    "unquantized; leave out all of them or none (--quantize-ignore)"
                )
            if not left:
                scale = GlobalScale()
                shared.update((f"{s}.weight", scale) for s in siblings)
    for weight, output in quantization.encoded.items():
        output.encoding.global_scale = shared.get(weight) or GlobalScale()


def _group_size(scheme: Scheme) -> int | None:
    """The columns a layer's weights, or its inputs, are quantized in groups of (FP8_BLOCK: its inputs)."""
    return next(
        (args.group_size for args in (scheme.weights, scheme.input_activations) if args is not None and args.grouped),
        None,
    )


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

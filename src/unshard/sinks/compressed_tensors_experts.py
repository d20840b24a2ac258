"""--quantize for a family whose experts transformers keeps fused on disk (gpt-oss's `experts.gate_up_proj`, experts x
hidden x 2 intermediate): llm-compressor makes each expert's projections Linear layers before quantizing
(linearize_moe), and writes them so, `experts.E.gate_proj.weight` and its scales, one expert after the other. Here
the fused tensor is one output whose encoding cuts each band of whole experts into its Linear layers (the family's
Rearrangement: families/<family>.py `linearized`) and quantizes each as a Linear weight (QuantizedWeight), so the
experts stream one band at a time, as every weight does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UnshardError
from ..types import OutputTensor
from .compressed_tensors_encoding import GlobalScale, QuantizedWeight

if TYPE_CHECKING:
    import numpy as np

    from ..families.parts import Rearrangement
    from .compressed_tensors_schemes import Scheme


def expert_name(stack: str, expert: int) -> str:
    """An expert's tensor in a stack's name: `...experts.gate_proj.weight` -> `...experts.3.gate_proj.weight`."""
    base, leaf = stack.rsplit(".experts.", 1)
    return f"{base}.experts.{expert}.{leaf}"


@dataclass(frozen=True)
class LinearizedExperts:
    """A fused expert tensor as llm-compressor writes it (a types.Encoding): for each of its stacks (the family's
    Rearrangement) each expert's tensor, quantized as a Linear weight where `quantized[stack]` says so (its
    QuantizedWeight per expert), else as it is. Bands hold whole experts (the fused tensor's first axis)."""

    stored: tuple[OutputTensor, ...]
    how: Rearrangement
    quantized: dict[str, tuple[QuantizedWeight, ...]]  # stack -> each expert's encoding (none: written as it is)
    rows_per_band: int = 1

    @property
    def surveys(self) -> bool:
        return any(encoding.surveys for encodings in self.quantized.values() for encoding in encodings)

    def survey(self, band: np.ndarray, start: int) -> None:
        """NVFP4: each expert's weights shown to its global scale before any is encoded."""
        import numpy as np

        for stack, experts in zip(self.how.tensors, self.how.pieces(band)):
            for offset, values in enumerate(experts if stack in self.quantized else ()):
                self.quantized[stack][start + offset].survey(np.ascontiguousarray(values))

    def encode(self, band: np.ndarray, start: int) -> dict[str, np.ndarray]:
        import numpy as np

        pieces = {}
        for stack, experts in zip(self.how.tensors, self.how.pieces(band)):
            for offset, values in enumerate(experts):
                expert = start + offset
                if stack not in self.quantized:
                    pieces[expert_name(stack, expert)] = np.ascontiguousarray(values)
                    continue
                encoding = self.quantized[stack][expert]  # (each expert's weight whole: its first and only band)
                made = encoding.encode(np.ascontiguousarray(values), 0)
                pieces.update((name, piece.copy()) for name, piece in made.items())  # (out of the thread's scratch)
        return pieces


def linearized_experts(scheme: Scheme, output: OutputTensor, how: Rearrangement, ignored, source: str):
    """The output's LinearizedExperts: each weight stack's experts quantized, but those `ignored(module)` names (the
    pattern naming it, or None); (the encoding, {module left as it is: pattern}). Under NVFP4 the Linear layers one
    fused tensor makes of an expert (gpt-oss's gate and up) share its global scale, as vLLM runs them as one layer and
    llm-compressor scales them."""
    stored, quantized, left = [], {}, {}
    for stack, shape in how.tensors.items():
        experts, *each = shape
        names = [expert_name(stack, e) for e in range(experts)]
        patterns = [ignored(name.removesuffix(".weight")) for name in names] if stack.endswith(".weight") else []
        if not stack.endswith(".weight") or any(patterns):
            left.update((name.removesuffix(".weight"), p) for name, p in zip(names, patterns) if p)
            stored.extend(OutputTensor(name, tuple(each), output.dtype) for name in names)
            continue
        quantized[stack] = tuple(
            QuantizedWeight(scheme, OutputTensor(name, tuple(each), output.dtype), source) for name in names
        )
        stored.extend(s for encoding in quantized[stack] for s in encoding.stored)
    if scheme.weights.strategy == "tensor_group":
        weights = [stack for stack in how.tensors if stack.endswith(".weight")]
        if quantized and len(quantized) < len(weights):
            raise UnshardError(
                f"{source}: --quantize {scheme.name}: {', '.join(weights)} of each expert share one global scale, as "
                "vLLM runs them as one layer, but some would be left unquantized; leave out all of them or none "
                "(--quantize-ignore)"
            )
        for encodings in zip(*quantized.values()):
            shared = GlobalScale()
            for encoding in encodings:
                encoding.global_scale = shared
    return LinearizedExperts(tuple(stored), how, quantized), left

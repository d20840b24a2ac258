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
    Rearrangement) each expert's tensor, quantized as a Linear weight where `quantized[stack]` has its
    QuantizedWeight, else as it is (a bias, an expert the ignore patterns name). Bands hold whole experts (the fused
    tensor's first axis)."""

    stored: tuple[OutputTensor, ...]
    how: Rearrangement
    quantized: dict[str, tuple[QuantizedWeight | None, ...]]  # weight stack -> each expert's encoding, or None
    rows_per_band: int = 1

    @property
    def weights(self) -> int:
        """The Linear weights it quantizes."""
        return sum(e is not None for encodings in self.quantized.values() for e in encodings)

    @property
    def surveys(self) -> bool:
        return any(e is not None and e.surveys for encodings in self.quantized.values() for e in encodings)

    def survey(self, band: np.ndarray, start: int) -> None:
        """NVFP4: each expert's weights shown to its global scale before any is encoded."""
        import numpy as np

        for _, encoding, values in self._experts(band, start):
            if encoding is not None:
                encoding.survey(np.ascontiguousarray(values))

    def encode(self, band: np.ndarray, start: int) -> dict[str, np.ndarray]:
        import numpy as np

        pieces = {}
        for name, encoding, values in self._experts(band, start):
            if encoding is None:
                pieces[name] = np.ascontiguousarray(values)
                continue
            made = encoding.encode(np.ascontiguousarray(values), 0)  # (an expert's weight whole: its only band)
            pieces.update((stored, piece.copy()) for stored, piece in made.items())  # (out of the thread's scratch)
        return pieces

    def _experts(self, band: np.ndarray, start: int):
        """(each expert's tensor, its encoding or None, its values) of the band's experts, stack by stack."""
        for stack, experts in zip(self.how.tensors, self.how.pieces(band)):
            encodings = self.quantized.get(stack)
            for offset, values in enumerate(experts):
                expert = start + offset
                yield expert_name(stack, expert), (encodings[expert] if encodings else None), values


def linearized_experts(scheme: Scheme, output: OutputTensor, how: Rearrangement, ignored, source: str):
    """The output's LinearizedExperts: each weight stack's experts quantized, but those `ignored(module)` names (the
    pattern naming it, or None); (the encoding, {module left as it is: pattern}). Under NVFP4 the Linear layers one
    fused tensor makes of an expert (gpt-oss's gate and up) share its global scale, as vLLM runs them as one layer and
    llm-compressor scales them."""
    stored, quantized, left = [], {}, {}
    for stack, shape in how.tensors.items():
        experts, *each = shape
        tensors = [OutputTensor(expert_name(stack, e), tuple(each), output.dtype) for e in range(experts)]
        if not stack.endswith(".weight"):  # (a bias: as it is)
            stored.extend(tensors)
            continue
        encodings = []
        for tensor in tensors:
            module = tensor.name.removesuffix(".weight")
            pattern = ignored(module)
            if pattern:
                left[module] = pattern
            encodings.append(None if pattern else QuantizedWeight(scheme, tensor, source))
            stored.extend([tensor] if pattern else encodings[-1].stored)
        quantized[stack] = tuple(encodings)
    if scheme.weights.strategy == "tensor_group":
        for expert, encodings in enumerate(zip(*quantized.values())):
            if any(e is None for e in encodings) and any(e is not None for e in encodings):
                raise UnshardError(
                    f"{source}: --quantize {scheme.name}: {', '.join(quantized)} of each expert share one global "
                    f"scale, as vLLM runs them as one layer, but expert {expert}'s would be left unquantized in part; "
                    "leave out all of them or none (--quantize-ignore)"
                )
            shared = GlobalScale()
            for encoding in encodings:
                if encoding is not None:
                    encoding.global_scale = shared
    return LinearizedExperts(tuple(stored), how, quantized), left

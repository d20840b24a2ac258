"""A kind of rule the name tables share (a family's Megatron and torchtitan tables): a trainer's tensor that is one
expert, or the experts, of a tensor transformers keeps whole per layer, turned as transformers holds it (and turned
back, where unshard writes the trainer's tensors)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stacked:
    """The trainer's tensor of an expert (Megatron: `experts.{e}.linear_fc1.weight`), or of every expert stacked on a
    first axis (torchtitan's grouped experts), as rows of one transformers tensor that stacks a layer's experts
    (gpt-oss's fused experts): each expert turned as transformers holds it. interleaved: fc1's [gate; up] rows
    alternate (gate 0, up 0, gate 1, ...); transposed: the last two axes swap (transformers' experts multiply from the
    left)."""

    name: str
    transposed: bool = False
    interleaved: bool = False

    def shape(self, experts: int, expert: tuple[int, ...]) -> tuple[int, ...]:
        turned = (*expert[:-2], expert[-1], expert[-2]) if self.transposed else expert
        return (experts, *turned)

    def band(self, experts):
        """Rows (experts) of the transformers tensor from a torch tensor of the trainer's experts, stacked."""
        if self.interleaved:
            experts = experts.unflatten(1, (2, experts.shape[1] // 2)).transpose(1, 2).flatten(1, 2)
        if self.transposed:
            experts = experts.transpose(-1, -2)
        return experts.contiguous()

    def expert(self, turned: tuple[int, ...]) -> tuple[int, ...]:
        """The trainer's shape of one expert, from its shape as a row of the transformers tensor."""
        return (*turned[:-2], turned[-1], turned[-2]) if self.transposed else turned

    def unturned(self, rows):
        """The other way (writing the trainer's tensors): rows (experts) of the transformers tensor, as numpy, turned
        back into the trainer's experts, stacked."""
        import numpy as np

        if self.transposed:
            rows = rows.swapaxes(-1, -2)
        if self.interleaved:  # (gate 0, up 0, gate 1, ... -> gate rows, then up rows)
            rows = rows.reshape(rows.shape[0], -1, 2, *rows.shape[2:]).swapaxes(1, 2).reshape(rows.shape)
        return np.ascontiguousarray(rows)

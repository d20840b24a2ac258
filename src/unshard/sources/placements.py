"""Where each rank's local shard sits inside the whole tensor, and putting the shards back together.

Pure index algebra on plain numbers: no process group, no torch.distributed objects. A shard is
described as a list of `Block`s, each a rectangular box copied from the local tensor into the
global one. Most placements give one block per shard; `_StridedShard` (FSDP2 over tensor
parallelism) gives several, because each rank holds a slice of every tensor-parallel piece.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Runs = list[tuple[int, int]]  # (global start, length) along one dimension, in local order


@dataclass(frozen=True)
class Block:
    """Copy `local[local_offsets : +sizes]` into `global[global_offsets : +sizes]`."""

    local_offsets: tuple[int, ...]
    global_offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @classmethod
    def placed(cls, offsets: Sequence[int], sizes: Sequence[int]) -> Block:
        """A whole local tensor that sits at `offsets` in the global one."""
        return cls((0,) * len(sizes), tuple(offsets), tuple(sizes))

    @classmethod
    def whole(cls, shape: Sequence[int]) -> Block:
        """The block of a tensor held entirely by one piece."""
        return cls.placed((0,) * len(shape), shape)


@dataclass(frozen=True)
class ShardSpec:
    """A placement, reduced to what the algebra needs: kind is "shard", "strided" or "replicate"."""

    kind: str
    dim: int = 0
    split_factor: int = 1


def _chunk(length: int, parts: int, index: int) -> tuple[int, int]:
    """(start, stop) of piece `index` when torch.chunk splits `length` items into `parts`."""
    size = -(-length // parts) if length else 0
    start = min(index * size, length)
    return start, min(start + size, length)


def _take(runs: Runs, start: int, stop: int) -> Runs:
    """The items [start, stop) of the concatenation of `runs`, as runs again."""
    taken, position = [], 0
    for run_start, length in runs:
        lo, hi = max(start, position), min(stop, position + length)
        if lo < hi:
            taken.append((run_start + lo - position, hi - lo))
        position += length
    return taken


def _total(runs: Runs) -> int:
    return sum(length for _, length in runs)


def local_runs(
    global_shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[ShardSpec], coordinate: Sequence[int]
) -> list[Runs]:
    """Per tensor dimension, the global index runs a rank holds, applying placements left to right."""
    runs: list[Runs] = [[(0, n)] for n in global_shape]
    for mesh_size, placement, index in zip(mesh_shape, placements, coordinate):
        if placement.kind == "replicate":
            continue
        dim_runs = runs[placement.dim]
        if placement.kind == "shard":
            runs[placement.dim] = _take(dim_runs, *_chunk(_total(dim_runs), mesh_size, index))
        elif placement.kind == "strided":
            # The dimension was first cut into `split_factor` pieces by a later mesh dimension (TP);
            # this mesh dimension then takes its chunk of every one of those pieces.
            total, taken = _total(dim_runs), []
            for piece in range(placement.split_factor):
                piece_start, piece_stop = _chunk(total, placement.split_factor, piece)
                lo, hi = _chunk(piece_stop - piece_start, mesh_size, index)
                taken += _take(dim_runs, piece_start + lo, piece_start + hi)
            runs[placement.dim] = taken
        else:
            raise ValueError(f"unsupported placement {placement.kind!r}")
    return runs


def blocks_from_runs(runs: list[Runs]) -> list[Block]:
    """The rectangular boxes of a shard whose dimensions hold `runs`."""
    per_dim = []
    for dim_runs in runs:
        local, pairs = 0, []
        for start, length in dim_runs:
            if length:
                pairs.append((local, start, length))
            local += length
        per_dim.append(pairs)
    return [
        Block(tuple(p[0] for p in combo), tuple(p[1] for p in combo), tuple(p[2] for p in combo))
        for combo in itertools.product(*per_dim)
    ]


def runs_shape(runs: list[Runs]) -> tuple[int, ...]:
    return tuple(_total(r) for r in runs)


def box(offsets: Sequence[int], sizes: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(offsets, sizes))


def assemble(
    shape: Sequence[int],
    dtype: torch.dtype,
    pieces: Sequence[tuple[Block, Callable[[], torch.Tensor]]],
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Build the whole tensor from (block, loader of the local tensor) pairs.

    A one-dimensional block of a tensor with more dimensions addresses its flattened elements,
    as flat partitions (DeepSpeed ZeRO) hold them.
    """
    import torch  # (imported already by whoever loads the pieces)

    whole = torch.empty(tuple(shape), dtype=dtype) if out is None else out
    flat = whole.view(-1)
    for block, load in pieces:
        target = flat if len(block.sizes) == 1 and whole.dim() != 1 else whole
        target[box(block.global_offsets, block.sizes)].copy_(load()[box(block.local_offsets, block.sizes)])
    return whole


def compose(piece: Block, rule: Block) -> Block | None:
    """Chain two copies: `piece` puts part of a local tensor into tensor M, `rule` puts part of M into
    tensor H. The result puts what both touch straight from the local tensor into H (None if nothing)."""
    lo = [max(p, r) for p, r in zip(piece.global_offsets, rule.local_offsets)]
    hi = [
        min(p + ps, r + rs) for p, ps, r, rs in zip(piece.global_offsets, piece.sizes, rule.local_offsets, rule.sizes)
    ]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return Block(
        tuple(pl + l - pg for pl, l, pg in zip(piece.local_offsets, lo, piece.global_offsets)),
        tuple(rg + l - rl for rg, l, rl in zip(rule.global_offsets, lo, rule.local_offsets)),
        tuple(h - l for l, h in zip(lo, hi)),
    )

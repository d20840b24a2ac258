"""Quantized safetensors folders as sources: each quantized weight is read dequantized, a band of rows at a time, as
the format's own code computes it, so that the rest of unshard sees the model a full-precision release holds.

The formats (block FP8 releases in `fp8_blocks`, compressed-tensors checkpoints in `compressed_tensors`) each say,
per weight, which stored tensors it is made of and how a band of its rows is computed from theirs (a `Dequantizer`);
this module reads the stored rows and does the banding, once for both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..dtypes import DType
from ..types import REMOVED
from .base import Piece, SourceTensor
from .dcp_safetensors import SafetensorsFiles
from .placements import Block

if TYPE_CHECKING:
    import torch

# stored tensor, first row, row after the last -> those rows, as a tensor of the stored dtype
StoredRows = Callable[[SourceTensor, int, int], "torch.Tensor"]


@dataclass
class Dequantizer:
    """One quantized weight: its full-precision shape and dtype, the stored tensors it is made of, and how a band
    of its rows is computed (`rows`). A band starts at a multiple of `row_multiple` rows (a block of rows sharing a
    scale, zero points packed several rows to a word)."""

    shape: tuple[int, ...]
    dtype: DType
    stored: tuple[SourceTensor, ...]
    row_multiple: int
    rows: Callable[[StoredRows, int, int], torch.Tensor]


class DequantizedFolder(SafetensorsFiles):
    """A safetensors folder whose quantized weights (`weights`, by the full-precision name) are read dequantized."""

    weights: dict[str, Dequantizer]

    def flat_pieces(self, name: str):
        return None if name in self.weights else super().flat_pieces(name)

    def band_rows(self, name: str) -> int | None:
        if name not in self.weights:
            return super().band_rows(name)
        weight = self.weights[name]
        per_row = max(1, math.prod(weight.shape[1:]) * 4)  # (computed in float32 at most)
        rows = self.BAND_BYTES // per_row // weight.row_multiple * weight.row_multiple
        return max(weight.row_multiple, min(rows, weight.shape[0]))

    def reads_rows(self, name: str) -> bool:
        return name in self.weights or super().reads_rows(name)

    def read_rows_as_bytes(self, name: str, start: int, stop: int, out=None):
        return None if name in self.weights else super().read_rows_as_bytes(name, start, stop, out)

    def read_rows(self, name: str, start: int, stop: int, local) -> torch.Tensor:
        if name not in self.weights:
            return super().read_rows(name, start, stop, local)
        return self.weights[name].rows(self.stored_rows, start, stop)

    def read(self, name: str) -> torch.Tensor:
        if name not in self.weights:
            return super().read(name)
        return self.weights[name].rows(self.stored_rows, 0, self.weights[name].shape[0])

    @staticmethod
    def stored_rows(tensor: SourceTensor, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a stored tensor (all of a 0- or 1-dimensional one), only those read."""
        from safetensors import safe_open

        piece = tensor.pieces[0]
        with safe_open(piece.file, framework="pt") as f:
            stored = f.get_slice(piece.key)
            return stored[start:stop] if len(tensor.shape) > 1 else stored[:]


def dequantized(
    checkpoint: SafetensorsFiles, weights: dict[str, Dequantizer], left_out: set[str], what: str
) -> DequantizedFolder:
    """The checkpoint with `weights` read dequantized in place of the tensors they are stored as, the tensors
    `left_out` (scales and the like) not listed, and config.json's quantization_config removed."""
    consumed = {tensor.name for weight in weights.values() for tensor in weight.stored} | left_out
    tensors: dict[str, Any] = {name: t for name, t in checkpoint.tensors.items() if name not in consumed}
    for name, weight in weights.items():
        stored = weight.stored[0].pieces[0]  # (where the weight's bytes are: the file it is listed in)
        tensors[name] = SourceTensor(
            name, weight.shape, weight.dtype, [Piece(stored.file, stored.key, Block.whole(weight.shape))]
        )
    folder = DequantizedFolder(
        layout=checkpoint.layout,
        path=checkpoint.path,
        tensors=tensors,
        hf_folder=checkpoint.hf_folder,
        facts={**checkpoint.facts, "dequantized": what},
        config_changes={"quantization_config": REMOVED},
    )
    folder.weights = weights
    return folder

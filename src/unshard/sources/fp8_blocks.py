"""Block-FP8 checkpoints as sources: DeepSeek-V3/R1's, Kimi K2's and Qwen3's FP8 releases, whose Linear weights are
float8_e4m3fn with a float32 `weight_scale_inv` per block of 128 x 128 (config.json's `quantization_config`:
`quant_method: fp8`, `weight_block_size`). Each such weight is read dequantized, as DeepSeek's own `weight_dequant`
computes it (its `fp8_cast_bf16.py`): every element times its block's scale in float32, stored in bfloat16. A band
of whole blocks of rows at a time, so memory follows the band, not the tensor; the scales are not written, and
the output's config.json has no quantization_config: what a bf16 release of the model holds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from .. import dtypes
from ..errors import CheckpointError
from .base import SourceTensor
from .dcp_safetensors import SafetensorsFiles
from .dequantized import DequantizedFolder, Dequantizer, StoredRows
from .dequantized import dequantized as dequantized_folder

if TYPE_CHECKING:
    import torch

SCALE = ".weight_scale_inv"
DEQUANTIZED = dtypes.BY_NAME["bfloat16"]  # (what DeepSeek's weight_dequant writes: torch's default dtype there)


def block_size(quantization: dict, config: Path) -> tuple[int, int]:
    """The (rows, columns) of a block quantization_config (`quant_method: fp8`) names."""
    size = quantization.get("weight_block_size")
    if not (isinstance(size, list) and len(size) == 2 and all(type(n) is int and n > 0 for n in size)):
        raise CheckpointError(
            f"{config}: quantization_config's weight_block_size is {size!r}, not two positive "
            "numbers (rows, columns) of a block; restore the model's config.json"
        )
    return size[0], size[1]


def _rows(weight: SourceTensor, scale: SourceTensor, block: tuple[int, int]):
    """How rows [start, stop) of a weight are computed: its FP8 rows, each element times its block's scale in
    float32, rounded to bfloat16 (DeepSeek's weight_dequant)."""

    def rows(stored: StoredRows, start: int, stop: int) -> torch.Tensor:
        import torch

        first, last = start // block[0], -(-stop // block[0])
        values = stored(weight, start, stop).float()
        per_row = stored(scale, first, last).float()[torch.arange(start, stop) // block[0] - first]  # (rows, blocks)
        columns = values.shape[1]
        if columns % block[1] == 0:  # each block's scale broadcast over its columns, in place
            values.view(len(values), columns // block[1], block[1]).mul_(per_row.unsqueeze(-1))
        else:
            values.mul_(per_row.repeat_interleave(block[1], 1)[:, :columns])
        return values.to(torch.bfloat16)

    return rows


def dequantized(checkpoint: SafetensorsFiles, block: tuple[int, int]) -> DequantizedFolder:
    """The checkpoint with each FP8 weight that has a weight_scale_inv read dequantized, the scales left out; a
    one-line error for a scale that is missing or of the wrong shape."""
    weights, scales = {}, set()
    for name, tensor in checkpoint.tensors.items():
        if name.endswith(SCALE):
            weight = name.removesuffix(SCALE) + ".weight"
            if weight not in checkpoint.tensors:
                raise CheckpointError(f"{tensor.pieces[0].file}: {name} scales no weight ({weight} is not here)")
            scales.add(name)
            continue
        if tensor.dtype.name != "float8_e4m3fn":
            continue
        scale = checkpoint.tensors.get(name.removesuffix(".weight") + SCALE)
        where = tensor.pieces[0].file
        if scale is None or len(tensor.shape) != 2:
            raise CheckpointError(
                f"{where}: {name} is float8_e4m3fn without its {name.removesuffix('.weight') + SCALE}; copy "
                "the model's files again (every FP8 weight has its block scales)"
            )
        wanted = tuple(math.ceil(n / b) for n, b in zip(tensor.shape, block))
        if scale.shape != wanted or scale.dtype.name != "float32":
            raise CheckpointError(
                f"{scale.pieces[0].file}: {scale.name} is {scale.dtype.name} {list(scale.shape)}, not the float32 "
                f"{list(wanted)} that blocks of {block[0]} x {block[1]} of a {list(tensor.shape)} weight need; "
                "the config's weight_block_size or the file is wrong"
            )
        weights[name] = Dequantizer(tensor.shape, DEQUANTIZED, (tensor, scale), block[0], _rows(tensor, scale, block))
    what = f"{len(weights)} FP8 weights, blocks of {block[0]} x {block[1]}"
    return dequantized_folder(checkpoint, weights, scales, what)

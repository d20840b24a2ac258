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
from ..errors import CheckpointError, read_json
from ..types import REMOVED
from .base import SourceTensor
from .dcp_safetensors import SafetensorsFiles

if TYPE_CHECKING:
    import torch

SCALE = ".weight_scale_inv"
DEQUANTIZED = dtypes.BY_NAME["bfloat16"]  # (what DeepSeek's weight_dequant writes: torch's default dtype there)


def block_size(folder: Path | None) -> tuple[int, int] | None:
    """The (rows, columns) of a block the config's quantization_config names, if it is block FP8; else None."""
    if folder is None or not (folder / "config.json").is_file():
        return None
    config = read_json(folder / "config.json", "fix it or pass --config-from DIR", CheckpointError)
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "fp8":
        return None
    size = quantization.get("weight_block_size")
    if not (isinstance(size, list) and len(size) == 2 and all(type(n) is int and n > 0 for n in size)):
        raise CheckpointError(
            f"{folder / 'config.json'}: quantization_config's weight_block_size is {size!r}, not two positive "
            "numbers (rows, columns) of a block; restore the model's config.json"
        )
    return size[0], size[1]


class BlockFP8Folder(SafetensorsFiles):
    """A safetensors folder whose FP8 weights are read dequantized (see the module's docstring). Set by
    `dequantized`: `block` (rows, columns), `quantized` (weight -> its FP8 tensor as stored) and `scales` (weight ->
    its weight_scale_inv)."""

    block: tuple[int, int]
    quantized: dict[str, SourceTensor]
    scales: dict[str, SourceTensor]

    def flat_pieces(self, name: str):
        return None if name in self.quantized else super().flat_pieces(name)

    def band_rows(self, name: str) -> int | None:
        if name not in self.quantized:
            return super().band_rows(name)
        shape = self.quantized[name].shape
        rows = self.BAND_BYTES // max(1, shape[1] * 4) // self.block[0] * self.block[0]  # (whole blocks, in float32)
        return max(self.block[0], min(rows, shape[0]))

    def reads_rows(self, name: str) -> bool:
        return name in self.quantized or super().reads_rows(name)

    def read_rows_as_bytes(self, name: str, start: int, stop: int, out=None):
        return None if name in self.quantized else super().read_rows_as_bytes(name, start, stop, out)

    def read_rows(self, name: str, start: int, stop: int, local) -> torch.Tensor:
        if name not in self.quantized:
            return super().read_rows(name, start, stop, local)
        return self._dequantized(name, start, stop)

    def read(self, name: str) -> torch.Tensor:
        if name not in self.quantized:
            return super().read(name)
        return self._dequantized(name, 0, self.quantized[name].shape[0])

    def _dequantized(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a weight: its FP8 rows, each element times its block's scale in float32,
        rounded to bfloat16 (DeepSeek's weight_dequant)."""
        import torch

        weight, scale = self.quantized[name], self.scales[name]
        rows, columns = self.block
        first, last = start // rows, -(-stop // rows)
        with_scales = super().local_tensor(scale.pieces[0])[first:last].float()
        values = super().local_tensor(weight.pieces[0])[start:stop].float()
        per_element = with_scales.repeat_interleave(rows, 0)[start - first * rows : stop - first * rows]
        per_element = per_element.repeat_interleave(columns, 1)[:, : values.shape[1]]
        return (values * per_element).to(torch.bfloat16)


def dequantized(checkpoint: SafetensorsFiles, block: tuple[int, int]) -> BlockFP8Folder:
    """The checkpoint with each FP8 weight that has a weight_scale_inv read dequantized, the scales left out; a
    one-line error for a scale that is missing or of the wrong shape."""
    tensors, quantized, scales = {}, {}, {}
    for name, tensor in checkpoint.tensors.items():
        if name.endswith(SCALE):
            weight = name.removesuffix(SCALE) + ".weight"
            if weight not in checkpoint.tensors:
                raise CheckpointError(f"{tensor.pieces[0].file}: {name} scales no weight ({weight} is not here)")
            continue
        if tensor.dtype.name != "float8_e4m3fn":
            tensors[name] = tensor
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
        quantized[name], scales[name] = tensor, scale
        tensors[name] = SourceTensor(name, tensor.shape, DEQUANTIZED, tensor.pieces)
    folder = BlockFP8Folder(
        layout=checkpoint.layout,
        path=checkpoint.path,
        tensors=tensors,
        hf_folder=checkpoint.hf_folder,
        facts={**checkpoint.facts, "dequantized": f"{len(quantized)} FP8 weights, blocks of {block[0]} x {block[1]}"},
        config_changes={"quantization_config": REMOVED},
    )
    folder.block, folder.quantized, folder.scales = block, quantized, scales
    return folder

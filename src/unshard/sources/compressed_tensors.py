"""compressed-tensors checkpoints as sources: what llm-compressor (and `unshard convert --quantize`) writes for vLLM,
config.json's `quantization_config` saying `quant_method: compressed-tensors`. Each quantized weight is read
dequantized as compressed-tensors' own decompressors compute it (their `decompress`, then `dequantize`): the stored
values unpacked (int4/int8 packed into int32, FP4 two to a byte) and cast to the scale's dtype, the zero point
subtracted, times the scale (over the global scale, NVFP4; a power of two, MX), in the dtype the decompressor gives
(the scale's; bfloat16 for the FP4 and MX formats). Bit for bit: the same operations on the same dtypes, a band of
rows at a time. The scales, zero points and shapes are not written, nor the quantization_config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import dtypes
from ..errors import CheckpointError
from .base import SourceTensor
from .dcp_safetensors import SafetensorsFiles
from .dequantized import DequantizedFolder, Dequantizer, StoredRows
from .dequantized import dequantized as dequantized_folder

if TYPE_CHECKING:
    import torch

METHOD = "compressed-tensors"
# What compressed-tensors registers on a quantized module beside its weight (QuantizationMetadata's names)
QUANTIZATION_PARAMETERS = {"k_scale", "v_scale"} | {
    f"{of}_{what}" for of in ("input", "weight", "output") for what in ("global_scale", "scale", "shape", "zero_point")
}
PACKED_INTS = "pack-quantized"
PACKED_FP4 = ("nvfp4-pack-quantized", "mxfp4-pack-quantized")
STORED_AS_THEY_ARE = ("int-quantized", "float-quantized", "naive-quantized", "mxfp8-quantized")
BFLOAT16 = dtypes.BY_NAME["bfloat16"]
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # FP4's magnitudes, by the code's low three bits


@dataclass(frozen=True)
class Group:
    """One of quantization_config's config_groups: how its weights are stored."""

    format: str
    num_bits: int
    strategy: str
    symmetric: bool
    group_size: int | None
    block: tuple[int, int] | None
    targets: tuple[str, ...]


def _groups(config: dict, where: Path) -> list[Group]:
    def refuse(why: str) -> CheckpointError:
        return CheckpointError(f"{where}: {why}; unshard reads compressed-tensors weights quantized alone")

    if config.get("sparsity_config") and config["sparsity_config"].get("format", "dense") != "dense":
        raise refuse(f"its weights are sparse ({config['sparsity_config']['format']})")
    if config.get("transform_config"):
        raise refuse("its weights are rotated (transform_config)")
    groups = []
    for group in (config.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            continue  # (activations or the KV cache only: the weights are stored as they are)
        if weights.get("actorder") == "group":
            raise refuse("its columns are reordered (actorder: group, a g_idx per weight)")
        block = weights.get("block_structure")
        groups.append(
            Group(
                format=group.get("format") or config.get("format") or "",
                num_bits=int(weights.get("num_bits", 8)),
                strategy=str(weights.get("strategy")),
                symmetric=bool(weights.get("symmetric", True)),
                group_size=weights.get("group_size"),
                block=tuple(block) if block else None,
                targets=tuple(group.get("targets") or ()),
            )
        )
    return groups


def _group_of(module: str, groups: list[Group], where: Path) -> Group:
    """The config group a module's weight was quantized by: the one whose `re:` target matches its name, else the
    one targeting layers by class (which a name cannot show: there must be one such group)."""
    by_name = [g for g in groups if any(t.startswith("re:") and re.match(t[3:], module) for t in g.targets)]
    by_class = [g for g in groups if any(not t.startswith("re:") for t in g.targets)]
    found = by_name or by_class or groups
    if len(found) != 1:
        raise CheckpointError(
            f"{where}: cannot tell which of quantization_config's {len(groups)} config_groups quantized {module}"
        )
    return found[0]


def _values(group: Group, stored: SourceTensor, columns: int):
    """How a band of the stored values reads as the quantized values compressed-tensors computes with: int8 values
    unpacked from int32 words, FP4 codes as bfloat16 numbers, or the stored int8/FP8 elements themselves."""

    def ints(read: StoredRows, start: int, stop: int) -> torch.Tensor:
        return unpack_ints(read(stored, start, stop), group.num_bits, columns)

    def fp4(read: StoredRows, start: int, stop: int) -> torch.Tensor:
        return unpack_fp4(read(stored, start, stop))

    def as_stored(read: StoredRows, start: int, stop: int) -> torch.Tensor:
        return read(stored, start, stop)

    return {PACKED_INTS: ints, **dict.fromkeys(PACKED_FP4, fp4)}.get(group.format, as_stored)


def unpack_ints(packed: torch.Tensor, bits: int, columns: int) -> torch.Tensor:
    """int32 words, each row's values packed densely little end first and offset by 2**(bits-1) (compressed-tensors'
    pack_to_int32), unpacked to int8 values; 4 and 8 bits."""
    import torch

    # the words' little-endian bytes: the bit stream in order (flattened first: a transposed column of words has
    # strides a view of its bytes cannot take)
    codes = packed.reshape(-1).view(torch.uint8).reshape(*packed.shape[:-1], packed.shape[-1] * 4)
    if bits == 4:
        codes = torch.stack((codes & 0x0F, codes >> 4), dim=-1).flatten(-2)
    return (codes[..., :columns].to(torch.int16) - (1 << (bits - 1))).to(torch.int8)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Two FP4 (E2M1) codes a byte, the first in the low half, as compressed-tensors' unpack_fp4_from_uint8 reads
    them: the magnitude from the table times -1.0 or 1.0 in float32, then bfloat16."""
    import torch

    codes = torch.stack((packed & 0x0F, (packed & 0xF0) >> 4), dim=-1).flatten(-2)
    magnitudes = torch.tensor(E2M1, dtype=torch.float32)[(codes & 0x07).long()]
    return (magnitudes * torch.where((codes & 0x08).bool(), -1.0, 1.0)).to(torch.bfloat16)


def _rows(group: Group, shape: tuple[int, int], parts: dict[str, SourceTensor]):
    """How rows [start, stop) of a weight are computed (see the module's docstring)."""
    values = _values(group, parts["values"], shape[1])
    scale, zero, global_scale = parts["weight_scale"], parts.get("weight_zero_point"), parts.get("weight_global_scale")

    def rows(read: StoredRows, start: int, stop: int) -> torch.Tensor:
        import torch

        q = values(read, start, stop)
        if group.strategy == "block":
            first, last = start // group.block[0], -(-stop // group.block[0])
            s = read(scale, first, last).repeat_interleave(group.block[0], 0)[start - first * group.block[0] :]
            s = s[: stop - start].repeat_interleave(group.block[1], 1)[:, : shape[1]]
        elif group.strategy == "tensor":
            s = read(scale, 0, 1)
        else:
            s = read(scale, start, stop)
        if group.format in PACKED_FP4 or group.format == "mxfp8-quantized":
            if group.format != "nvfp4-pack-quantized":  # (MX: power-of-two scales kept as their biased exponents)
                s = 2.0 ** (s.to(torch.int32) - 127).to(torch.bfloat16)
            s = s.to(torch.bfloat16)
        dtype = torch.bfloat16 if group.format in PACKED_FP4 else s.dtype
        if global_scale is not None:
            s = s / read(global_scale, 0, 1)
        x = q.to(s.dtype)
        if zero is not None and group.format == PACKED_INTS:  # (packed down the rows, 32 // num_bits to a word)
            z = read(zero, start * group.num_bits // 32, -(-stop * group.num_bits // 32))
            x = x - _per_column(unpack_ints(z.T, group.num_bits, stop - start).T, group, shape[1]).to(s.dtype)
        elif zero is not None:
            z = read(zero, 0, 1) if group.strategy == "tensor" else read(zero, start, stop)
            x = x - _per_column(z, group, shape[1]).to(s.dtype)
        if group.strategy in ("group", "tensor_group"):
            s = _per_column(s, group, shape[1])
        return (x * s).to(dtype)

    return rows


def _per_column(grouped: torch.Tensor, group: Group, columns: int) -> torch.Tensor:
    """A (rows, groups) tensor with each group's value repeated over its columns ((rows, 1): broadcast as it is)."""
    if grouped.shape[-1] == 1 or group.group_size is None:
        return grouped
    return grouped.repeat_interleave(group.group_size, -1)[..., :columns]


def dequantized(checkpoint: SafetensorsFiles, config: dict[str, Any], where: Path) -> DequantizedFolder:
    """The checkpoint with each quantized weight read dequantized and the quantization parameters left out; one
    line for a format or a weight it cannot read."""
    groups = _groups(config, where)
    tensors = checkpoint.tensors
    modules = sorted(
        {
            name.rsplit(".", 1)[0]
            for name in tensors
            if name.endswith(".weight_packed") or (name.endswith(".weight_scale") and name[: -len("_scale")] in tensors)
        }
    )
    weights = {}
    for module in modules:
        group = _group_of(module, groups, where)
        if group.format == "dense":  # (stored unquantized: only the parameters beside them go)
            continue
        values = tensors.get(f"{module}.weight_packed") or tensors[f"{module}.weight"]
        parts = {"values": values, **{p: tensors[f"{module}.{p}"] for p in _PARTS if f"{module}.{p}" in tensors}}
        if f"{module}.weight_g_idx" in tensors:
            raise CheckpointError(
                f"{values.pieces[0].file}: {module}'s columns are reordered (weight_g_idx); unshard cannot read it yet"
            )
        shape = _shape_of(group, values, parts, checkpoint)
        _check(group, module, values, parts, shape)
        stored = tuple(parts.values())
        # a band starts at a block of rows, or at a word of zero points packed down the rows
        packed_zeros = group.format == PACKED_INTS and "weight_zero_point" in parts
        multiple = group.block[0] if group.strategy == "block" else 32 // group.num_bits if packed_zeros else 1
        dtype = (
            BFLOAT16 if group.format in PACKED_FP4 or group.format == "mxfp8-quantized" else parts["weight_scale"].dtype
        )
        weights[f"{module}.weight"] = Dequantizer(shape, dtype, stored, multiple, _rows(group, shape, parts))
    left_out = {name for name in tensors if name.rsplit(".", 1)[-1] in QUANTIZATION_PARAMETERS}
    formats = sorted({g.format for g in groups})
    return dequantized_folder(
        checkpoint, weights, left_out, f"{len(weights)} weights, compressed-tensors {', '.join(formats)}"
    )


_PARTS = ("weight_scale", "weight_zero_point", "weight_global_scale")


def _shape_of(group: Group, values: SourceTensor, parts: dict, checkpoint: SafetensorsFiles) -> tuple[int, int]:
    rows, stored_columns = values.shape if len(values.shape) == 2 else (0, 0)
    if group.format == PACKED_INTS:
        shape_name = values.name.removesuffix("_packed") + "_shape"
        if shape_name in checkpoint.tensors:
            return tuple(int(n) for n in DequantizedFolder.stored_rows(checkpoint.tensors[shape_name], 0, 2).tolist())
        return rows, stored_columns * 32 // group.num_bits
    return (rows, stored_columns * 2) if group.format in PACKED_FP4 else (rows, stored_columns)


def _check(group: Group, module: str, values: SourceTensor, parts: dict, shape: tuple[int, int]) -> None:
    where = values.pieces[0].file
    if group.format not in (PACKED_INTS, *PACKED_FP4, *STORED_AS_THEY_ARE):
        raise CheckpointError(
            f"{where}: {module} is stored as compressed-tensors' {group.format!r}, which unshard cannot read yet"
        )
    if len(values.shape) != 2:
        raise CheckpointError(
            f"{where}: {values.name} has {len(values.shape)} dimensions; unshard reads quantized 2-D weights only"
        )
    if group.format == PACKED_INTS and group.num_bits not in (4, 8):
        raise CheckpointError(f"{where}: {module} is packed {group.num_bits} bits a value; unshard reads 4 and 8")
    if "weight_scale" not in parts:
        raise CheckpointError(f"{where}: {module}'s weight_scale is missing; copy the model's files again")
    rows, columns = shape
    per = {"channel": (rows, 1), "tensor": None}.get(group.strategy)
    if group.strategy in ("group", "tensor_group"):
        per = (rows, -(-columns // (group.group_size or 1)))
    elif group.strategy == "block":
        per = (-(-rows // group.block[0]), -(-columns // group.block[1]))
    scale = parts["weight_scale"]
    if per is not None and tuple(scale.shape) != per:
        raise CheckpointError(
            f"{scale.pieces[0].file}: {scale.name} is {list(scale.shape)}, not the {list(per)} that {group.strategy} "
            f"scales of a {list(shape)} weight are; the file or config.json's quantization_config is wrong"
        )
    if not group.symmetric and group.strategy == "block":
        raise CheckpointError(f"{where}: {module} has asymmetric block scales, which unshard cannot read yet")
    if not group.symmetric and "weight_zero_point" not in parts:
        raise CheckpointError(
            f"{where}: {module} is asymmetric but its weight_zero_point is missing; copy the model's files again"
        )

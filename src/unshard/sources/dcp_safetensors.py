"""Safetensors shards written by torch.distributed.checkpoint's HuggingFaceStorageWriter.

With `save_distributed=True` every rank writes `shard-{rank:05d}-model-{i:05d}-of-{n:05d}.safetensors`
holding its local pieces; the header's `DCP_SHARDING_INFO` gives each piece's offsets in the whole
tensor. There is no global metadata file, so a tensor's shape is where its pieces end: the check
against config.json is what catches a missing last rank.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from .. import dtypes
from ..errors import CheckpointError
from .base import Checkpoint, Piece, SourceTensor, deduplicate
from .placements import Block

if TYPE_CHECKING:
    import torch

SHARD_FILE = re.compile(r"^shard-(\d+)-model-(\d+)-of-(\d+)\.safetensors$")


def _shard_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if SHARD_FILE.match(p.name)) if folder.is_dir() else []


def find_folder(src: Path) -> Path | None:
    for candidate in (src, src / "sharded"):
        if _shard_files(candidate):
            return candidate
    return None


class SafetensorsFiles(Checkpoint):
    """Pieces that are whole tensors of safetensors files (read through safetensors' memory map)."""

    def local_tensor(self, piece: Piece) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(piece.file, framework="pt") as f:
            return f.get_tensor(piece.key)

    def file_offset(self, piece: Piece) -> int | None:
        """A safetensors file keeps each tensor as one run of bytes, where its header says."""
        stat = piece.file.stat()
        begin, shape, itemsize = byte_places(piece.file, stat.st_mtime_ns, stat.st_size)[piece.key]
        block = piece.block
        if not block.numel or tuple(block.sizes[1:]) != shape[1:] or any(block.local_offsets[1:]):
            return None  # not whole rows of the stored tensor
        return begin + (block.local_offsets[0] if shape else 0) * math.prod(shape[1:]) * itemsize


@functools.lru_cache(maxsize=1024)
def byte_places(path: Path, mtime_ns: int, size: int) -> dict[str, tuple[int, tuple[int, ...], int]]:
    """Each tensor of a safetensors file: (its first byte in the file, shape, bytes per element).
    (`mtime_ns` and `size` key the cache: a file written again is read again.)"""
    header, data_start = read_header(path)
    return {
        name: (data_start + entry["data_offsets"][0], tuple(entry["shape"]), dtype_of(path, name, entry).itemsize)
        for name, entry in header.items()
        if name != "__metadata__"
    }


def read_header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header (name -> dtype, shape, data_offsets; and `__metadata__`) and where
    its data begins, checked against the file's size. Read as the format lays it out (8 bytes of
    length, then JSON): safetensors' own reader would import torch to tell the same."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 2 <= length <= size - 8:
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
        ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:  # (JSONDecodeError is a ValueError)
        raise CheckpointError(f"{path}: not a valid safetensors file ({e}); copy it again") from None
    if 8 + length + max(ends, default=0) > size:
        raise CheckpointError(f"{path}: ends before its last tensor does; the file is truncated: copy it again")
    return header, 8 + length


def dtype_of(path: Path, name: str, entry: dict) -> dtypes.DType:
    try:
        return dtypes.BY_SAFETENSORS[entry["dtype"]]
    except KeyError:
        raise CheckpointError(f"{path}: {name} has dtype {entry['dtype']}, which unshard does not handle") from None


def open_folder(src: Path) -> SafetensorsFiles:
    folder = find_folder(src)
    if folder is None:
        raise CheckpointError(f"{src}: no shard-*-model-*-of-*.safetensors files")
    pieces: dict[str, list[Piece]] = {}
    found_dtypes: dict[str, dtypes.DType] = {}
    ranks = set()
    for path in _shard_files(folder):
        ranks.add(int(SHARD_FILE.match(path.name).group(1)))
        header, _ = read_header(path)
        try:
            info = json.loads((header.get("__metadata__") or {}).get("DCP_SHARDING_INFO", "{}"))
        except ValueError as e:
            raise CheckpointError(
                f"{path}: its DCP_SHARDING_INFO is not valid JSON ({e}); copy the file again"
            ) from None
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            if key not in info:
                raise CheckpointError(f"{path}: {key} has no DCP_SHARDING_INFO entry; not a DCP-written shard")
            dtype = dtype_of(path, key, entry)
            if found_dtypes.setdefault(key, dtype) != dtype:
                raise CheckpointError(f"{path}: {key} is {dtype} here but {found_dtypes[key]} in another shard")
            pieces.setdefault(key, []).append(
                Piece(path, key, Block.placed(tuple(info[key]["saved_offsets"]), tuple(entry["shape"])))
            )
    missing = sorted(set(range(1, max(ranks) + 1)) - ranks)
    if missing:
        raise CheckpointError(
            f"{folder}: no files from rank(s) {missing} (shard-{missing[0]:05d}-...); copy every rank's files"
        )
    tensors = {}
    for key, found in pieces.items():
        shape = tuple(
            max(p.block.global_offsets[d] + p.block.sizes[d] for p in found) for d in range(len(found[0].block.sizes))
        )
        tensors[key] = SourceTensor(key, shape, found_dtypes[key], deduplicate(key, shape, found))
    hf = folder.parent / "huggingface"
    return SafetensorsFiles(
        layout="dcp-safetensors",
        path=folder,
        tensors=tensors,
        hf_folder=hf if (hf / "config.json").is_file() else None,
        facts={"ranks": len(ranks), "files": len(_shard_files(folder))},
    )

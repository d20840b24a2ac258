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

import torch
from safetensors import safe_open

from ..errors import CheckpointError
from ..placements import Block
from ..writer import SAFETENSORS_DTYPES
from .base import Checkpoint, Piece, SourceTensor, deduplicate

TORCH_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}

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
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
    return {name: (8 + length + entry["data_offsets"][0], tuple(entry["shape"]), TORCH_DTYPES[entry["dtype"]].itemsize)
            for name, entry in header.items() if name != "__metadata__"}


def open_folder(src: Path) -> SafetensorsFiles:
    folder = find_folder(src)
    if folder is None:
        raise CheckpointError(f"{src}: no shard-*-model-*-of-*.safetensors files")
    pieces: dict[str, list[Piece]] = {}
    dtypes: dict[str, torch.dtype] = {}
    ranks = set()
    for path in _shard_files(folder):
        ranks.add(int(SHARD_FILE.match(path.name).group(1)))
        try:
            with safe_open(path, framework="pt") as f:
                info = json.loads((f.metadata() or {}).get("DCP_SHARDING_INFO", "{}"))
                for key in f.keys():
                    if key not in info:
                        raise CheckpointError(f"{path}: {key} has no DCP_SHARDING_INFO entry; not a DCP-written shard")
                    piece_slice = f.get_slice(key)
                    sizes = tuple(piece_slice.get_shape())
                    offsets = tuple(info[key]["saved_offsets"])
                    dtype = TORCH_DTYPES[piece_slice.get_dtype()]
                    if dtypes.setdefault(key, dtype) != dtype:
                        raise CheckpointError(f"{path}: {key} is {dtype} here but {dtypes[key]} in another shard")
                    pieces.setdefault(key, []).append(Piece(path, key, Block.placed(offsets, sizes)))
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: cannot be read ({e}); the file is truncated or corrupt") from None
        except Exception as e:  # safetensors raises its own error type on a bad header
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{path}: not a valid safetensors file ({e}); copy it again") from None
    missing = sorted(set(range(1, max(ranks) + 1)) - ranks)
    if missing:
        raise CheckpointError(f"{folder}: no files from rank(s) {missing} (shard-{missing[0]:05d}-...); copy every rank's files")
    tensors = {}
    for key, found in pieces.items():
        shape = tuple(max(p.block.global_offsets[d] + p.block.sizes[d] for p in found) for d in range(len(found[0].block.sizes)))
        tensors[key] = SourceTensor(key, shape, dtypes[key], deduplicate(key, shape, found))
    hf = folder.parent / "huggingface"
    return SafetensorsFiles(layout="dcp-safetensors", path=folder, tensors=tensors,
                          hf_folder=hf if (hf / "config.json").is_file() else None,
                          facts={"ranks": len(ranks), "files": len(_shard_files(folder))})

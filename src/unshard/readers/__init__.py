"""Readers, one module per checkpoint layout. `open_checkpoint` picks the one that fits SRC."""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError
from . import dcp, dcp_safetensors, fsdp_rank_files
from .base import Checkpoint, Piece, SourceTensor

# Each entry: (does SRC look like this layout?, open it). Tried in order.
READERS = [
    (lambda src: dcp.find_folder(src) is not None, dcp.open_folder),
    (lambda src: dcp_safetensors.find_folder(src) is not None, dcp_safetensors.open_folder),
    (lambda src: fsdp_rank_files.find_files(src) is not None, fsdp_rank_files.open_folder),
]


def open_checkpoint(src: str | Path) -> Checkpoint:
    """Recognise the layout of SRC and open it (metadata only)."""
    src = Path(src)
    if not src.exists():
        raise CheckpointError(f"{src}: no such file or folder")
    for matches, open_ in READERS:
        if matches(src):
            return open_(src)
    raise CheckpointError(
        f"{src}: not a checkpoint layout unshard knows; point at the folder holding "
        "model_world_size_*_rank_*.pt (verl: global_step_N/actor) a DCP folder (.metadata), or DCP-written shard-*-model-*.safetensors"
    )


__all__ = ["Checkpoint", "Piece", "SourceTensor", "open_checkpoint"]

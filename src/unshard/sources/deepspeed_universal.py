"""DeepSpeed universal checkpoints, as `ds_to_universal` writes them.

Folder: `<tag>_universal/zero/<parameter name>/fp32.pt`, each a torch.save of `{"param": whole fp32
tensor, "cat_dim": ...}` (with exp_avg.pt and friends beside it, never read). The folder with
`latest_universal` names the tag. Tensor parallel pieces are already merged by ds_to_universal.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import dtypes
from ..errors import CheckpointError
from .base import Checkpoint, Piece, SourceTensor
from .placements import Block

if TYPE_CHECKING:
    import torch


def find_folder(src: Path) -> Path | None:
    # Beside `latest`, the original ZeRO files are the source of truth; point at the universal
    # folder itself to read it instead.
    if (src / "latest_universal").is_file() and not (src / "latest").is_file():
        src = src / (src / "latest_universal").read_bytes().decode(errors="replace").strip()
    return src if (src / "zero").is_dir() and any((src / "zero").glob("*/fp32.pt")) else None


class DeepSpeedUniversal(Checkpoint):
    def local_tensor(self, piece: Piece) -> torch.Tensor:
        import torch

        from . import safe_torch_load  # (imports torch)

        value = safe_torch_load.load(piece.file, mmap=False)
        if not isinstance(value, dict) or not isinstance(value.get("param"), torch.Tensor):
            raise CheckpointError(f"{piece.file}: holds no 'param' tensor; not a universal checkpoint file")
        return value["param"]


def open_folder(src: Path) -> DeepSpeedUniversal:
    from . import safe_torch_load  # (imports torch)

    folder = find_folder(src)
    if folder is None:
        raise CheckpointError(f"{src}: no zero/<parameter>/fp32.pt files (not a DeepSpeed universal checkpoint)")
    tensors = {}
    for path in sorted((folder / "zero").glob("*/fp32.pt")):
        # The shape and dtype come from the file's metadata; the data stays on disk until read.
        param = safe_torch_load.load(path)["param"]
        name = path.parent.name
        tensors[name] = SourceTensor(
            name, tuple(param.shape), dtypes.of(param.dtype), [Piece(path, "param", Block.whole(param.shape))]
        )
    hf = next((c for c in (folder, folder.parent) if (c / "config.json").is_file()), None)
    return DeepSpeedUniversal(
        layout="deepspeed-universal", path=folder, tensors=tensors, hf_folder=hf, facts={"files": len(tensors)}
    )

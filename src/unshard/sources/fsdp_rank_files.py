"""Per-rank `torch.save(model.state_dict())` files of FSDP / DTensor training, and whole state dicts.

- verl: `model_world_size_{W}_rank_{r}.pt` for r in 0..W-1, optional `fsdp_config.json`
  (`{"FSDP_version", "world_size"}`, verl >= 0.4.1) and `huggingface/` (config, tokenizer...).
- accelerate `save_fsdp_model(..., use_dcp=False)`: `pytorch_model_fsdp_0_rank{R}.bin`.
- one whole state dict: accelerate's FULL_STATE_DICT `pytorch_model_fsdp.bin`, llama-recipes'
  FULL_STATE_DICT `*.pt`, torchtune's single-file checkpointers' `epoch_N/model-00001-of-00001.bin` (torchtune's
  or Meta's names, renamed by sources/meta_named.py), or any `.pt` / `.bin` / `.pth` file given as SRC.
Values are DTensors (FSDP2, or FSDP1 with a device mesh), ShardedTensors (FSDP1 without one) or
plain tensors (replicated, or a world size of 1).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .. import dtypes
from ..errors import CheckpointError, read_json
from . import safe_pickle, torch_archives
from .base import Checkpoint, Piece, SourceTensor, deduplicate, load_archive
from .meta_named import MetaNamed
from .placements import Block, ShardSpec, blocks_from_runs, local_runs, runs_shape

VERL_FILE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
ACCELERATE_FILE = re.compile(r"^pytorch_model_fsdp_0_rank(\d+)\.bin$")
# accelerate's FULL_STATE_DICT; what torchtune's FullModelTorchTuneCheckpointer and FullModelMetaCheckpointer write
WHOLE_FILES = ("pytorch_model_fsdp.bin", "model-00001-of-00001.bin")
WHOLE_SUFFIXES = (".pt", ".bin", ".pth")


@dataclass
class RankFiles:
    folder: Path
    files: dict[int, Path]  # rank -> file
    world: int
    naming: str  # "verl", "accelerate" or "whole"

    def name_for(self, rank: int) -> str:
        if self.naming == "verl":
            return f"model_world_size_{self.world}_rank_{rank}.pt"
        return f"pytorch_model_fsdp_0_rank{rank}.bin"


def _verl_files(folder: Path) -> dict[int, dict[int, Path]]:
    found: dict[int, dict[int, Path]] = {}
    for path in folder.iterdir():
        m = VERL_FILE.match(path.name)
        if m:
            found.setdefault(int(m.group(1)), {})[int(m.group(2))] = path
    return found


def find_files(src: Path) -> RankFiles | None:
    """The rank files SRC holds: SRC itself, its actor/ (or critic/) subfolder, or one file."""
    if src.is_file():
        return RankFiles(src.parent, {0: src}, 1, "whole") if src.suffix in WHOLE_SUFFIXES else None
    for folder in (src, src / "actor", src / "critic"):
        if not folder.is_dir():
            continue
        verl = _verl_files(folder)
        if len(verl) > 1:
            sizes = ", ".join(str(w) for w in sorted(verl))
            raise CheckpointError(f"{folder}: rank files of several world sizes ({sizes}); keep only one run's files")
        if verl:
            ((world, files),) = verl.items()
            return RankFiles(folder, files, world, "verl")
        accelerate = {int(m.group(1)): p for p in folder.iterdir() if (m := ACCELERATE_FILE.match(p.name))}
        if accelerate:
            return RankFiles(folder, accelerate, max(accelerate) + 1, "accelerate")
        for name in WHOLE_FILES:
            if (folder / name).is_file():
                return RankFiles(folder, {0: folder / name}, 1, "whole")
    return None


def _placement(p) -> ShardSpec:
    kind = type(p).__name__
    if kind == "_StridedShard":
        return ShardSpec("strided", p.dim, int(p.split_factor))
    if kind == "Shard":
        return ShardSpec("shard", p.dim)
    if kind == "Replicate":
        return ShardSpec("replicate")
    raise CheckpointError(f"placement {p} is not supported (Partial tensors hold unreduced sums, not weights)")


def _is_tensor(value) -> bool:
    """A tensor, a DTensor or a ShardedTensor: as torch_archives stands in for them, or (where torch's
    loader read the file) as torch and safe_torch_load build them."""
    if isinstance(value, (torch_archives.StoredTensor, torch_archives.StoredDTensor)):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _pieces(path: Path, key: str, value) -> tuple[tuple[int, ...], dtypes.DType, list[Piece], str]:
    """Global shape, dtype, pieces and a short description of how `value` is sharded."""
    if safe_pickle.is_dtensor(value):
        mesh = value.device_mesh
        placements = [_placement(p) for p in value.placements]
        coordinate = mesh.get_coordinate()
        runs = local_runs(value.shape, mesh.shape, placements, coordinate)
        local = value._local_tensor
        if runs_shape(runs) != tuple(local.shape):
            raise CheckpointError(
                f"{path}: {key} holds a shard of shape {tuple(local.shape)}, but its placement "
                f"{tuple(value.placements)} on a mesh of shape {tuple(mesh.shape)} at {tuple(coordinate)} "
                f"implies {runs_shape(runs)}; the file is corrupt or from another checkpoint"
            )
        names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
        how = f"DTensor {dict(zip(names, mesh.shape))} {tuple(str(p) for p in value.placements)}"
        return tuple(value.shape), dtypes.of(value.dtype), [Piece(path, key, b) for b in blocks_from_runs(runs)], how
    if hasattr(value, "local_shards"):  # safe_torch_load's ShardedTensorRecord
        pieces = []
        for part, shard in enumerate(value.local_shards):
            sizes, offsets = tuple(shard.metadata.shard_sizes), tuple(shard.metadata.shard_offsets)
            if tuple(shard.tensor.shape) != sizes:
                raise CheckpointError(
                    f"{path}: {key} shard {part} has shape {tuple(shard.tensor.shape)}, "
                    f"its metadata says {sizes}; the file is corrupt"
                )
            pieces.append(Piece(path, key, Block.placed(offsets, sizes), part))
        return tuple(value.shape), dtypes.of(value.dtype), pieces, "ShardedTensor"
    if _is_tensor(value):
        return tuple(value.shape), dtypes.of(value.dtype), [Piece(path, key, Block.whole(value.shape))], "tensor"
    raise CheckpointError(f"{path}: {key} is a {type(value).__name__}, not a tensor")


class FsdpRankFiles(MetaNamed, Checkpoint):
    def loaded(self, piece: Piece):
        value = self.states[piece.file][piece.key]
        if hasattr(value, "local_shards"):
            return value.local_shards[piece.part].tensor
        return value._local_tensor if safe_pickle.is_dtensor(value) else value


def open_folder(src: Path) -> FsdpRankFiles:
    found = find_files(src)
    if found is None:
        raise CheckpointError(f"{src}: no rank files (model_world_size_*_rank_*.pt) here or in actor/")
    folder, world = found.folder, found.world
    missing = sorted(set(range(world)) - set(found.files))
    if missing:
        names = ", ".join(found.name_for(r) for r in missing[:4])
        raise CheckpointError(
            f"{folder}: missing {len(missing)} of {world} rank files ({names}); copy every rank's file"
        )
    fsdp_config = _read_fsdp_config(folder, world) if found.naming == "verl" else {}

    states, maps, pieces, how_sharded, skipped = {}, {}, {}, Counter(), Counter()
    shapes: dict[str, tuple[tuple[int, ...], dtypes.DType]] = {}
    sharding: dict[str, str] = {}
    keys0 = None
    for rank in range(world):
        path = found.files[rank]
        saved = load_archive(path, maps)
        state = _model_state(path, saved)
        if keys0 is None:
            keys0 = list(state)
        elif set(state) != set(keys0):
            diff = sorted(set(state) ^ set(keys0))[:3]
            raise CheckpointError(f"{path}: its tensor names differ from rank 0's (e.g. {diff}); mixed checkpoints?")
        states[path] = state
        for key, value in state.items():
            if not _is_tensor(value):
                skipped[f"{type(value).__name__} values"] += rank == 0
                continue
            shape, dtype, found_pieces, how = _pieces(path, key, value)
            if shapes.setdefault(key, (shape, dtype)) != (shape, dtype):
                raise CheckpointError(f"{path}: {key} is {shape} {dtype} here but {shapes[key]} on rank 0")
            if sharding.setdefault(key, how) != how:
                raise CheckpointError(
                    f"{path}: {key} is a {how} here but a {sharding[key]} on rank 0; the file comes from another run"
                )
            pieces.setdefault(key, []).extend(found_pieces)
            if rank == 0:
                how_sharded[how] += 1
    tensors = {
        key: SourceTensor(key, shapes[key][0], shapes[key][1], deduplicate(key, shapes[key][0], pieces[key]))
        for key in keys0
        if key in shapes
    }
    hf = folder / "huggingface"
    facts = {"world_size": world, "naming": found.naming, "sharding": dict(how_sharded)}
    if found.naming == "verl":
        facts.update(fsdp_version=fsdp_config.get("FSDP_version"), fsdp_config_json=bool(fsdp_config))
    if skipped:
        facts["skipped"] = dict(skipped)
    checkpoint = FsdpRankFiles(
        layout="torch-state-dict" if found.naming == "whole" else "fsdp-rank-files",
        path=folder if found.naming != "whole" else found.files[0],
        tensors=tensors,
        hf_folder=hf if hf.is_dir() else None,
        facts=facts,
        maps=maps,
        states=states,
    )
    return checkpoint


def _model_state(path: Path, state) -> dict:
    """The model's state dict, also when saved nested as {"model": ...} or {"state_dict": ...}."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a state dict")
    for key in ("model", "state_dict", "module"):
        if isinstance(state.get(key), dict):
            return state[key]
    return state


def _read_fsdp_config(folder: Path, world: int) -> dict:
    path = folder / "fsdp_config.json"
    if not path.exists():
        return {}  # verl before 0.4.1: the world size comes from the file names
    config = read_json(path, "delete it or restore it from the run")
    if config.get("world_size", world) != world:
        raise CheckpointError(f"{path}: says world_size {config['world_size']} but the rank files are for {world}")
    return config

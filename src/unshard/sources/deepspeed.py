"""DeepSpeed ZeRO checkpoints (`save_checkpoint`), read without DeepSpeed installed.

Folder: `latest` names the tag; `<tag>/` holds `mp_rank_00_model_states.pt` (ZeRO 1/2) or
`zero_pp_rank_{dp}_mp_rank_00_model_states.pt` (ZeRO 3), and the optimizer partitions
`[bf16_]zero_pp_rank_{dp}_mp_rank_00_optim_states.pt`. The fp32 master weights live only in the
optimizer partitions, as flat vectors per parameter group:
- ZeRO 1/2: `single_partition_of_fp32_groups[g]`, one equal slice per rank; the ranks' slices
  concatenated hold the group's parameters one after another, in `param_shapes[g]` order.
- ZeRO 3: `fp32_flat_groups[g]`; every parameter is cut into `ceil(numel / world)` elements per
  rank (the last rank padded), parameters one after another across the groups.
Each parameter becomes a list of element ranges in those vectors; nothing else is read.

DeepSpeed's own MoE layers (`deepspeed.moe.layer.MoE`, expert parallel) put the experts in groups of
their own, partitioned only over the expert-data-parallel ranks (`partition_count[g]` of them:
ranks e, e + ep, e + 2·ep... for expert-parallel rank e), each rank's slice holding its own experts
under local numbers. Those become global (`ep_rank * local_experts + local`); the 16-bit experts are
in `layer_{l}_expert_{e}_mp_rank_00_model_states.pt`, already under global numbers.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from .. import dtypes
from ..errors import CheckpointError
from .base import Checkpoint, Piece, SourceTensor, deduplicate, load_archive
from .placements import Block
from .torch_archives import StoredTensor

if TYPE_CHECKING:
    import torch

LAYOUT = "deepspeed-zero"
MODEL_FILE = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
OPTIM_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
EXPERT_FILE = re.compile(r"^layer_(\d+)_expert_(\d+)_mp_rank_(\d+)_model_states\.pt$")
EXPERT_NAME = re.compile(r"^(.*\.deepspeed_experts\.)(\d+)(\..*)$")


def latest_tag(src: Path) -> str:
    """What `latest` names (read as bytes: a damaged file may hold anything)."""
    return (src / "latest").read_bytes().decode(errors="replace").strip()


def find_folder(src: Path, tag: str | None = None) -> Path | None:
    """The tag folder: the one `latest` names (or `tag`), or SRC itself if it holds model states."""
    if tag is not None or (src / "latest").is_file():
        named = tag or latest_tag(src)
        folder = src / named
        return folder if named and "/" not in named and folder.is_dir() else None
    if src.is_dir() and any(MODEL_FILE.match(p.name) for p in src.iterdir()):
        return src
    return None


def _files(folder: Path, pattern: re.Pattern) -> dict[tuple[int, int], Path]:
    found = {}
    for path in folder.iterdir():
        m = pattern.match(path.name)
        if m:
            found[(int(m.group(1) or 0), int(m.group(2)))] = path
    return found


class DeepSpeedZero(Checkpoint):
    def loaded(self, piece: Piece):
        state = self.states[piece.file]
        kind, _, name = piece.key.partition("/")
        if kind == "module":
            return state["module"][name]
        if kind == "frozen":  # cut as ranges of the flattened parameter, as the masters are
            fragment = state["frozen_param_fragments"][name]
            if isinstance(fragment, StoredTensor) and fragment.is_contiguous():
                return fragment.flattened()
            return self.as_torch(piece, fragment).reshape(-1)
        if kind == "expert":
            return state[name]
        return state["optimizer_state_dict"][kind][piece.part]


def _ranges(path: Path, key: str, part: int, local_start: int, global_start: int, count: int) -> Piece:
    return Piece(path, key, Block((local_start,), (global_start,), (count,)), part)


def open_folder(src: Path, weights: str = "master", tag: str | None = None) -> DeepSpeedZero:
    folder = _tag_folder(src, tag)
    model_files, optim_files = _files(folder, MODEL_FILE), _files(folder, OPTIM_FILE)
    expert_files = [p for p in folder.iterdir() if EXPERT_FILE.match(p.name)]
    if any(mp for _, mp in [*model_files, *optim_files]) or any(
        EXPERT_FILE.match(p.name).group(3) != "00" for p in expert_files
    ):
        raise CheckpointError(
            f"{folder}: tensor-parallel DeepSpeed checkpoints (mp_rank_01 and up) are not supported yet"
        )
    if not model_files:
        raise CheckpointError(
            f"{folder}: no mp_rank_00_model_states.pt (or zero_pp_rank_N_mp_rank_00_model_states.pt) "
            "here; the checkpoint is incomplete: copy the tag folder again"
        )
    first_model = model_files[min(model_files)]
    maps: dict[Path, torch.UntypedStorage] = {}
    model_state = load_archive(first_model, maps)
    world = int(model_state.get("dp_world_size") or len(optim_files))
    missing = sorted(set(range(world)) - {dp for dp, _ in optim_files})
    if missing:
        raise CheckpointError(
            f"{folder}: optimizer partitions of rank(s) {missing[:4]} are missing "
            f"(zero_pp_rank_{missing[0]}_mp_rank_00_optim_states.pt); copy every rank's files"
        )
    states = {first_model: model_state}
    optims = []
    for dp in range(world):
        path = optim_files[(dp, 0)]
        states[path] = load_archive(path, maps)
        optims.append(path)
    optim0 = states[optims[0]]["optimizer_state_dict"]
    stage = int(optim0["zero_stage"])
    param_shapes = model_state["param_shapes"]
    tensors: dict[str, SourceTensor] = {}
    facts = {"zero_stage": stage, "world_size": world, "weights": weights}

    if expert_files:
        facts["experts"] = model_state.get("num_experts")
        if stage == 3:
            raise CheckpointError(f"{folder}: DeepSpeed MoE experts with ZeRO-3 are not supported")
    if weights == "module":
        if stage == 3:
            raise CheckpointError(
                f"{first_model}: ZeRO-3 keeps no whole weights in the model states; "
                "use the default fp32 master weights (--weights master)"
            )
        tensors.update(_module_weights(first_model, model_state, expert_files, states, maps))
    else:
        masters = _zero12_masters if stage <= 2 else _zero3_masters
        for name, shape, pieces in masters(param_shapes, optims, states, world):
            tensors[name] = SourceTensor(name, tuple(shape), dtypes.float32, deduplicate(name, tuple(shape), pieces))
        _add_frozen(tensors, model_state, first_model, folder, model_files, states, maps, stage, world)
        for name in model_state.get("buffer_names") or []:
            tensors[name] = _from_module(first_model, name, model_state["module"][name])
        facts["optimizer_files"] = Counter(
            "bf16" if p.name.startswith("bf16_") else "fp32" for p in optims
        ).most_common(1)[0][0]
    for alias, source in (model_state.get("shared_params") or {}).items():
        if source in tensors:
            tensors[alias] = SourceTensor(alias, tensors[source].shape, tensors[source].dtype, tensors[source].pieces)
    hf = _hf_folder(folder)
    return DeepSpeedZero(
        layout=LAYOUT, path=folder, tensors=tensors, hf_folder=hf, facts=facts, maps=maps, states=states
    )


def _tag_folder(src: Path, tag: str | None) -> Path:
    """The tag folder to read (--tag's, else the one `latest` names, else src itself); where there is none, one line
    saying which tags are here."""
    folder = find_folder(src, tag)
    if folder is not None:
        return folder
    tags = sorted(p.name for p in src.iterdir() if p.is_dir() and any(MODEL_FILE.match(f.name) for f in p.iterdir()))
    found = f"tags here: {', '.join(tags) or 'none'}"
    if tag is not None:
        raise CheckpointError(f"{src}: no tag folder {tag!r}; {found}")
    if (src / "latest").is_file():
        named = latest_tag(src)
        what = f"names {named!r}, which is not here" if named else "is empty"
        raise CheckpointError(f"{src / 'latest'}: {what}; {found}; pass --tag")
    raise CheckpointError(f"{src}: no DeepSpeed `latest` file or *_model_states.pt files here")


def _module_weights(
    first_model: Path, model_state: dict, expert_files: list[Path], states: dict, maps: dict
) -> dict[str, SourceTensor]:
    """--weights module: the training dtype's weights the model states keep whole (ZeRO-1 and -2), and the experts'
    from their own files."""
    tensors = {name: _from_module(first_model, name, t) for name, t in model_state["module"].items()}
    for path in sorted(expert_files):
        states[path] = load_archive(path, maps)
        for name, t in states[path].items():
            tensors[name] = SourceTensor(
                name, tuple(t.shape), dtypes.of(t.dtype), [Piece(path, f"expert/{name}", Block.whole(t.shape))]
            )
    return tensors


def _from_module(path: Path, name: str, tensor: torch.Tensor) -> SourceTensor:
    """A tensor held whole in the model states' `module` dict (16-bit weights, buffers)."""
    return SourceTensor(
        name, tuple(tensor.shape), dtypes.of(tensor.dtype), [Piece(path, f"module/{name}", Block.whole(tensor.shape))]
    )


def _zero12_masters(param_shapes, optims, states, world):
    """ZeRO 1/2: per group, the ranks' equal slices concatenated hold the parameters in order. An
    expert group is partitioned over fewer ranks, once per expert-parallel rank (see the top)."""
    key = "single_partition_of_fp32_groups"
    optim0 = states[optims[0]]["optimizer_state_dict"]
    paddings = optim0.get("param_alignment_paddings")
    counts = optim0.get("partition_count") or [world] * len(param_shapes)
    for g, shapes in enumerate(param_shapes):
        partition = optim0[key][g].numel()
        ep = world // counts[g]  # 1 for an ordinary group
        local_experts = _local_experts(shapes) if ep > 1 else {}
        for ep_rank in range(ep):
            ranks = [optims[ep_rank + i * ep] for i in range(counts[g])]
            offset = 0
            for i, (name, shape) in enumerate(shapes.items()):
                numel, pieces = math.prod(shape), []
                for rank, path in enumerate(ranks):
                    lo, hi = max(offset, rank * partition), min(offset + numel, (rank + 1) * partition)
                    if lo < hi:
                        pieces.append(_ranges(path, key, g, lo - rank * partition, lo - offset, hi - lo))
                yield _global_expert(name, ep_rank, local_experts), shape, pieces
                offset += numel + (paddings[g][i] if paddings else 0)


def _local_experts(shapes) -> dict[str, int]:
    """Experts per rank, by MoE layer (the name before the expert number)."""
    found: dict[str, int] = {}
    for name in shapes:
        m = EXPERT_NAME.match(name)
        if m:
            found[m.group(1)] = max(found.get(m.group(1), 0), int(m.group(2)) + 1)
    return found


def _global_expert(name: str, ep_rank: int, local_experts: dict[str, int]) -> str:
    m = EXPERT_NAME.match(name) if local_experts else None
    if m is None:
        return name
    return f"{m.group(1)}{ep_rank * local_experts[m.group(1)] + int(m.group(2))}{m.group(3)}"


def _zero3_masters(param_shapes, optims, states, world):
    """ZeRO 3: every parameter is ceil(numel / world) elements on each rank, one after another."""
    key = "fp32_flat_groups"
    group_sizes = [t.numel() for t in states[optims[0]]["optimizer_state_dict"][key]]
    group_starts = [sum(group_sizes[:g]) for g in range(len(group_sizes))]
    offset = 0
    for shapes in param_shapes:
        for name, shape in shapes.items():
            numel = math.prod(shape)
            per_rank, pieces = -(-numel // world), []
            # A parameter's partition lies inside one group's flat vector.
            g = max(i for i, start in enumerate(group_starts) if start <= offset)
            for rank, path in enumerate(optims):
                count = min(per_rank, numel - rank * per_rank)
                if count > 0:
                    pieces.append(_ranges(path, key, g, offset - group_starts[g], rank * per_rank, count))
            yield name, shape, pieces
            offset += per_rank


def _add_frozen(tensors, model_state, first_model, folder, model_files, states, maps, stage, world) -> None:
    """Frozen parameters are not in the optimizer: whole in the model states (ZeRO 1/2) or in
    per-rank fragments of ceil(numel / world) elements (ZeRO 3)."""
    frozen = model_state.get("frozen_param_shapes") or {}
    if not frozen:
        return
    if stage == 3:
        missing = [dp for dp in range(world) if (dp, 0) not in model_files]
        if missing:
            raise CheckpointError(
                f"{folder}: model states of rank(s) {missing[:4]} are missing "
                f"(zero_pp_rank_{missing[0]}_mp_rank_00_model_states.pt); copy every rank's files"
            )
        for dp in range(world):
            path = model_files[(dp, 0)]
            if path not in states:
                states[path] = load_archive(path, maps)
    for name, shape in frozen.items():
        numel, pieces = math.prod(shape), []
        if stage <= 2:
            pieces.append(_ranges(first_model, f"frozen/{name}", 0, 0, 0, numel))
        else:
            per_rank = -(-numel // world)
            for dp in range(world):
                count = min(per_rank, numel - dp * per_rank)
                if count > 0:
                    pieces.append(_ranges(model_files[(dp, 0)], f"frozen/{name}", 0, 0, dp * per_rank, count))
        dtype = dtypes.of(model_state["frozen_param_fragments"][name].dtype)
        tensors[name] = SourceTensor(name, tuple(shape), dtype, deduplicate(name, tuple(shape), pieces))


def _hf_folder(tag_folder: Path) -> Path | None:
    """The Hugging Face Trainer keeps config and tokenizer in checkpoint-N/, the folder above the tag."""
    for candidate in (tag_folder, tag_folder.parent):
        if (candidate / "config.json").is_file():
            return candidate
    return None

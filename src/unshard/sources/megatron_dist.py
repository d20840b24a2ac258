"""Megatron's `torch_dist` checkpoint format (dist_checkpointing): a DCP folder with Megatron's keys.

    iter_0002000/metadata.json   {"sharded_backend": "torch_dist", ...}
    iter_0002000/common.pt       args, iteration: everything that is not a sharded tensor
    iter_0002000/.metadata, __R_N.distcp

Keys are global, whatever the parallel layout: identical layers are stacked under one key with a
leading layer axis (`decoder.layers.self_attention.linear_qkv.weight` is [layers, rows, hidden]), and
experts under a second axis (`decoder.layers.mlp.experts.experts.linear_fc1.weight`). Each chunk is
one layer's (and expert's) tensor-parallel slice. This module unstacks them into per-layer Megatron
tensors, read chunk by chunk from their byte ranges; `megatron_hf` names them as Hugging Face does.
megatron itself is never imported.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from ..errors import CheckpointError
from . import dcp
from .base import Piece, SourceTensor, deduplicate, load_archive
from .megatron import MegatronCheckpoint, finish, iteration_folder, plain_args
from .placements import Block

LAYOUT = "megatron-torch-dist"
# Saved beside the model in the same folder; none of it is a weight.
NOT_MODEL = ("optimizer.", "rng_state", "rerun_state_machine_state")
STACKED = re.compile(r"^decoder\.layers\.(?!\d)")
STACKED_EXPERTS = ".mlp.experts.experts."
SINGLE_EXPERT = re.compile(r"\d+\.")


def _is_torch_dist(folder: Path) -> bool:
    try:
        backend = json.loads((folder / "metadata.json").read_text()).get("sharded_backend")
    except (OSError, ValueError, AttributeError):
        return False
    return backend == "torch_dist" and (folder / ".metadata").is_file()


def find_folder(src: Path, iteration: int | None = None) -> Path | None:
    """The torch_dist folder: the iteration folder itself, or verl's model/dist_ckpt (dist_ckpt before
    verl's layout v2) inside it or inside its actor/ (or critic/)."""
    folder = iteration_folder(src, iteration)
    for base in (folder, folder / "actor", folder / "critic"):
        for candidate in (base, base / "model" / "dist_ckpt", base / "dist_ckpt"):
            if _is_torch_dist(candidate):
                return candidate
    return None


def _verl_parallel(folder: Path) -> dict:
    """verl writes its TransformerConfig as transformer_config.json at the actor folder."""
    for candidate in (folder.parent / "transformer_config.json", folder.parent.parent / "transformer_config.json"):
        if candidate.is_file():
            try:
                config = json.loads(candidate.read_text())
            except ValueError:
                return {}
            return {
                "parallel": {
                    "tensor": config.get("tensor_model_parallel_size", 1),
                    "pipeline": config.get("pipeline_model_parallel_size", 1),
                    "virtual_pipeline": config.get("virtual_pipeline_model_parallel_size") or 1,
                    "expert": config.get("expert_model_parallel_size", 1),
                },
                "naming": "verl (no Megatron-LM args: sizes from huggingface/config.json)",
            }
    return {}


class MegatronDist(dcp.ChunkReader, MegatronCheckpoint):
    """Megatron's tensors read from their DCP chunks; a chunk may stack several layers' or experts' tensors."""


def _unstack(fqn: str, at: tuple[int, ...]) -> tuple[str, int]:
    """The per-layer (and per-expert) name of a tensor of a stacked key, given its index `at` on the stacked axes,
    and how many leading axes are stacked.

    Layers alike are stacked under `decoder.layers.` (and experts under `.mlp.experts.experts.`); where the layers
    differ (dense layers before MoE ones; an MTP layer's), megatron-core keeps each layer's own key and stacks its
    experts only; with singleton_local_shards each expert has its own key too (`.experts.experts.5.`)."""
    stacked_layers = bool(STACKED.match(fqn))
    name = f"decoder.layers.{at[0]}.{fqn[len('decoder.layers.') :]}" if stacked_layers else fqn
    if STACKED_EXPERTS not in name:
        return name, int(stacked_layers)
    head, tail = name.split(STACKED_EXPERTS, 1)
    if SINGLE_EXPERT.match(tail):
        return f"{head}.mlp.experts.{tail}", int(stacked_layers)
    return f"{head}.mlp.experts.{at[int(stacked_layers)]}.{tail}", 1 + int(stacked_layers)


def _stacked_axes(fqn: str) -> int:
    return _unstack(fqn, (0, 0))[1]


HALF = re.compile(r"linear_fc1\.(weight|bias)_([wv])$")


def _gate_or_up(name: str, rows: int) -> tuple[str, int]:
    """singleton_local_shards saves a gated fc1 (and its bias) as its gate (`_w`) and up (`_v`) halves: the whole
    tensor's name, and where the half's rows begin in it ([gate; up], as the rules expect)."""
    half = HALF.search(name)
    if half is None:
        return name, 0
    return name[:-2], 0 if half.group(2) == "w" else rows


def open_folder(src: Path, iteration: int | None = None) -> MegatronDist:
    folder = find_folder(src, iteration)
    if folder is None:
        raise CheckpointError(f"{iteration_folder(src, iteration)}: no torch_dist metadata.json here")
    common = folder / "common.pt"
    if not common.is_file():
        raise CheckpointError(f"{common}: missing; it holds the args the conversion needs: copy it with the checkpoint")
    saved = load_archive(common, {})  # (nothing mapped is kept: no tensor in it is used)
    args = plain_args(saved["args"], common) if saved.get("args") is not None else None
    metadata = dcp.read_metadata(folder)
    storage = dcp.storage_index(metadata)

    pieces: dict[str, list[Piece]] = defaultdict(list)
    shapes, dtypes, skipped, chunks = {}, {}, Counter(), []
    for fqn, md in metadata.state_dict_metadata.items():
        if not dcp.is_tensor_entry(md) or "_extra_state" in fqn or fqn.startswith(NOT_MODEL):
            skipped[fqn.split(".")[0] if fqn.startswith(NOT_MODEL) else "_extra_state and other non-tensor"] += 1
            continue
        stacked = _stacked_axes(fqn)
        for chunk in md.chunks:
            offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
            path, info = dcp.chunk_location(folder, storage, fqn, offsets)
            # (a chunk may hold several experts: GroupedMLP saves a rank's experts as one)
            for index in itertools.product(*(range(n) for n in sizes[:stacked])):
                unstacked, _ = _unstack(fqn, tuple(o + i for o, i in zip(offsets, index)))
                name, row = _gate_or_up(unstacked, md.size[stacked])
                rows = md.size[stacked] * (2 if name != unstacked else 1)
                shapes[name], dtypes[name] = (rows, *md.size[stacked + 1 :]), dcp.tensor_dtype(folder, fqn, md)
                chunks.append(dcp.Chunk(info, dtypes[name], sizes, index))
                place = (offsets[stacked] + row, *offsets[stacked + 1 :])
                pieces[name].append(Piece(path, fqn, Block.placed(place, sizes[stacked:]), len(chunks) - 1))
    megatron = {
        name: SourceTensor(name, shapes[name], dtypes[name], deduplicate(name, shapes[name], found))
        for name, found in pieces.items()
    }
    checkpoint = MegatronDist(layout=LAYOUT, path=folder, tensors={})
    checkpoint.use_chunks(chunks)
    files = {p.file for found in pieces.values() for p in found}
    if args is not None:
        layout = {
            "parallel": {
                "tensor": args.get("tensor_model_parallel_size", 1),
                "pipeline": args.get("pipeline_model_parallel_size", 1),
                "virtual_pipeline": args.get("virtual_pipeline_model_parallel_size") or 1,
                "expert": args.get("expert_model_parallel_size", 1),
            }
        }
    else:
        layout = _verl_parallel(folder)
    return finish(
        checkpoint,
        megatron,
        args,
        {
            "format": "torch_dist (dist_checkpointing)",
            "iteration": saved.get("iteration"),
            **layout,
            "files": len(files),
            "chunks": len(chunks),
            "skipped": dict(skipped),
        },
    )

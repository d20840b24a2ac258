"""Megatron-LM's legacy `torch` checkpoint format: one file per model-parallel rank.

    latest_checkpointed_iteration.txt      "2000" or "release"
    iter_0002000/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt

TT is the tensor-parallel rank, PPP the pipeline stage (when there are several), EEE the expert rank
(when experts are split). Each file holds `args` and `model`, or `model0`..`modelV` with virtual
pipeline stages; layer numbers inside are local to the (virtual) stage and expert numbers local to
the expert rank. This module renumbers them and places each rank's slice, so the checkpoint reads
as whole Megatron tensors; `megatron_hf` names them as Hugging Face does, by the family's rules. The shared parts
(finding the iteration, the config from `args`) serve the torch_dist reader too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import tempfile
import weakref
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import dtypes
from ..errors import CheckpointError, read_json
from ..names import megatron_rules
from . import megatron_hf
from .base import Checkpoint, Piece, SourceTensor, deduplicate, load_archive
from .placements import Block
from .torch_archives import StoredTensor

if TYPE_CHECKING:
    import torch

LAYOUT = "megatron"
TRACKER = "latest_checkpointed_iteration.txt"
RANK_FOLDER = re.compile(r"mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")
RANK_FILES = ("model_optim_rng.pt", "model_rng.pt", "model.pt")  # model.pt: verl before dist_ckpt
LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
MTP_LEFT_OUT = "multi-token prediction layer tensors (mtp.*)"
LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")


def iteration_folder(src: Path, iteration: int | None = None) -> Path:
    """The folder of one saved iteration: SRC itself, or the one the tracker file (or --iteration) names."""
    tracker = src / TRACKER
    if iteration is None and not tracker.is_file():
        return src
    if iteration is None:
        text = tracker.read_bytes().decode(errors="replace").strip()  # (a damaged file may hold anything)
        if text != "release" and not text.isdigit():
            raise CheckpointError(f"{tracker}: holds {text!r}, not an iteration number; pass --iteration N")
        iteration, said = (None if text == "release" else int(text)), f"{tracker.name} names {text}"
    else:
        said = f"--iteration {iteration} asks for it"
    # Megatron-LM saves iter_0000010/ (or release/), verl global_step_10/.
    names = ["release"] if iteration is None else [f"iter_{iteration:07d}", f"global_step_{iteration}"]
    folder = next((src / name for name in names if (src / name).is_dir()), src / names[0])
    if not folder.is_dir():
        saved = sorted(p.name for pattern in ("iter_*", "global_step_*", "release") for p in src.glob(pattern))
        raise CheckpointError(
            f"{folder}: missing, but {said}; saved here: {', '.join(saved) or 'no iteration'}. "
            "Pass --iteration N with one of them"
        )
    return folder


def rank_files(folder: Path) -> dict[tuple[int, int | None, int | None], Path]:
    files = {}
    for sub in sorted(folder.glob("mp_rank_*")):
        match = RANK_FOLDER.match(sub.name)
        found = next((sub / f for f in RANK_FILES if (sub / f).is_file()), None)
        if match and found:
            files[tuple(int(g) if g is not None else None for g in match.groups())] = found
    return files


def find_folder(src: Path, iteration: int | None = None) -> Path | None:
    """The folder of mp_rank_* folders: the iteration folder, or (older verl) its model/ or actor/model/."""
    folder = iteration_folder(src, iteration)
    candidates = (folder, folder / "model", folder / "actor" / "model", folder / "critic" / "model")
    return next((c for c in candidates if rank_files(c)), None)


def model_chunks(state: Any) -> dict[str, dict]:
    """{"model" or "model0".."modelV": state dict}. Megatron-LM saves a dict holding those keys (and
    args, optimizer, RNG state); older verl saved a plain list of the virtual stages' state dicts."""
    if isinstance(state, list):
        return {"model": state[0]} if len(state) == 1 else {f"model{i}": sd for i, sd in enumerate(state)}
    return {k: v for k, v in state.items() if re.fullmatch(r"model\d*", k)}


def plain_args(args: Any, where: Path) -> dict[str, Any]:
    if isinstance(args, argparse.Namespace):
        return vars(args)
    if isinstance(args, dict):
        return args
    raise CheckpointError(
        f"{where}: holds no Megatron `args`, where the parallel layout and model sizes are "
        "recorded; unshard reads checkpoints saved by Megatron-LM's save_checkpoint"
    )


class MegatronCheckpoint(Checkpoint):
    """Hugging Face tensors over Megatron files; re-cut when a config names another vocabulary size or counts other
    MTP layers."""

    megatron: dict[str, SourceTensor]
    model_type: str
    shapes: megatron_rules.Shapes
    _made_config_folder: weakref.finalize | None = None  # removes it; at exit, or at close when sooner
    layers: int = 0  # the model's, after which its MTP layers are numbered
    mtp_layers: int | None = None  # how many MTP layers the config counts, where the tensors hold some

    def close(self) -> None:
        if self._made_config_folder is not None:
            self._made_config_folder()
        super().close()

    def fit_config(self, config: dict[str, Any] | None) -> None:
        if config is None:
            return
        model_type = config.get("model_type", self.model_type)
        vocab = config.get("vocab_size", self.shapes.vocab)
        mtp = config.get("num_nextn_predict_layers") if self.mtp_layers is not None else None
        if (model_type, vocab, mtp) != (self.model_type, self.shapes.vocab, self.mtp_layers):
            self.model_type, self.shapes = model_type, dataclasses.replace(self.shapes, vocab=vocab)
            self.name_tensors(config)
            self.facts.update(architecture=model_type, vocab_size=vocab)

    def name_tensors(self, config: dict[str, Any] | None) -> None:
        """The Hugging Face tensors, by the family's rules; MTP layers (mtp.*, trained beside the model) as the layers
        after the model's, as the Hub's checkpoints hold them (megatron_rules.MTP_LAYER), where the family maps them
        and the config (None: the args') counts them; otherwise left out, with a note."""
        where, megatron = str(self.path), self.megatron
        mtp = [name for name in megatron if name.startswith("mtp.")]
        count = len({name.split(".")[2] for name in mtp})
        said = config.get("num_nextn_predict_layers") if config is not None else count
        skipped = {k: v for k, v in self.facts.get("skipped", {}).items() if not k.startswith(MTP_LEFT_OUT)}
        mapped = megatron_rules.has_mtp_layers(megatron_hf.family_of(self.model_type, where).megatron.rules)
        if mtp and mapped and said == count:
            megatron = {megatron_rules.mtp_as_layer(name, self.layers): tensor for name, tensor in megatron.items()}
        elif mtp:
            why = f"{self.model_type}'s transformers class has none"
            if mapped:
                why = f"the config counts {said} (num_nextn_predict_layers)"
            megatron = {name: tensor for name, tensor in megatron.items() if name not in mtp}
            skipped[f"{MTP_LEFT_OUT}: {why}"] = len(mtp)
        self.mtp_layers = said if mtp else None
        self.facts["skipped"] = skipped
        self.tensors, self.stacks = megatron_hf.to_hf(megatron, self.model_type, self.shapes, where)


def finish(
    checkpoint: MegatronCheckpoint,
    megatron: dict[str, SourceTensor],
    args: dict[str, Any] | None,
    facts: dict[str, Any],
) -> MegatronCheckpoint:
    """Name the Megatron tensors as Hugging Face does, and find or make the config folder.

    Sizes and family come from Megatron-LM's `args`; without them (verl saves none), from the
    Hugging Face config saved beside the checkpoint.
    """
    where = str(checkpoint.path)
    padded = megatron.get("embedding.word_embeddings.weight", megatron.get("output_layer.weight"))
    if padded is None:
        raise CheckpointError(f"{where}: no embedding or output layer found; a pipeline stage's files are missing")
    checkpoint.hf_folder = _hf_folder(checkpoint.path)
    config = None
    if checkpoint.hf_folder is not None:
        config = read_json(checkpoint.hf_folder / "config.json", "restore it from the run")
    if args is not None:
        vocab = args.get("vocab_size") or padded.shape[0]
        model_type = megatron_hf.model_type_from_args(args, where)
        shapes = megatron_rules.shapes_from_args(args, vocab)
    elif config is not None:
        model_type, shapes = config.get("model_type"), megatron_rules.shapes_from_config(config)
    else:
        raise CheckpointError(
            f"{where}: holds no Megatron-LM args and has no huggingface/config.json beside it; "
            "unshard needs one of them for the model's sizes"
        )
    checkpoint.megatron, checkpoint.model_type, checkpoint.shapes = megatron, model_type, shapes
    checkpoint.layers = (args or {}).get("num_layers") or (config or {}).get("num_hidden_layers", 0)
    checkpoint.facts.update(facts)
    checkpoint.name_tensors(config)
    checkpoint.facts.update(architecture=model_type, vocab_size=shapes.vocab, padded_vocab_size=padded.shape[0])
    if checkpoint.hf_folder is None:
        dtype = "bfloat16" if args.get("bf16") else "float16" if args.get("fp16") else "float32"
        try:
            config = megatron_hf.hf_config(args, model_type, shapes.vocab, dtype)
        except CheckpointError as error:  # (what the args say that the family's class cannot hold)
            raise CheckpointError(f"{where}: {error}") from None
        folder = Path(tempfile.mkdtemp(prefix="unshard-megatron-config-"))
        checkpoint._made_config_folder = weakref.finalize(checkpoint, shutil.rmtree, folder, True)
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        checkpoint.hf_folder = folder
        checkpoint.facts["config"] = f"made from the checkpoint's args ({model_type})"
    return checkpoint


def _hf_folder(folder: Path) -> Path | None:
    """verl saves a Hugging Face folder beside its Megatron checkpoint (`huggingface/`)."""
    for candidate in (folder / "huggingface", folder.parent / "huggingface"):
        if (candidate / "config.json").is_file():
            return candidate
    return None


def layer_offsets(chunks: dict[tuple[int, int], set[int]]) -> dict[tuple[int, int], int]:
    """First global layer of each (virtual stage, pipeline stage): Megatron numbers layers through the
    stages in that order, virtual stage first. Counting each chunk's layers also covers uneven splits."""
    offsets, next_layer = {}, 0
    for key in sorted(chunks):
        offsets[key] = next_layer
        next_layer += len(chunks[key])
    return offsets


@dataclasses.dataclass(frozen=True)
class _Grid:
    """The model-parallel sizes: tensor, pipeline, expert, and the experts' tensor parallelism."""

    tp: int
    pp: int
    ep: int
    etp: int

    def coordinates(self, rank: tuple) -> tuple[int, int, int]:
        """(tp, pp, ep) of a file name: the second number is the stage with PP > 1, else the expert rank."""
        t, second, third = rank
        if self.pp > 1:
            return t, second or 0, third or 0
        return t, 0, second or 0


def open_folder(src: Path, iteration: int | None = None) -> MegatronCheckpoint:
    folder = find_folder(src, iteration)
    if folder is None:
        raise CheckpointError(
            f"{iteration_folder(src, iteration)}: no mp_rank_*/model_optim_rng.pt here; "
            "pass the Megatron checkpoint folder or one of its iter_* folders"
        )
    files = rank_files(folder)
    saved, maps = {}, {}
    for rank, path in files.items():
        saved[rank] = load_archive(path, maps)
    first_rank = min(saved)
    first = saved[first_rank]
    args = plain_args(first["args"], files[first_rank]) if isinstance(first, dict) and "args" in first else None
    grid = _grid(args, files, first_rank)
    iterations = {state.get("iteration") for state in saved.values() if isinstance(state, dict)}
    if len(iterations) > 1:
        raise CheckpointError(
            f"{folder}: the rank files come from different iterations {sorted(iterations)}; "
            "copy the folder again from one save"
        )
    _check_every_rank(folder, files, grid)
    states = {rank: model_chunks(state) for rank, state in saved.items()}
    chunk_keys = sorted({k for s in states.values() for k in s})
    if not chunk_keys:
        raise CheckpointError(f"{files[first_rank]}: holds no `model` state; is this an optimizer-only file?")
    for rank, state in states.items():
        for chunk in state.values():
            _split_grouped_experts(chunk, ((args or {}).get("num_experts") or 0) // grid.ep, files[rank])
    megatron = _whole_tensors(folder, files, states, chunk_keys, grid, args)
    checkpoint = MegatronFiles(
        layout=LAYOUT, path=folder, tensors={}, maps=maps, states={files[rank]: state for rank, state in states.items()}
    )
    return finish(
        checkpoint,
        megatron,
        args,
        {
            "format": "torch (legacy: one file per rank)" if args else "verl mp_rank_*/model.pt (no Megatron-LM args)",
            "iteration": next(iter(iterations), None),
            "parallel": {
                "tensor": grid.tp,
                "pipeline": grid.pp,
                "virtual_pipeline": len(chunk_keys),
                "expert": grid.ep,
                "expert_tensor": grid.etp,
            },
            "files": len(files),
        },
    )


def _grid(args: dict | None, files: dict[tuple, Path], first_rank: tuple) -> _Grid:
    if args is not None:
        tp = args.get("tensor_model_parallel_size", 1)
        pp = args.get("pipeline_model_parallel_size", 1)
        ep = args.get("expert_model_parallel_size", 1)
    else:  # older verl: no args; the folder names say TP and PP (that verl had no expert parallelism)
        tp, pp, ep = 1 + max(r[0] for r in files), 1 + max(r[1] or 0 for r in files), 1
    etp = (args or {}).get("expert_tensor_parallel_size") or tp
    if etp not in (1, tp):
        raise CheckpointError(
            f"{files[first_rank]}: experts split over {etp} tensor-parallel ranks, neither 1 nor "
            f"the TP size {tp}; unshard cannot place those slices yet, please report it"
        )
    return _Grid(tp, pp, ep, etp)


def _check_every_rank(folder: Path, files: dict[tuple, Path], grid: _Grid) -> None:
    """Every (tensor rank, stage) must be there, and every expert rank."""
    found = {grid.coordinates(rank) for rank in files}
    missing_tp_pp = {(t, p) for t in range(grid.tp) for p in range(grid.pp)} - {(t, p) for t, p, _ in found}
    missing_ep = set(range(grid.ep)) - {e for _, _, e in found}
    if missing_tp_pp or missing_ep:
        what = (
            f"tensor rank {min(missing_tp_pp)[0]}, stage {min(missing_tp_pp)[1]}"
            if missing_tp_pp
            else f"expert rank {min(missing_ep)}"
        )
        raise CheckpointError(
            f"{folder}: no mp_rank_* file for {what} (the args say TP={grid.tp}, PP={grid.pp}, "
            f"EP={grid.ep}); copy every mp_rank_* folder of the iteration"
        )


def _whole_tensors(
    folder: Path,
    files: dict[tuple, Path],
    states: dict[tuple, dict],
    chunk_keys: list[str],
    grid: _Grid,
    args: dict | None,
) -> dict[str, SourceTensor]:
    """Megatron's whole tensors, with global layer and expert numbers, each from its ranks' slices."""
    layers: dict[tuple[int, int], set[int]] = defaultdict(set)
    for rank, state in states.items():
        for vp, key in enumerate(chunk_keys):
            for name in state.get(key, {}):
                match = LAYER.match(name.removeprefix("module."))
                if match:
                    layers[(vp, grid.coordinates(rank)[1])].add(int(match.group(1)))
    offsets = layer_offsets(layers)
    total = sum(len(v) for v in layers.values())
    if (args or {}).get("num_layers") and total != args["num_layers"]:
        raise CheckpointError(
            f"{folder}: the files hold {total} layers, the args say {args['num_layers']}; "
            "a pipeline stage's files are missing"
        )
    pieces: dict[str, list[Piece]] = defaultdict(list)
    shapes: dict[str, tuple[int, ...]] = {}
    found_dtypes: dict[str, dtypes.DType] = {}
    local_experts = ((args or {}).get("num_experts") or 0) // grid.ep
    # fc1 is [gate; up] per slice when gated: what --swiglu says, or (no args) what every family has.
    gated = bool(args.get("swiglu") or args.get("quick_geglu")) if args else True
    for rank, state in states.items():
        t, p, e = grid.coordinates(rank)
        for vp, key in enumerate(chunk_keys):
            for local_name, tensor in state.get(key, {}).items():
                if not hasattr(tensor, "dtype") or local_name.endswith("_extra_state"):  # (not a tensor)
                    continue
                name = local_name.removeprefix("module.")  # a DDP wrapper's prefix
                name = LAYER.sub(lambda m: f"decoder.layers.{int(m.group(1)) + offsets[(vp, p)]}.", name)  # noqa: B023
                expert = LOCAL_EXPERT.search(name)
                if expert:
                    name = LOCAL_EXPERT.sub(f".mlp.experts.{e * local_experts + int(expert.group(1))}.", name)
                parts, index = (grid.etp, t % grid.etp) if expert else (grid.tp, t)
                blocks, shape = tp_blocks(
                    tuple(tensor.shape),
                    megatron_rules.tp_dim(name, tensor.shape[0] if len(tensor.shape) else None, args),
                    parts,
                    index,
                    gated and ("linear_fc1.weight" in name or "linear_fc1.bias" in name),
                )
                pieces[name] += [Piece(files[rank], f"{key}/{local_name}", block) for block in blocks]
                shapes[name], found_dtypes[name] = shape, dtypes.of(tensor.dtype)
    return {
        name: SourceTensor(name, shapes[name], found_dtypes[name], deduplicate(name, shapes[name], found))
        for name, found in pieces.items()
    }


GROUPED = re.compile(r"^(.*\.mlp\.experts\.)weight([12])$")
TE_GROUPED = re.compile(r"\.mlp\.experts\.linear_fc[12]\.weight\d+$")


def _split_grouped_experts(state: dict[str, Any], local_experts: int, where: Path) -> None:
    """GroupedMLP's experts (--moe-grouped-gemm, the legacy GroupedMLP) as SequentialMLP's, in place.

    GroupedMLP keeps a rank's experts in two matrices, weight1 [hidden, experts x fc1 rows] and weight2 [experts x
    fc2 columns, hidden], read as [experts, hidden, fc1 rows] and [experts, fc2 columns, hidden]: each expert's
    matrix is the transpose of SequentialMLP's `local_experts.K.linear_fc1.weight` (and fc2's). Each becomes a
    strided view of the same bytes, so the rest of the reader sees SequentialMLP's names and shapes."""
    for name in [n for n in state if TE_GROUPED.search(n)][:1]:
        raise CheckpointError(
            f"{where}: holds Transformer Engine's grouped experts ({name}), which unshard does not read from the "
            "legacy torch format yet; save the checkpoint with --ckpt-format torch_dist, which unshard reads"
        )
    for name in [n for n in state if GROUPED.match(n)]:
        prefix, which = GROUPED.match(name).groups()
        matrix = state.pop(name)
        if not local_experts or matrix.shape[0 if which == "2" else 1] % local_experts:
            raise CheckpointError(
                f"{where}: {name} {tuple(matrix.shape)} does not hold {local_experts} experts as the args say"
            )
        for k, expert in enumerate(_expert_views(matrix, local_experts, transposed_rows=which == "1")):
            state[f"{prefix}local_experts.{k}.linear_fc{which}.weight"] = expert


def _expert_views(matrix, experts: int, transposed_rows: bool) -> list:
    """Each expert's matrix of a GroupedMLP weight, transposed (a view: no byte is copied)."""
    rows, cols = matrix.shape
    per = (rows * cols) // experts
    shape = (rows, cols // experts) if transposed_rows else (rows // experts, cols)  # (one expert's, as stored)
    if isinstance(matrix, StoredTensor):
        if not matrix.is_contiguous():
            raise CheckpointError("a GroupedMLP weight is saved as a view of another tensor; please report it")
        return [
            StoredTensor(matrix.storage, matrix.offset + k * per, (shape[1], shape[0]), (1, shape[1]))
            for k in range(experts)
        ]
    return [expert.t() for expert in matrix.contiguous().view(experts, *shape)]


def tp_blocks(local: tuple[int, ...], dim: int | None, parts: int, index: int, gated: bool):
    """Where tensor-parallel rank `index` of `parts` puts its slice, and the whole tensor's shape.

    A gated MLP's fc1 slice is [gate slice; up slice]; the whole tensor is laid out [gate; up].
    """
    if dim is None or parts == 1:
        return [Block.whole(local)], local
    whole = tuple(n * parts if d == dim else n for d, n in enumerate(local))
    if not gated:
        offsets = tuple(n * index if d == dim else 0 for d, n in enumerate(local))
        return [Block.placed(offsets, local)], whole
    half = local[0] // 2
    sizes = (half, *local[1:])
    rest = (0,) * (len(local) - 1)
    return [
        Block((0, *rest), (index * half, *rest), sizes),
        Block((half, *rest), (parts * half + index * half, *rest), sizes),
    ], whole


class MegatronFiles(MegatronCheckpoint):
    def loaded(self, piece: Piece) -> torch.Tensor | StoredTensor:
        chunk, name = piece.key.split("/", 1)
        return self.states[piece.file][chunk][name]

"""verl's FSDP checkpoint (`--to fsdp --world-size N`): the rank files a run of N ranks resumes from, or starts at a
new world size from.

    OUT/actor/model_world_size_N_rank_r.pt   torch.save of rank r's `model.state_dict()` under FSDP2: each tensor a
                                            DTensor, its rows cut between the ranks as FSDP2 cuts them (Shard(0):
                                            ceil(rows / N) a rank, the last ranks fewer or none), on a device mesh
                                            ("fsdp",) over the N ranks, as verl builds it; with --fsdp-size F < N
                                            (verl's fsdp_size: HSDP), cut over F ranks and replicated over N / F
                                            groups, on verl's mesh ("ddp", "fsdp") of N / F x F (Replicate, Shard(0))
    OUT/actor/fsdp_config.json              {"FSDP_version": 2, "world_size": N}, as verl >= 0.4.1 writes it
    OUT/actor/huggingface/                  the model's config and tokenizer, as verl keeps them
(critic/ instead of actor/ for a value model: a ...ForTokenClassification.)

torch.save wants the state dict in memory. Here torch.save itself writes each file's skeleton first: the real
DTensors, device mesh and pickle of the user's torch, with the local tensors fake (torch.serialization.skip_data
leaves their bytes' places empty). Each tensor's rows then go straight into their rank's places a band at a time, as
the safetensors files are written, and each record's CRC-32 (computed as its bytes go by) is put in the archive's
directory once the file is complete. So memory is a band, however large the model, and the files are what
torch.save would have written of the same state dict (but for the module versions `nn.Module.state_dict` attaches
as `_metadata`, which `load_state_dict` does without: no model is built here).
"""

from __future__ import annotations

import io
import json
import os
import struct
import tempfile
import threading
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UnshardError
from ..sources import torch_archives
from ..types import FormatRequest, Group, OutputTensor, Plan
from .dcp import model_config, tied_head
from .hf_folder import HFFolder, copy_model_files
from .safetensors import Part, SafetensorsFile, TensorBeingWritten, bytes_of

SUMMARY_KEY = "fsdp"
FSDP_VERSION = 2
MESH_DIMS = ("ddp", "fsdp")  # verl's names for the mesh's dimensions (the first only where HSDP replicates)
WORLD_GROUP = "0"  # the default process group's name: a mesh over every rank uses it, and the loading run finds it
DESCRIPTOR = b"PK\x07\x08"  # a zip record's data descriptor, after its bytes (torch's writer streams its records)


def rank_file(role: str, world: int, rank: int) -> str:
    return f"{role}/model_world_size_{world}_rank_{rank}.pt"


def plan_sink(request: FormatRequest) -> FSDPRankFiles:
    """--to fsdp: each output cut into its ranks' rows, each rank's rows placed in its rank's file."""
    options = request.options
    if options.quantize or options.gguf:
        raise UnshardError("--to fsdp writes the weights as they are: leave out --quantize and --gguf-type")
    if request.separate_adapter:
        raise UnshardError(f"{request.where}: --to fsdp writes the model's weights only: use --lora merge")
    world, shards = options.world_size, options.fsdp_size or options.world_size
    if world < 1:
        raise UnshardError("--to fsdp needs --world-size N: the number of ranks of the run that loads it")
    if not 0 < shards <= world or world % shards:
        raise UnshardError(
            f"--fsdp-size {options.fsdp_size}: give a divisor of --world-size {world} (the ranks each tensor is cut "
            "over, as verl's fsdp_size; the run replicates it over world-size / fsdp-size groups)"
        )
    config = model_config(request, "--to fsdp")
    architecture = (config.get("architectures") or [""])[0]
    role = "critic" if architecture.endswith("ForTokenClassification") else "actor"
    files = [rank_file(role, world, rank) for rank in range(world)]
    outputs = [o for g in request.groups.values() for o in g.outputs]
    placed: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for group in request.groups.values():
        sharded = []
        for output in group.outputs:
            if not output.shape:
                raise UnshardError(
                    f"{request.where}: --to fsdp: {output.name} is a scalar, which FSDP does not shard; "
                    "write this model --to dcp"
                )
            rows = output.shape[0]
            per_rank = max(1, -(-rows // shards))
            stored = tuple(
                OutputTensor(
                    f"{output.name}@{rank}",
                    (max(0, min(per_rank, rows - rank % shards * per_rank)), *output.shape[1:]),
                    output.dtype,
                )
                for rank in range(world)
            )
            placed.update((s.name, files[rank]) for rank, s in enumerate(stored))
            shapes[output.name] = output.shape
            encoding = RankShards(stored, per_rank, shards)
            sharded.append(OutputTensor(output.name, output.shape, output.dtype, encoding))
        group.outputs = sharded
    tied = tied_head(config, [o.name for o in outputs])
    return FSDPRankFiles(role, world, shards, options.mesh_device, shapes, tied, placed)


@dataclass(frozen=True)
class RankShards:
    """How one output tensor is stored (a types.Encoding): as one shard per rank, rank r's the rows
    [s * per_rank, (s + 1) * per_rank) of its shard s = r % shards (HSDP's ranks of one shard hold the same rows),
    each band's rows given to the shards they fall in."""

    stored: tuple[OutputTensor, ...]  # by rank
    per_rank: int
    shards: int
    rows_per_band = 1
    surveys = False

    def encode(self, band, start: int) -> dict[str, Any]:
        end, per = start + band.shape[0], self.per_rank
        pieces = {}
        for shard in range(start // per, min(self.shards, -(-end // per))):
            low, high = max(start, shard * per), min(end, (shard + 1) * per)
            if high > low:
                for rank in range(shard, len(self.stored), self.shards):
                    pieces[self.stored[rank].name] = band[low - start : high - start]
        return pieces


class FSDPRankFiles(HFFolder):
    """verl's rank files as an output format (a types.Sink): every file holds a shard of every tensor, so each group
    is listed under every file and its stored tensors are `placed` by rank."""

    def __init__(
        self,
        role: str,
        world: int,
        shards: int,
        device: str,
        shapes: dict[str, tuple[int, ...]],
        tied: dict[str, str],
        placed: dict[str, str],
    ):
        self.role, self.world, self.shards, self.device, self.shapes = role, world, shards, device, shapes
        self.tied = tied  # the embedding -> the head that is it (the state dict has both)
        self.placed = placed
        self._sizes: dict[str, int] = {}

    def lay_out(self, groups: dict[str, Group], max_shard_size: int | str) -> dict[str, list[Group]]:
        return {rank_file(self.role, self.world, rank): list(groups.values()) for rank in range(self.world)}

    def _state(self, rank: int, tensors: list[OutputTensor]) -> tuple[OrderedDict, Any]:
        tensors = [(t, self.shapes[_name(t)]) for t in tensors]
        return skeleton_state(rank, self.world, self.shards, self.device, tensors, self.tied)

    def open(self, path: Path, tensors: list[OutputTensor]) -> RankFile:
        path.parent.mkdir(exist_ok=True)
        return RankFile(path, *self._state(_rank(path.name), tensors))

    def file_size(self, filename: str, tensors: list[OutputTensor]) -> int:
        if filename not in self._sizes:
            with tempfile.TemporaryDirectory() as scratch:  # (a skeleton holds no tensor's bytes: a sparse file)
                path = Path(scratch) / "skeleton.pt"
                save_skeleton(path, self._state(_rank(filename), tensors)[0])
                self._sizes[filename] = path.stat().st_size
        return self._sizes[filename]

    def read_back(self, path: Path) -> WrittenRankFile:
        return WrittenRankFile(path, _rank(path.name))

    def finish(self, plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None):
        config = {"FSDP_version": FSDP_VERSION, "world_size": self.world}
        (folder / self.role / "fsdp_config.json").write_text(json.dumps(config))
        (folder / self.role / "huggingface").mkdir()
        copied = copy_model_files(
            plan.config_folder, folder / self.role / "huggingface", plan.dtype.name, plan.config_updates
        )
        return [f"{self.role}/fsdp_config.json", *(f"{self.role}/huggingface/{name}" for name in copied)], []

    def notes(self) -> list[str]:
        hsdp = f" (HSDP: fsdp_size {self.shards})" if self.shards < self.world else ""
        return [
            f"verl's FSDP checkpoint ({self.role}/) for {self.world} ranks{hsdp}, a device mesh of {self.device}: "
            "the model's weights only (resume with checkpoint.load_contents=[model]: the optimizer starts afresh)"
        ]

    def summary(self) -> dict[str, Any]:
        said = {"world_size": self.world, "fsdp_size": self.shards, "role": self.role, "mesh_device": self.device}
        return {SUMMARY_KEY: said}

    def card(self) -> tuple[list[str], list[str]]:
        return ["fsdp"], []


def summary_lines(summary: dict[str, Any]) -> list[str]:
    world, shards = summary["world_size"], summary.get("fsdp_size") or summary["world_size"]
    hsdp = f" (each tensor cut over {shards}, replicated {world // shards} times)" if shards < world else ""
    return [
        f"output: verl FSDP rank files ({summary['role']}/), {world} ranks{hsdp}, "
        f"a {summary['mesh_device']} device mesh"
    ]


def _name(stored: OutputTensor) -> str:
    return stored.name.rpartition("@")[0]


def _rank(filename: str) -> int:
    return int(filename.rpartition("_rank_")[2].removesuffix(".pt"))


def skeleton_state(
    rank: int, world: int, shards: int, device: str, tensors, tied: dict[str, str]
) -> tuple[OrderedDict, Any]:
    """Rank `rank`'s state dict as FSDP2 gives it, of DTensors whose local tensors are fake (no bytes): `tensors`
    (stored shard, whole shape) in order, and a tied head under its own name too, the same DTensor (so saved once);
    and the rank's device mesh, whose own tensors (its ranks) RankFile writes."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    mesh = _device_mesh(rank, world, shards, device)
    # (one placement for all, as FSDP2's parameters share theirs)
    placements = (Shard(0),) if shards == world else (Replicate(), Shard(0))
    state = OrderedDict()
    with FakeTensorMode():
        for stored, shape in tensors:
            local = torch.empty(stored.shape, dtype=stored.dtype.torch)
            stride = torch.empty(shape, device="meta").stride()
            spec = DTensorSpec(mesh, placements, TensorMeta(torch.Size(shape), stride, stored.dtype.torch))
            state[_name(stored)] = DTensor(local, spec, requires_grad=False)
    state.update((head, state[embedding]) for embedding, head in tied.items() if embedding in state)
    return state, mesh


def _device_mesh(rank: int, world: int, shards: int, device: str):
    """Rank `rank`'s device mesh as verl's run makes it: ("fsdp",) over every rank, or HSDP's ("ddp", "fsdp") of
    world / shards x shards. Its process groups are named as a run names them that makes none before the mesh (the
    default group "0" for a dimension over every rank; else numbered as torch makes them, each dimension's in turn):
    loading compares meshes by their ranks, shape and names, not their groups'."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    replicas = world // shards
    ranks = torch.arange(world).reshape(replicas, shards) if replicas > 1 else list(range(world))
    names = MESH_DIMS if replicas > 1 else MESH_DIMS[1:]
    try:
        mesh = DeviceMesh(device, ranks, mesh_dim_names=names, _init_backend=False, _rank=rank)
    except TypeError as e:
        raise UnshardError(
            f"--to fsdp: this torch ({torch.__version__}) makes device meshes otherwise ({e}): upgrade torch"
        ) from None
    # (the ddp groups, one per shard, are made first; then the fsdp groups, one per replica)
    mesh._dim_group_names = (
        [str(1 + rank % shards), str(1 + shards + rank // shards)] if replicas > 1 else [WORLD_GROUP]
    )
    return mesh


def save_skeleton(path: Path, state: OrderedDict) -> None:
    """torch.save of the state with its local tensors' bytes left out (their places empty, their CRC-32s 0)."""
    import torch

    with torch.serialization.skip_data(materialize_fake_tensors=True):
        torch.save(state, path)


def _mesh_records(mesh) -> list[bytes]:
    """The bytes of the mesh's own tensors (its ranks), in the order torch.save stores them."""
    import torch

    saved = io.BytesIO()
    torch.save(mesh, saved)
    archive = zipfile.ZipFile(saved)
    return [archive.read(i) for i in archive.infolist() if i.filename.partition("/")[2].startswith("data/")]


class RankFile(SafetensorsFile):
    """One rank file: its skeleton written by torch.save, then each shard's bytes at its place (from any thread, in
    any order, a shard's parts in order), and each record's CRC-32 put in the directory once all are written."""

    def __init__(self, path: Path, state: OrderedDict, mesh):
        save_skeleton(path, state)
        self.path, self._data_start, self._lock = path, 0, threading.Lock()
        self._fd = os.open(path, os.O_WRONLY)  # (not truncated: the skeleton is the file)
        layout = ArchiveLayout(path)
        self._records: dict[str, str] = {}  # stored name -> its record
        self._entries = {}
        seen: set[int] = set()
        for key, value in state.items():
            if id(value) not in seen:  # (a tied head's shard is its embedding's record)
                seen.add(id(value))
                record, name = layout.record_of(key), f"{key}@{_rank(path.name)}"
                self._records[name] = record
                local = value._local_tensor
                self._entries[name] = (None, tuple(local.shape), layout.start(record), layout.size(record))
        self.layout, self._crcs = layout, {}
        own = [r for r in layout.data_records() if r not in set(self._records.values())]
        records = _mesh_records(mesh)
        if [layout.size(r) for r in own] != [len(data) for data in records]:
            raise UnshardError(f"--to fsdp: torch's device mesh saves tensors unshard does not know: {own}")
        for record, data in zip(own, records):
            self._write_at(layout.start(record), memoryview(data))
            self._crcs[record] = zlib.crc32(data)
        self._unwritten = set(self._entries)
        self._finished = False

    def tensor(self, name: str, dtype, shape: tuple[int, ...]) -> ShardBeingWritten:
        _, want_shape, start, size = self._entries[name]
        if tuple(shape) != want_shape:
            raise AssertionError(f"{self.path}: {name} is {want_shape} in the skeleton, got {shape}")
        return ShardBeingWritten(self, name, dtype, start, size)

    def _shard_written(self, name: str, crc: int) -> None:
        with self._lock:
            self._crcs[self._records[name]] = crc
        self._written(name)

    def _finish(self) -> None:
        """Each record's CRC-32 where the archive keeps it (its data descriptor, the central directory), once every
        shard is written."""
        if self._finished or self._unwritten:
            return
        for record, crc in self._crcs.items():
            for at in self.layout.crc_places(record):
                self._write_at(at, memoryview(struct.pack("<I", crc)))
        self._finished = True

    def sync(self) -> None:
        self._finish()
        super().sync()

    def close(self, check: bool = True) -> None:
        if check and self._fd >= 0:
            self._finish()
        super().close(check)


class ShardBeingWritten(TensorBeingWritten):
    """A shard written from parts in order, its CRC-32 computed as they go by."""

    crc = 0

    def write(self, part: Part) -> None:
        super().write(part)
        self.crc = zlib.crc32(bytes_of(part).cast("B"), self.crc)

    def close(self) -> None:
        if self.written != self.size:
            raise AssertionError(f"{self.name}: {self.written} of {self.size} bytes written")
        self.file._shard_written(self.name, self.crc)


class ArchiveLayout:
    """Where a torch.save archive keeps each record: its bytes, and its CRC-32 (in its data descriptor and in the
    central directory)."""

    def __init__(self, path: Path):
        with open(path, "rb") as file:
            archive = zipfile.ZipFile(file)
            infos = archive.infolist()
            self._records = {r.name.partition("/")[2]: r for r in torch_archives.records(path)}
            state = torch_archives.read(file, path=path)
            directory = archive.start_dir
            self._places: dict[str, tuple[int, ...]] = {}
            for info in infos:
                record = self._records[info.filename.partition("/")[2]]
                entry_length = 46 + len(info.filename.encode()) + len(info.extra) + len(info.comment)
                places = [directory + 16]
                file.seek(record.start + record.nbytes)
                if file.read(4) == DESCRIPTOR:
                    places.append(record.start + record.nbytes + 4)
                self._places[info.filename.partition("/")[2]] = tuple(places)
                directory += entry_length
        by_start = {r.start: n for n, r in self._records.items() if n.startswith("data/")}  # (each has a header)
        self._keys = {key: by_start[value._local_tensor.storage.start] for key, value in state.items()}

    def record_of(self, key: str) -> str:
        return self._keys[key]

    def data_records(self) -> list[str]:
        return [name for name in self._records if name.startswith("data/")]

    def start(self, record: str) -> int:
        return self._records[record].start

    def size(self, record: str) -> int:
        return self._records[record].nbytes

    def crc_places(self, record: str) -> tuple[int, ...]:
        return self._places[record]


class WrittenRankFile:
    """A written rank file read back (--verify): each shard's bytes where the archive's pickle places them (read
    without torch, as unshard reads verl's files)."""

    def __init__(self, path: Path, rank: int):
        self.path = path
        with open(path, "rb") as file:
            state = torch_archives.read(file, path=path)
        self.entries, self._places, seen = {}, {}, set()
        for key, value in state.items():
            local = value._local_tensor
            if id(value) in seen:
                continue
            seen.add(id(value))
            name = f"{key}@{rank}"
            self.entries[name] = (local.dtype.safetensors, tuple(local.shape))
            self._places[name] = (
                local.storage.start + local.offset * local.dtype.itemsize,
                local.numel() * local.dtype.itemsize,
            )

    def _bytes(self, name: str, offset: int, nbytes: int) -> bytes:
        at, size = self._places[name]
        with open(self.path, "rb", buffering=0) as f:
            return os.pread(f.fileno(), min(nbytes, size - offset), at + offset)

    def holds(self, name: str, parts) -> bool:
        at = 0
        for part in parts:
            data = bytes_of(part).cast("B")
            if not self.holds_at(name, at, data):
                return False
            at += data.nbytes
        return at == self.size_of(name)

    def holds_at(self, name: str, offset: int, data: memoryview) -> bool:
        return self._bytes(name, offset, data.nbytes) == bytes(data.cast("B"))

    def size_of(self, name: str) -> int:
        return self._places[name][1]

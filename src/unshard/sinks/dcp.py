"""A torch.distributed.checkpoint folder (`--to dcp`): the model's weights as the trainers that load DCP read them
(torchtitan, torchtune's distributed checkpointer, plain FSDP2 `set_model_state_dict` / `dcp.load`), at any world
size, since DCP reshards on load.

What DCP's own writer makes: `.distcp` files of torch.save archives, one per chunk of a tensor, and `.metadata`,
the pickled `Metadata` that places each chunk in its tensor (offsets) and in its file (byte range). DCP's writer
wants every tensor of a rank in memory; here each tensor is cut into chunks of whole rows (CHUNK_BYTES), as
FSDP2's row shards are, so memory is a chunk, however large the tensor. Each chunk is an encoding's band
(types.Encoding): assembled, then serialized by torch.save itself straight to its byte range, whose length is known
in advance (a torch.save archive's size follows from its dtype and shape: `archive_bytes`), so the file is written
by any thread in any order, as the safetensors files are.

Names: the Hugging Face names (`--names hf`, what FSDP2 on a transformers model loads), torchtitan's
(`--names torchtitan`, the family's `torchtitan_names`, Llama's q and k rows reordered per head for torchtitan's
interleaved rotary) or torchtune's (`--names torchtune`, the family's `torchtune_names`, nested under `model.` as
its DistributedCheckpointer saves a recipe's state; Phi-3's fused qkv_proj and gate_up_proj each written as the
separate tensors torchtune's model has). Only the weights: a trainer starts its optimizer afresh from
them.
"""

from __future__ import annotations

import functools
import io
import math
import os
import pickle
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import dtypes, families
from ..errors import UnshardError
from ..families.parts import Unsupported
from ..names import meta_rules, mtp_layers
from ..names.stacked import Stacked
from ..types import FormatRequest, Group, OutputTensor, Plan
from .hf_folder import HFFolder, copy_model_files
from .safetensors import FileBytes, Part, SafetensorsFile, bytes_of

SUMMARY_KEY = "dcp"
NAMES = ("hf", "torchtitan", "torchtune")
# (torchtune's DistributedCheckpointer nests the model's state dict under "model", which DCP flattens)
PREFIX = {"torchtune": "model."}
CHUNK_BYTES = 16 << 20  # of a tensor's rows per chunk: what a writing thread holds of it
METADATA = ".metadata"


def plan_sink(request: FormatRequest) -> DCPFolder:
    """--to dcp: each output given its DCP name and cut into chunks of whole rows (a scalar stays one chunk)."""
    options = request.options
    if options.quantize or options.gguf:
        raise UnshardError(
            "--to dcp writes the weights as they are: leave out --quantize and --gguf-type (and a .gguf OUT)"
        )
    if request.separate_adapter:
        raise UnshardError(f"{request.where}: --to dcp writes the model's weights only: use --lora merge")
    config = model_config(request, f"--names {options.names}" if options.names != "hf" else None)
    if options.names != "hf" and (text := config.get("text_config") or config).get("num_nextn_predict_layers"):
        mtp_layers.drop_shared_copies(request.groups, text["num_hidden_layers"])  # (the trainer's MTP layers share)
    outputs = [o.name for g in request.groups.values() for o in g.outputs]
    # (torchtune's tied head is the embedding's own weight: no name of its own)
    tied = tied_head(config, outputs) if options.names != "torchtune" else {}
    shapes = {o.name: o.shape for g in request.groups.values() for o in g.outputs}
    shapes.update((head, shapes[embedding]) for embedding, head in tied.items())
    renamed, stacked = _names(options.names, request, config, shapes)
    dcp_shapes = dict(stacked)

    def place(name: str) -> meta_rules.MetaName:
        return renamed.get(name) or meta_rules.MetaName(name)

    for group in request.groups.values():
        chunked_outputs = []
        for output in group.outputs:
            to = place(output.name)
            if to.parts:  # (rows of several of the trainer's tensors: each its own)
                pieces, start = [], 0
                for fqn, rows in to.parts:
                    pieces.append(Piece(fqn, start, rows, (0,) * len(output.shape)))
                    dcp_shapes[fqn], start = (rows, *output.shape[1:]), start + rows
                chunked_outputs.append(chunked(output, pieces))
                continue
            if to.tiled:  # (laid out per tile, from the rows of its aspect ratios: one chunk, the whole tensor)
                dcp_shapes[to.fqn] = to.tiled.trainer_shape(output.shape)
                chunked_outputs.append(chunked(output, [Piece(to.fqn, 0, output.shape[0], (0,) * 4)], tiled=to.tiled))
                continue
            if to.flat:  # (each row one axis: the trainer's Linear of transformers' Conv3d)
                dcp_shapes[to.fqn] = (output.shape[0], math.prod(output.shape[1:]))
                chunked_outputs.append(chunked(output, [Piece(to.fqn, 0, output.shape[0], (0, 0))], flat=True))
                continue
            also = [place(tied[output.name]).fqn] if output.name in tied else []
            if not to.stacked:
                shape = (output.shape[0], *to.turn.expert(output.shape[1:])) if to.turn else output.shape
                dcp_shapes.update(dict.fromkeys([to.fqn, *also], shape))
            dcp_shapes.update((fqn, (rows,)) for fqn, rows in to.zeros)
            head_dim = output.shape[0] // to.rotary_heads if to.rotary_heads else 0
            whole = Piece(to.fqn, 0, output.shape[0] if output.shape else 0, (*to.stacked, *(0,) * len(output.shape)))
            zeros = [(fqn, (0,), (rows,)) for fqn, rows in to.zeros]
            chunked_outputs.append(chunked(output, [whole], head_dim, zeros=zeros, also=also, turn=to.turn))
        group.outputs = chunked_outputs
    return DCPFolder(options.names, dcp_shapes)


def tied_head(config: dict[str, Any], outputs: list[str]) -> dict[str, str]:
    """{the embedding: the output head} where the head is the embedding (tie_word_embeddings): a Hugging Face folder
    stores it once, but the model's state dict, which DCP loads, has both names."""
    architectures = config.get("architectures") or [""]
    if "lm_head.weight" in outputs or not config.get("tie_word_embeddings", True):
        return {}
    if not architectures[0].endswith(("ForCausalLM", "ForConditionalGeneration")):
        return {}
    embeddings = [name for name in outputs if name.endswith("embed_tokens.weight")]
    return {embeddings[0]: "lm_head.weight"} if len(embeddings) == 1 else {}


def _names(
    names: str, request: FormatRequest, config: dict[str, Any], shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, meta_rules.MetaName], dict[str, tuple[int, ...]]]:
    """Output name -> where it goes in the checkpoint (none: under its own name); each stacked tensor's shape."""
    if names == "hf":
        return {}, {}
    if names not in NAMES:
        raise UnshardError(f"--names {names!r}: give one of {', '.join(NAMES)}")
    family = families.by_model_type(request.model_type)
    table = getattr(family, f"{names}_names") if family is not None else Unsupported("not a family unshard knows")
    if isinstance(table, Unsupported):
        what = family.name if family is not None else f"model_type {request.model_type!r}"
        raise UnshardError(
            f"{request.where}: --names {names}: {what}: {table.reason}; --names hf writes the Hugging Face names"
        )
    renamed, stacked = meta_rules.to_meta(table, family.name, shapes, config, request.where, names)
    prefix = PREFIX.get(names, "")
    renamed = {
        name: replace(
            to,
            fqn=prefix + to.fqn,
            zeros=tuple((prefix + fqn, rows) for fqn, rows in to.zeros),
            parts=tuple((prefix + fqn, rows) for fqn, rows in to.parts),
        )
        for name, to in renamed.items()
    }
    return renamed, {prefix + fqn: shape for fqn, shape in stacked.items()}


def model_config(request: FormatRequest, needed_by: str | None = None) -> dict[str, Any]:
    """The output's config.json (with the plan's changes); {} where there is none, an error where `needed_by` (the
    option that needs it) is given."""
    import json

    path = request.config_folder / "config.json" if request.config_folder else None
    if path is None or not path.is_file():
        if needed_by is None:
            return {}
        raise UnshardError(f"{request.where}: {needed_by} needs the model's config.json (pass --config-from)")
    return {**json.loads(path.read_text()), **request.config_updates}


@dataclass(frozen=True)
class Chunks:
    """How one output tensor is stored (a types.Encoding): as chunks of `rows_per_band` of its rows (the last of a
    piece, what is left), each one band, each a box of a DCP tensor (its name says which: `fqn@offsets`); q or k
    rows reordered within each head from halves (transformers' rotary) to interleaved pairs (Meta's, torchtitan's
    Llama), as each band holds whole heads; zeros written with the last band where the DCP tensor is padded (the
    rows of Megatron's padded vocabulary)."""

    stored: tuple[OutputTensor, ...]  # the chunks, in the order of the rows they hold; their copies; the zeros
    rows_per_band: int  # rows of a chunk
    head_dim: int = 0  # rows of a q or k head to reorder; 0: none
    padding: int = 0  # how many of `stored`, at its end, are zeros
    copies: int = 0  # times the chunks are stored again under other names (a tied weight's other name)
    turn: Stacked | None = None  # rows that are experts, turned back into the trainer's (gpt-oss's into Megatron's)
    flat: bool = False  # each row stored as one axis (the trainer's Linear of a Conv3d)
    tiled: meta_rules.Tiled | None = None  # the whole tensor, one band, laid out per tile (a tile embedding)
    surveys = False

    def encode(self, band, start: int) -> dict[str, Any]:
        import numpy as np

        if self.tiled is not None:
            return {self.stored[0].name: self.tiled.per_tile(band)}

        if self.flat:
            band = band.reshape(band.shape[0], -1)
        if self.turn is not None:
            band = self.turn.unturned(band)
        if self.head_dim:
            half = self.head_dim // 2
            band = band.reshape(-1, 2, half, *band.shape[1:]).swapaxes(1, 2).reshape(band.shape)
        # (a band is a whole number of chunks: one, unless chunks are smaller than an encoding's band)
        first, rows = start // self.rows_per_band, self.rows_per_band
        chunks = (len(self.stored) - self.padding) // (self.copies + 1)
        pieces = {
            self.stored[copy * chunks + first + i].name: band[i * rows : (i + 1) * rows]
            for copy in range(self.copies + 1)
            for i in range(-(-band.shape[0] // rows))
        }
        if self.padding and first + -(-band.shape[0] // rows) == chunks:  # (the last band)
            for zeros in self.stored[-self.padding :]:
                pieces[zeros.name] = np.zeros(zeros.shape, band.dtype)
        return pieces


@dataclass(frozen=True)
class Piece:
    """Rows [start, start + rows) of an output, placed in DCP tensor `fqn` from `offsets` on: the output's row axis
    is the last but its own other axes (a Megatron layer's tensor has the layer's number before)."""

    fqn: str
    start: int
    rows: int
    offsets: tuple[int, ...]


def chunked(
    output: OutputTensor,
    pieces: list[Piece],
    head_dim: int = 0,
    zeros=(),
    also=(),
    turn: Stacked | None = None,
    flat: bool = False,
    tiled: meta_rules.Tiled | None = None,
) -> OutputTensor:
    """The output with its encoding: each piece cut into chunks of whole rows, of CHUNK_BYTES at most where the
    rows allow (a scalar: itself, one chunk, no encoding); `zeros` (fqn, offsets, shape): boxes written as zeros;
    `also`: other DCP names the same chunks are stored under (a tied weight's); `turn`: each row an expert, stored
    as the trainer holds it (names.stacked); `flat`: each row stored as one axis; `tiled`: the whole tensor laid out
    per tile, one chunk (a tile embedding: small)."""
    if not output.shape:
        return output
    if tiled is not None:
        (piece,) = pieces
        stored = (OutputTensor(_chunk_name(piece.fqn, piece.offsets), tiled.trainer_shape(output.shape), output.dtype),)
        return replace(output, encoding=Chunks(stored, output.shape[0], tiled=tiled))
    row_bytes = max(1, output.nbytes_as_is // max(1, output.shape[0]))
    multiple = head_dim or 1
    most = max(multiple, CHUNK_BYTES // row_bytes // multiple * multiple)
    per_chunk = min(output.shape[0], most)
    if len(pieces) > 1:  # (chunks that divide every piece's rows, so no chunk holds two pieces)
        rows = math.gcd(*(piece.rows for piece in pieces))
        per_chunk = next(d for d in range(min(rows, most), 0, -1) if rows % d == 0 and d % multiple == 0)
    inner = turn.expert(output.shape[1:]) if turn is not None else output.shape[1:]  # (a chunk's row)
    inner = (math.prod(inner),) if flat else inner
    stored = []
    for piece in pieces:
        row_axis = len(piece.offsets) - (2 if flat else len(output.shape))
        for at in range(0, piece.rows, per_chunk) if piece.rows else (0,):
            offsets = list(piece.offsets)
            offsets[row_axis] += at
            shape = (1,) * row_axis + (min(per_chunk, piece.rows - at), *inner)
            stored.append(OutputTensor(_chunk_name(piece.fqn, offsets), shape, output.dtype))
    stored += [replace(c, name=f"{other}@{c.name.rpartition('@')[2]}") for other in also for c in list(stored)]
    stored += [OutputTensor(_chunk_name(fqn, offsets), shape, output.dtype) for fqn, offsets, shape in zeros]
    encoding = Chunks(tuple(stored), per_chunk, head_dim, len(zeros), len(also), turn, flat)
    return OutputTensor(output.name, output.shape, output.dtype, encoding)


def _chunk_name(fqn: str, offsets) -> str:
    return f"{fqn}@{','.join(map(str, offsets))}"


def chunk_place(stored: OutputTensor, output: OutputTensor) -> tuple[str, tuple[int, ...]]:
    """(fqn, offsets in the DCP tensor) of one stored chunk of an output."""
    if output.encoding is None:
        return output.name, (0,) * len(output.shape)
    fqn, _, offsets = stored.name.rpartition("@")
    return fqn, tuple(int(o) for o in offsets.split(",")) if offsets else ()


@functools.cache
def archive_bytes(dtype_name: str, shape: tuple[int, ...]) -> int:
    """Bytes torch.save writes for a tensor of this dtype and shape: the same for any values (its records have
    fixed lengths, its data is aligned from where its pickle ends), so found by saving zeros to nowhere."""
    import torch

    counted = _Counted()
    torch.save(torch.zeros(shape, dtype=getattr(torch, dtype_name)), counted)
    return counted.nbytes


class _Counted(io.RawIOBase):
    def __init__(self):
        self.nbytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        self.nbytes += n
        return n


class DCPFolder(HFFolder):
    """The DCP folder as an output format (a types.Sink): `.distcp` files laid out as the safetensors shards are (by
    --max-shard-size), `.metadata`, and the model's config and tokenizer beside, so the folder also converts back."""

    folder = ""  # where in OUT the DCP folder is (Megatron's: release/)

    def __init__(self, names: str, shapes: dict[str, tuple[int, ...]]):
        self.names, self.shapes = names, shapes  # (each DCP tensor's whole shape)
        self.chunks: dict[str, list[OutputTensor]] = {}  # each file's, in order (what read_back finds where)

    def lay_out(self, groups: dict[str, Group], max_shard_size: int | str) -> dict[str, list[Group]]:
        files = super().lay_out(groups, max_shard_size)
        files = {f"{self.folder}__{i}_0.distcp": held for i, held in enumerate(files.values())}
        self.chunks = {
            Path(f).name: [s for g in held for o in g.outputs for s in o.stored] for f, held in files.items()
        }
        return files

    def open(self, path: Path, tensors: list[OutputTensor]) -> DCPFile:
        path.parent.mkdir(parents=True, exist_ok=True)  # (Megatron's release/, verl's actor/model/dist_ckpt/)
        return DCPFile(path, tensors)

    def file_size(self, filename: str, tensors: list[OutputTensor]) -> int:
        return sum(archive_bytes(t.dtype.name, t.shape) for t in tensors)

    def read_back(self, path: Path) -> WrittenDCPFile:
        return WrittenDCPFile(path, self.chunks[path.name])

    def finish(self, plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None):
        write_metadata(plan, folder, self.shapes, nest=PREFIX.get(self.names, ""))
        copied = copy_model_files(plan.config_folder, folder, plan.dtype.name, plan.config_updates)
        return [METADATA, *copied], []

    def notes(self) -> list[str]:
        return [
            f"a torch.distributed.checkpoint folder with {self._said()} names: the model's weights only (a trainer "
            "starts its optimizer afresh); DCP reshards it on load to any world size"
        ]

    def _said(self) -> str:
        return {"hf": "Hugging Face", "torchtitan": "torchtitan's", "torchtune": "torchtune's"}[self.names]

    def summary(self) -> dict[str, Any]:
        return {SUMMARY_KEY: {"names": self.names}}

    def card(self) -> tuple[list[str], list[str]]:
        return ["dcp"], []


def summary_lines(summary: dict[str, Any]) -> list[str]:
    return [f"output: torch.distributed.checkpoint, {summary['names']} names"]


def write_metadata(
    plan: Plan,
    folder: Path,
    shapes: dict[str, tuple[int, ...]],
    objects: dict[str, bytes] | None = None,
    nest: str = "",
) -> list[str]:
    """`.metadata` in `folder` as DCP's writer pickles it: each tensor's dtype, whole shape and chunks, each chunk's
    file and bytes; and `objects` (name -> their bytes: what a DCP writer stores as BytesIO) in a file of their own;
    `nest`: the prefix of names nested in a dict of the state dict (`model.`), whose path DCP's planner keeps.
    The files written."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    tensors, storage = {}, {}
    for filename, groups in plan.files.items():
        at = 0
        for output in (o for g in groups for o in g.outputs):
            for stored in output.stored:
                fqn, offsets = chunk_place(stored, output)
                if fqn not in tensors:
                    properties = TensorProperties(dtype=output.dtype.torch)
                    tensors[fqn] = TensorStorageMetadata(properties, torch.Size(shapes[fqn]), [])
                chunks = tensors[fqn].chunks
                index = MetadataIndex(fqn, torch.Size(offsets), len(chunks))
                chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(stored.shape)))
                length = archive_bytes(stored.dtype.name, stored.shape)
                storage[index] = _StorageInfo(Path(filename).name, at, length)
                at += length
    written = [METADATA]
    if objects:
        name, at = f"__{len(plan.files)}_0.distcp", 0
        with open(folder / name, "wb") as f:
            for fqn, data in objects.items():
                f.write(data)
                tensors[fqn] = BytesStorageMetadata()
                storage[MetadataIndex(fqn)] = _StorageInfo(name, at, len(data))
                at += len(data)
        written.append(name)
    metadata = Metadata(
        tensors,
        planner_data={
            fqn: (nest[:-1], fqn[len(nest) :]) if nest and fqn.startswith(nest) else (fqn,) for fqn in tensors
        },
        storage_data=storage,
        storage_meta=StorageMeta(save_id=str(uuid.uuid4())),
    )
    with open(folder / METADATA, "wb") as f:
        pickle.dump(metadata, f)
    return written


class DCPFile(SafetensorsFile):
    """One `.distcp` file: each stored chunk a torch.save archive at a byte range known in advance."""

    def __init__(self, path: Path, chunks: list[OutputTensor]):
        entries, at = {}, 0
        for chunk in chunks:
            size = archive_bytes(chunk.dtype.name, chunk.shape)
            entries[chunk.name] = (chunk.dtype, chunk.shape, at, size)
            at += size
        self._start(path, b"", entries, data_start=0, size=at)

    def tensor(self, name: str, dtype, shape: tuple[int, ...]) -> ChunkBeingWritten:
        want_dtype, want_shape, at, size = self._entries[name]
        if (dtype, tuple(shape)) != (want_dtype, want_shape):
            raise AssertionError(f"{self.path}: {name} is {want_dtype} {want_shape} in the plan, got {dtype} {shape}")
        return ChunkBeingWritten(self, name, dtype, tuple(shape), at, size)


class ChunkBeingWritten:
    """One chunk, from parts in order: saved by torch.save into its byte range once its last byte has come (a part
    may be a thread's scratch memory, used again after it is written)."""

    def __init__(self, file: DCPFile, name: str, dtype, shape: tuple[int, ...], at: int, size: int):
        self.file, self.name, self.dtype, self.shape, self.at, self.size = file, name, dtype, shape, at, size
        self.nbytes = OutputTensor(name, shape, dtype).nbytes_as_is
        self.buffer: bytearray | None = None
        self.filled, self.saved = 0, False

    def write(self, part: Part) -> None:
        data = _read_part(part) if isinstance(part, FileBytes) else bytes_of(part).cast("B")
        if self.filled + data.nbytes > self.nbytes:
            raise AssertionError(f"{self.name}: a part of {data.nbytes} bytes does not fit what is left")
        if self.filled == 0 and data.nbytes == self.nbytes:  # (the usual case: the chunk is one band)
            self._save(data)
            return
        if self.buffer is None:
            self.buffer = bytearray(self.nbytes)
        self.buffer[self.filled : self.filled + data.nbytes] = data
        self.filled += data.nbytes
        if self.filled == self.nbytes:
            self._save(memoryview(self.buffer))
            self.buffer = None

    def _save(self, data: memoryview) -> None:
        import torch

        tensor = (
            torch.frombuffer(data, dtype=self.dtype.torch).reshape(self.shape)
            if data.nbytes
            else torch.empty(self.shape, dtype=self.dtype.torch)
        )
        at = _WrittenAt(self.file, self.at)
        torch.save(tensor, at)
        if at.written != self.size:
            raise AssertionError(f"{self.name}: torch.save wrote {at.written} bytes, {self.size} planned")
        self.filled, self.saved = self.nbytes, True

    def close(self) -> None:
        if not self.saved:
            if self.nbytes == 0:
                self._save(memoryview(b""))
            else:
                raise AssertionError(f"{self.name}: {self.filled} of {self.nbytes} bytes written")
        self.file._written(self.name)


def _read_part(part: FileBytes) -> memoryview:
    with open(part.path, "rb", buffering=0) as f:
        data = os.pread(f.fileno(), part.nbytes, part.offset)
    if len(data) != part.nbytes:
        from ..errors import CheckpointError

        raise CheckpointError(f"{part.path}: ends before byte {part.offset + part.nbytes}; copy it again")
    return memoryview(data)


class _WrittenAt(io.RawIOBase):
    """What torch.save writes, put at the file's bytes from `at` on."""

    def __init__(self, file: DCPFile, at: int):
        self.file, self.at, self.written = file, at, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        self.file._write_at(self.at + self.written, data)
        self.written += data.nbytes
        return data.nbytes


class WrittenDCPFile:
    """A written `.distcp` file read back (--verify): each chunk's archive loaded by torch.load (weights only) from
    the byte range the plan gave it, so what a trainer would load is what is compared with the checkpoint."""

    def __init__(self, path: Path, chunks: list[OutputTensor]):
        self.path, self.ranges, at = path, {}, 0
        for chunk in chunks:
            size = archive_bytes(chunk.dtype.name, chunk.shape)
            self.ranges[chunk.name] = (at, size)
            at += size
        self.entries = {}
        for name in self.ranges:
            tensor = self._load(name)
            self.entries[name] = (dtypes.of(tensor.dtype).safetensors, tuple(tensor.shape))

    def _load(self, name: str):
        import torch

        at, size = self.ranges[name]
        with open(self.path, "rb", buffering=0) as f:
            raw = os.pread(f.fileno(), size, at)
        try:
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        except Exception as e:
            raise UnshardError(
                f"{self.path}: the chunk {name} does not load ({e}); the file changed during conversion"
            ) from None

    def _bytes(self, name: str) -> memoryview:
        return bytes_of(self._load(name))

    def holds(self, name: str, parts) -> bool:
        data = self._bytes(name)
        at = 0
        for part in parts:
            piece = _read_part(part) if isinstance(part, FileBytes) else bytes_of(part).cast("B")
            if data[at : at + piece.nbytes] != piece:
                return False
            at += piece.nbytes
        return at == data.nbytes

    def holds_at(self, name: str, offset: int, data: memoryview) -> bool:
        return bytes(self._bytes(name)[offset : offset + data.nbytes]) == bytes(data.cast("B"))

    def size_of(self, name: str) -> int:
        return self._bytes(name).nbytes

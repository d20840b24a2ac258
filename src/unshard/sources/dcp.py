"""torch.distributed.checkpoint (DCP) folders: `.metadata` plus `__{rank}_{n}.distcp` files.

Written by llama-recipes / llama-cookbook and accelerate (state nested under `"model"`), torchtitan,
torchtune and Megatron's torch_dist backend. `.metadata` lists, for every tensor, its global size and
chunks; `storage_data` says where each chunk's bytes are (file, offset, length). Each chunk is read
straight from that byte range; no process group and no whole-model load.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
import threading
from collections import Counter, OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import dtypes
from ..errors import CheckpointError
from . import safe_pickle, torch_archives
from .base import Checkpoint, Piece, SourceTensor, deduplicate
from .dcp_safetensors import byte_places
from .meta_named import MetaNamed
from .placements import Block
from .torch_archives import StoredTensor

if TYPE_CHECKING:
    import torch

LAYOUT = "torch-dcp"
# Top-level keys trainers save beside the model in the same DCP folder; none of them is a weight.
NOT_MODEL = {
    "optimizer",
    "optim",
    "optimizers",
    "lr_scheduler",
    "lr_schedulers",
    "scheduler",
    "dataloader",
    "train_state",
    "rng",
    "rng_state",
    "extra_state",
    "args",
    "epoch",
    "step",
    "global_step",
}


def find_folder(src: Path) -> Path | None:
    """SRC itself, or accelerate's `pytorch_model_fsdp_0/` inside a save_state folder."""
    for candidate in (src, src / "pytorch_model_fsdp_0"):
        if (candidate / ".metadata").is_file():
            return candidate
    return None


class _Fields:
    """Stands in for one of DCP's metadata dataclasses: the fields it was pickled with, as
    attributes. Reading `.metadata` this way spares importing torch.distributed.checkpoint, which
    pulls in torch.distributed.tensor and costs about a second, more than the rest of a plan."""

    def __setstate__(self, state):
        if isinstance(state, tuple):  # (dict, slots) of a class with __slots__
            state = {**(state[0] or {}), **state[1]}
        self.__dict__.update(state)


def _fields(name: str, **defaults) -> type:
    # `defaults`: fields a writer may leave out (older torch, or None values _StorageInfo drops).
    return type(name, (_Fields,), defaults)


class _TensorProperties(_Fields):
    def __setstate__(self, state):  # torch pickles these as a tuple
        self.dtype, self.layout, self.requires_grad, self.memory_format, self.pin_memory = state


def _metadata_classes() -> dict[tuple[str, str], object]:
    """What `.metadata` may name, each mapped to its stand-in; anything else is refused."""
    import collections
    import pathlib

    save_plan = _fields("SavePlan")
    stand_ins = {
        "metadata": {
            "Metadata": _fields("Metadata", planner_data=None, storage_data=None, storage_meta=None, version=None),
            "TensorStorageMetadata": _fields("TensorStorageMetadata"),
            "BytesStorageMetadata": _fields("BytesStorageMetadata"),
            "ChunkStorageMetadata": _fields("ChunkStorageMetadata"),
            "TensorProperties": _TensorProperties,
            "MetadataIndex": _fields("MetadataIndex", offset=None, index=None),
            "StorageMeta": _fields("StorageMeta"),
            "_MEM_FORMAT_ENCODING": safe_pickle.enum_value,
        },
        "filesystem": {"_StorageInfo": _fields("_StorageInfo", transform_descriptors=None)},
        # Some writers (megatron's) also keep every rank's save plan in .metadata.
        "planner": {
            "SavePlan": save_plan,
            "WriteItem": _fields("WriteItem"),
            "WriteItemType": safe_pickle.enum_value,
            "TensorWriteData": _fields("TensorWriteData"),
        },
    }
    allowed = {
        (f"torch.distributed.checkpoint.{module}", name): cls
        for module, classes in stand_ins.items()
        for name, cls in classes.items()
    }
    # megatron-core <= 0.15 pickled subclasses of these two, with the same fields.
    mcore = "megatron.core.dist_checkpointing.strategies.torch"
    allowed[(mcore, "MCoreMetadata")] = stand_ins["metadata"]["Metadata"]
    allowed[(mcore, "MCoreSavePlan")] = save_plan
    allowed[("torch", "Size")] = tuple
    allowed[("torch.serialization", "_get_layout")] = str  # a layout, by name: "torch.strided"
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
        allowed[("pathlib", name)] = getattr(pathlib, name)
    return _TorchDTypes(allowed)


class _TorchDTypes(dict):
    """The allow-list, answering also for every torch dtype a pickle may name (`torch.float32`)."""

    DTYPE = re.compile(r"(b?float|q?u?int|complex|bool|bits)\w*")

    def __missing__(self, key):
        module, name = key
        if module == "torch" and self.DTYPE.fullmatch(name):
            return dtypes.BY_NAME.get(name) or dtypes.Unhandled(name)
        raise KeyError(key)


def is_tensor_entry(entry) -> bool:
    """A tensor's entry in `state_dict_metadata` (the others are pickled objects, kept as bytes)."""
    return type(entry).__name__ == "TensorStorageMetadata"


def read_metadata(folder: Path):
    return safe_pickle.load_plain_pickle(folder / ".metadata", _metadata_classes())


def model_names(metadata) -> tuple[dict[str, str], Counter]:
    """fqn in the DCP folder -> model tensor name, and counts of what is skipped and why."""
    paths = metadata.planner_data or {}
    entries = {fqn: tuple(paths.get(fqn, (fqn,))) for fqn in metadata.state_dict_metadata}
    nested = any(path[0] == "model" and len(path) > 1 for path in entries.values())
    names, skipped = {}, Counter()
    for fqn, path in entries.items():
        if not is_tensor_entry(metadata.state_dict_metadata[fqn]):
            skipped["non-tensor entries"] += 1
        elif (path[0] != "model") if nested else (str(path[0]).split(".")[0] in NOT_MODEL):
            skipped[f"{path[0]} entries"] += 1
        elif fqn.endswith("_extra_state"):
            skipped["_extra_state entries"] += 1
        else:
            names[fqn] = ".".join(str(p) for p in (path[1:] if nested else path))
    return names, skipped


def tensor_dtype(folder: Path, fqn: str, entry) -> dtypes.DType:
    """The element type `.metadata` gives a tensor that will be written."""
    dtype = entry.properties.dtype
    if not isinstance(dtype, dtypes.DType):
        raise CheckpointError(f"{folder / '.metadata'}: {fqn} is a {dtype} tensor, which unshard does not convert")
    return dtype


def read_chunk(
    file: Path, info, dtype: dtypes.DType, sizes: tuple[int, ...], what: str, mapped: torch.UntypedStorage | None = None
) -> torch.Tensor:
    """One chunk, from the byte range `info` (a `_StorageInfo`) names in `file`. Given `mapped`, the
    file's map, an archived chunk's tensor is a view of it: no copy, pages read as they are used."""
    import torch

    _check_chunk(file, info, what)
    with open(file, "rb") as f:
        # The default: each chunk is its own torch.save archive (whole or damaged: see torch_archives.is_archive)
        archived = torch_archives.is_archive(f, info.offset, info.length)
        if not archived:  # SerializationFormat.SAFETENSORS: raw bytes, found by the file's header
            start = _safetensors_start(f, file, what, dtype, sizes, info.offset)
            if mapped is not None:  # a view of the map, as an archived chunk's tensor is
                raw = torch.empty(0, dtype=torch.uint8).set_(mapped[start : start + math.prod(sizes) * dtype.itemsize])
                return raw.view(dtype.torch).reshape(sizes)
            f.seek(start)
            return torch.frombuffer(bytearray(f.read(math.prod(sizes) * dtype.itemsize)), dtype=dtype.torch).reshape(
                sizes
            )
        # torch's loader reads past a damaged record header into garbage: the archive's headers are checked first
        torch_archives.records(file, info.offset, info.length)
        try:
            if mapped is not None:
                from .safe_torch_load import load_embedded

                tensor = load_embedded(f, info.offset, info.length, mapped)
            else:
                f.seek(info.offset)
                tensor = torch.load(io.BytesIO(f.read(info.length)), map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(f"{file}: the chunk of {what} is corrupt ({e})") from None
    return tensor.reshape(sizes)


def chunk_offset(file: Path, info, dtype: dtypes.DType, sizes: tuple[int, ...], what: str) -> int | None:
    """Where the chunk's elements lie in `file`, in one run, as `read_chunk` would see them; read
    without torch. None when the chunk is not that simple (then read_chunk it)."""
    _check_chunk(file, info, what)
    with open(file, "rb") as f:
        if not torch_archives.is_archive(f, info.offset, info.length):
            return _safetensors_start(f, file, what, dtype, sizes, info.offset)
        try:
            tensor = torch_archives.read(f, info.offset, info.length)
        except torch_archives.NotPlain:
            return None
    if (
        not isinstance(tensor, torch_archives.StoredTensor)
        or tensor.dtype != dtype
        or tensor.numel() != math.prod(sizes)
    ):
        return None
    return tensor.offset_of((0,) * len(tensor.shape), tensor.shape)


def _check_chunk(file: Path, info, what: str) -> None:
    if getattr(info, "transform_descriptors", None):
        raise CheckpointError(
            f"{file}: the chunk of {what} is stored with transforms {info.transform_descriptors}, "
            "which unshard cannot read yet"
        )
    if info.offset + info.length > file.stat().st_size:
        raise CheckpointError(
            f"{file}: ends before the chunk of {what} at byte {info.offset}; the file is truncated: copy it again"
        )


def _safetensors_start(f, file: Path, fqn: str, dtype: dtypes.DType, sizes: tuple[int, ...], offset: int) -> int:
    """Where a raw chunk's bytes begin in `file` (open as `f`). torch writes each such .distcp as a
    safetensors file, one tensor per fqn, and records offset 0 in .metadata: the header says where."""
    f.seek(0)
    head = f.read(9)
    if len(head) < 9 or head[8:9] != b"{":  # no header: the bytes are where .metadata says
        return offset
    stat = file.stat()
    begin, shape, itemsize = byte_places(file, stat.st_mtime_ns, stat.st_size).get(fqn, (None, None, None))
    if begin is None or shape != tuple(sizes) or itemsize != dtype.itemsize:
        raise CheckpointError(
            f"{file}: holds no {dtype} tensor {fqn} of shape {tuple(sizes)}, which .metadata "
            "puts there; the checkpoint is corrupt or from another save"
        )
    return begin


def storage_index(metadata) -> dict:
    """(fqn, chunk offsets) -> where the chunk's bytes are (`_StorageInfo`)."""
    return {
        (index.fqn, tuple(index.offset)): info
        for index, info in metadata.storage_data.items()
        if index.offset is not None
    }


def chunk_location(folder: Path, storage: dict, fqn: str, offsets: tuple[int, ...]):
    """(file, storage info) of one chunk, checked to exist."""
    info = storage.get((fqn, offsets))
    if info is None:
        raise CheckpointError(f"{folder / '.metadata'}: no storage entry for a chunk of {fqn}; the metadata is corrupt")
    path = folder / info.relative_path
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (it holds part of {fqn}); copy every .distcp file of the checkpoint")
    return path, info


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A stored chunk as pieces read it: where its bytes are (a `_StorageInfo`), its dtype and sizes, and which
    tensor stacked on its leading axes a piece takes (`index`; () for the whole chunk). A piece's `part` is its
    chunk's place in the reader's list."""

    info: Any
    dtype: dtypes.DType
    sizes: tuple[int, ...]
    index: tuple[int, ...] = ()


class ChunkReader:
    """Reads pieces of a Checkpoint from DCP chunks (see `Chunk`); mixed into the DCP readers before Checkpoint.

    A chunk may hold several output tensors: stacked layers or experts (Megatron's torch_dist, torchtitan's
    grouped experts), or fused ones (Megatron's QKV, gate/up), planned one after the other: the last few chunks
    read are kept (views of the file's map, not copies), so each is read from disk once."""

    KEEP = 4

    def use_chunks(self, chunks: list[Chunk]) -> None:
        self._chunks, self._recent, self._lock = chunks, OrderedDict(), threading.Lock()
        self._stored: dict[int, StoredTensor | None] = {}
        self._starts: dict[tuple[Path, str, int], int | None] = {}

    def local_tensor(self, piece: Piece) -> torch.Tensor:
        chunk = self._chunks[piece.part]
        key = (piece.file, piece.key, chunk.info.offset)  # (a chunk of several tensors: read once for all of them)
        with self._lock:
            tensor = self._recent.get(key)
        if tensor is None:
            tensor = read_chunk(piece.file, chunk.info, chunk.dtype, chunk.sizes, piece.key, self.map_file(piece.file))
            with self._lock:
                self._recent[key] = tensor
                while len(self._recent) > self.KEEP:
                    self._recent.popitem(last=False)
        return tensor[chunk.index]

    def file_map(self, file: Path) -> torch.UntypedStorage:
        return self.map_file(file)  # chunks are loaded as views of it

    def file_offset(self, piece: Piece) -> int | None:
        """Where the piece lies in its chunk, and the chunk in its file (read from the chunk's own header,
        without torch, once: a chunk of columns is asked once per band)."""
        if piece.part not in self._stored:
            chunk = self._chunks[piece.part]
            key = (piece.file, piece.key, chunk.info.offset)  # (offset 0 for every chunk of a safetensors .distcp)
            if key not in self._starts:
                self._starts[key] = chunk_offset(piece.file, chunk.info, chunk.dtype, chunk.sizes, piece.key)
            start = self._starts[key]
            if start is not None:  # (the index-th stacked tensor of the chunk)
                before = sum(i * math.prod(chunk.sizes[d + 1 :]) for d, i in enumerate(chunk.index))
                start += before * chunk.dtype.itemsize
            sizes = chunk.sizes[len(chunk.index) :]
            self._stored[piece.part] = None if start is None else StoredTensor.at(start, chunk.dtype, sizes)
        stored = self._stored[piece.part]
        return None if stored is None else stored.offset_of(piece.block.local_offsets, piece.block.sizes)

    def archive_of(self, piece: Piece) -> tuple[int, int | None]:
        info = self._chunks[piece.part].info
        return info.offset, info.length

    def release(self, piece: Piece) -> None:
        if piece.file in self.maps:  # (not mapped: the chunk was read as bytes, or not yet)
            info = self._chunks[piece.part].info
            safe_pickle.forget_bytes(self.maps[piece.file].data_ptr() + info.offset, info.length)

    def close(self) -> None:
        self._recent.clear()
        super().close()


class DcpFolder(ChunkReader, MetaNamed, Checkpoint):
    def _unstacked(self, tensor: SourceTensor, index: int, name: str) -> SourceTensor:
        """The `index`-th tensor stacked on `tensor`'s first axis, read from the chunks that hold it."""
        pieces = []
        for piece in tensor.pieces:
            block = piece.block
            if not block.global_offsets[0] <= index < block.global_offsets[0] + block.sizes[0]:
                continue
            chunk = self._chunks[piece.part]
            at = block.local_offsets[0] + index - block.global_offsets[0]
            self._chunks.append(dataclasses.replace(chunk, index=(*chunk.index, at)))
            inner = Block(block.local_offsets[1:], block.global_offsets[1:], block.sizes[1:])
            pieces.append(Piece(piece.file, piece.key, inner, len(self._chunks) - 1))
        return SourceTensor(name, tensor.shape[1:], tensor.dtype, pieces)


def open_folder(src: Path) -> DcpFolder:
    folder = find_folder(src)
    if folder is None:
        raise CheckpointError(f"{src}: no .metadata file here (not a torch.distributed.checkpoint folder)")
    metadata = read_metadata(folder)
    names, skipped = model_names(metadata)
    storage = storage_index(metadata)
    tensors, chunks = {}, []
    for fqn, name in names.items():
        md = metadata.state_dict_metadata[fqn]
        shape, dtype = tuple(md.size), tensor_dtype(folder, fqn, md)
        pieces = []
        for chunk in md.chunks:
            offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
            path, info = chunk_location(folder, storage, fqn, offsets)
            chunks.append(Chunk(info, dtype, sizes))
            pieces.append(Piece(path, fqn, Block.placed(offsets, sizes), len(chunks) - 1))
        tensors[name] = SourceTensor(name, shape, dtype, deduplicate(fqn, shape, pieces))
    if not tensors:
        raise CheckpointError(f"{folder}: this DCP checkpoint holds no model tensors ({dict(skipped)})")
    files = sorted({p.file.name for t in tensors.values() for p in t.pieces})
    checkpoint = DcpFolder(
        layout=LAYOUT,
        path=folder,
        tensors=tensors,
        hf_folder=_find_hf_folder(folder),
        facts={"files": len(files), "chunks": len(chunks), "skipped": dict(skipped), **_train_params(folder)},
    )
    checkpoint.use_chunks(chunks)
    return checkpoint


def _find_hf_folder(folder: Path) -> Path | None:
    for candidate in (folder / "huggingface", folder.parent / "huggingface", folder, folder.parent):
        if (candidate / "config.json").is_file():
            return candidate
    return None


def _train_params(folder: Path) -> dict:
    """llama-recipes writes train_params.yaml beside its checkpoint; it names the base model."""
    for candidate in (folder / "train_params.yaml", folder.parent / "train_params.yaml"):
        if candidate.is_file():
            for line in candidate.read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "model_name" and value.strip():
                    return {"base_model": value.strip().strip("'\"")}
    return {}

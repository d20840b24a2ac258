"""torch.save archives read without torch: what each tensor is and where its bytes lie.

A torch.save file is a zip archive: `<name>/data.pkl`, a pickle of the saved object, and one
uncompressed record `<name>/data/<key>` per storage. The pickle builds tensors by calling
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`, DTensors through
`_rebuild_from_type_v2`, and asks for storages by key. Here those calls build stand-ins instead:
`StoredTensor` (dtype, shape, strides and the byte offset of its first element in the file), and
DTensors holding one. A plan needs no more than that, and copying bytes file to file needs no torch.

Only the classes below are built. A pickle naming anything else is not read here (`NotPlain`): the
caller reads it with torch's own loader (safe_torch_load), which is just as strict but knows more
(ShardedTensors, trainers' objects beyond those named below).
"""

from __future__ import annotations

import argparse
import collections
import io
import math
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import dtypes
from ..dtypes import DType
from ..errors import CheckpointError
from .safe_pickle import (
    DTENSOR_MODULES,
    FOREIGN_RECORDS,
    PICKLE_DAMAGE,
    PLACEMENTS,
    DTensorStandIn,
    MeshRecord,
    Record,
    Window,
)

# The storage classes a pickle names for each element type (torch's legacy typed storages).
STORAGES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "Float8_e4m3fnStorage": "float8_e4m3fn",
    "Float8_e5m2Storage": "float8_e5m2",
}


class NotPlain(Exception):
    """The archive holds something this reader does not build; torch's loader is needed."""


@dataclass(frozen=True)
class Storage:
    dtype: DType
    start: int  # the file offset of its first byte
    numel: int


@dataclass
class StoredTensor:
    """A tensor as an archive keeps it: a view (offset, shape, strides) of a storage in the file."""

    storage: Storage
    offset: int  # in elements of the storage
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @classmethod
    def at(cls, start: int, dtype: DType, shape: tuple[int, ...]) -> StoredTensor:
        """A contiguous tensor whose bytes begin at file offset `start` (a chunk found by other means)."""
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        return cls(Storage(dtype, start, math.prod(shape)), 0, tuple(shape), tuple(strides))

    @property
    def dtype(self) -> DType:
        return self.storage.dtype

    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def offset_of(self, local_offsets: tuple[int, ...], sizes: tuple[int, ...]) -> int | None:
        """The file offset of a box of this tensor when its elements lie there in one run: whole rows
        (a box full in every dimension but the first), or a range of the flattened tensor (a box of one
        dimension, as ZeRO's flat partitions are cut). None otherwise."""
        if not math.prod(sizes) or not self.is_contiguous():
            return None
        if len(sizes) <= 1:
            start, count = (local_offsets[0] if sizes else 0), math.prod(sizes)
        elif any(local_offsets[1:]) or tuple(sizes[1:]) != self.shape[1:]:
            return None
        else:
            row = math.prod(self.shape[1:])
            start, count = local_offsets[0] * row, sizes[0] * row
        if start + count > self.numel() or self.offset + start + count > self.storage.numel:
            return None
        return self.storage.start + (self.offset + start) * self.dtype.itemsize

    def flattened(self) -> StoredTensor:
        """This tensor as one dimension (it must be contiguous: the same bytes, read in order)."""
        assert self.is_contiguous()
        return StoredTensor(self.storage, self.offset, (self.numel(),), (1,))

    def torch_view(self, file_map):
        """This tensor as torch sees it: a view of `file_map`, the whole file's UntypedStorage."""
        import torch

        tensor = torch.empty(0, dtype=self.dtype.torch)
        start = self.storage.start // self.dtype.itemsize + self.offset  # archives align storages to 64 bytes
        return tensor.set_(file_map, start, self.shape, self.stride)


class StoredDTensor(DTensorStandIn):
    """A DTensor as the pickle describes it: global shape and dtype, `_local_tensor`, `_spec`."""

    def __init__(self, dtype: DType, shape: tuple[int, ...]):
        self.dtype, self.shape = dtype, tuple(shape)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    if not isinstance(storage, Storage):
        raise NotPlain("a tensor built from something other than a storage")
    return StoredTensor(storage, offset, tuple(size), tuple(stride))


def _rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device, requires_grad):
    if cls is not StoredDTensor or not isinstance(dtype, DType):
        raise NotPlain(f"a tensor subclass {cls}")
    return StoredDTensor(dtype, size)


def _rebuild_from_type_v2(func, new_type, args, state):
    tensor = func(*args)
    if new_type is StoredTensor and isinstance(tensor, StoredTensor):
        return tensor  # a plain tensor saved with Python attributes (ZeRO-3's flat groups): not its bytes
    if isinstance(state, tuple) and len(state) == 2:  # (__dict__, slots), as DTensor uses slots
        state = {**(state[0] or {}), **(state[1] or {})}
    if new_type is not StoredDTensor or not isinstance(tensor, StoredDTensor) or not isinstance(state, dict):
        raise NotPlain(f"a tensor of type {new_type}")
    tensor.__dict__.update(state)
    if not isinstance(getattr(tensor, "_local_tensor", None), StoredTensor):
        raise NotPlain("a DTensor without a local tensor")
    return tensor


def _bytes(text: str, encoding: str = "utf-8") -> bytes:
    """How pickle protocol 2 saves bytes: `_codecs.encode(text, "latin1")`."""
    if encoding != "latin1":
        raise NotPlain(f"_codecs.encode(..., {encoding!r})")
    return text.encode("latin1")


def _classes() -> dict[tuple[str, str], Any]:
    allowed = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("argparse", "Namespace"): argparse.Namespace,  # Megatron-LM's `args`: attributes set from a dict
        ("_codecs", "encode"): _bytes,
        # numpy arrays (Megatron-LM's RNG state): kept as records of their arguments, never built
        **{(f"numpy.{core}.multiarray", "_reconstruct"): Record for core in ("core", "_core")},
        ("numpy", "ndarray"): Record,
        ("numpy", "dtype"): Record,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_wrapper_subclass"): _rebuild_wrapper_subclass,
        ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
        ("torch", "Size"): tuple,
        ("torch", "Tensor"): StoredTensor,
        ("torch", "device"): str,
        ("torch.serialization", "_get_layout"): str,
        ("torch.distributed.device_mesh", "DeviceMesh"): MeshRecord,
        ("torch.distributed._mesh_layout", "_MeshLayout"): Record,
        ("torch.distributed._mesh_layout", "_FlatLayout"): Record,
        **{("torch", name): dtype for name, dtype in dtypes.BY_NAME.items()},
        **{tuple(name.rsplit(".", 1)): stand_in for name, stand_in in FOREIGN_RECORDS.items()},  # DeepSpeed's enums
    }
    for module in DTENSOR_MODULES:
        allowed[(module, "DTensor")] = allowed[(module + ".api", "DTensor")] = StoredDTensor
        for name, cls in PLACEMENTS.items():
            allowed[(module + ".placement_types", name)] = cls
        for where in ("_dtensor_spec", "placement_types"):
            for name in ("DTensorSpec", "TensorMeta", "ShardOrderEntry"):
                allowed[(f"{module}.{where}", name)] = Record
    return allowed


CLASSES = _classes()


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, storages: dict[str, tuple[int, int]]):
        super().__init__(io.BytesIO(data))
        self._storages = storages  # key -> (file offset, bytes)

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in STORAGES:
            return ("storage type", dtypes.BY_NAME[STORAGES[name]])
        try:
            return CLASSES[(module, name)]
        except KeyError:
            raise NotPlain(f"{module}.{name}") from None

    def persistent_load(self, pid) -> Storage:
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], tuple)
            and pid[1][0] == "storage type"
        ):
            raise NotPlain(f"a storage reference {pid!r}")
        dtype, key, numel = pid[1][1], str(pid[2]), int(pid[4])
        start, nbytes = self._storages.get(key, (None, 0))
        if start is None or nbytes < numel * dtype.itemsize:
            raise NotPlain(f"storage {key} missing or short")
        return Storage(dtype, start, numel)


def read(file, start: int = 0, length: int | None = None, path: Path | None = None) -> Any:
    """What the archive at bytes [start, start + length) of the open binary `file` holds, built from
    stand-ins. Raises NotPlain where torch's own loader is needed."""
    if length is None:
        length = file.seek(0, io.SEEK_END) - start
    try:
        archive = zipfile.ZipFile(Window(file, start, length))
        infos = archive.infolist()
        pickles = [i for i in infos if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
        if len(pickles) != 1:
            raise NotPlain("no single data.pkl")
        prefix = pickles[0].filename[: -len("data.pkl")]
        byteorder = next((i for i in infos if i.filename == prefix + "byteorder"), None)
        if byteorder is not None and archive.read(byteorder).decode() != "little":
            raise NotPlain("a big-endian archive")
        storages = {}
        for info in infos:
            if info.filename.startswith(prefix + "data/"):
                if info.compress_type != zipfile.ZIP_STORED:
                    raise NotPlain("a compressed storage")
                storages[info.filename[len(prefix) + 5 :]] = (start + _data_start(file, start, info), info.file_size)
        data = archive.read(pickles[0])  # (zipfile checks the record's CRC-32)
    except (zipfile.BadZipFile, OSError, EOFError, UnicodeDecodeError, KeyError, ValueError) as e:
        # (EOFError: a record's size damaged.) Where the bytes are a zip archive, which torch.save writes, it is
        # damaged: torch's own loader reads past such damage (a record's header, its sizes) into garbage, so
        # it is refused here. Bytes of no zip archive at all are torch's older format: its loader's to read.
        where = path or getattr(file, "name", "the archive")
        if isinstance(e, zipfile.BadZipFile) and "CRC" in str(e):
            raise CheckpointError(
                f"{where}: its pickle fails its CRC-32 check; the file is corrupt: copy it again"
            ) from None
        if is_archive(file, start, length):
            raise CheckpointError(f"{where}: {_damage(e)}; the file is truncated or corrupt: copy it again") from None
        raise NotPlain(f"not a readable archive ({e!r})") from None
    try:
        return _Unpickler(data, storages).load()
    except NotPlain:
        raise
    except PICKLE_DAMAGE as e:
        raise NotPlain(f"its pickle ({e})") from None


@dataclass(frozen=True)
class ArchiveRecord:
    """A stored record of an archive: where its bytes lie in the file, and the CRC-32 its directory lists."""

    name: str
    start: int
    nbytes: int
    crc: int


def is_archive(file, start: int, length: int) -> bool:
    """Whether bytes [start, start + length) of the open binary `file` are a zip archive (what torch.save writes),
    whole or damaged: they begin with a record's header, or end with the archive's directory's end (torch writes
    no comment after it), so that damage to either end alone still shows as an archive's."""
    if length < 22:
        return False
    file.seek(start)
    head = file.read(4)
    file.seek(start + length - 22)
    return head == b"PK\x03\x04" or file.read(4) == b"PK\x05\x06"


def _damage(error: BaseException) -> str:
    """What is wrong with an archive, from the error reading it gave."""
    if isinstance(error, zipfile.BadZipFile) and "magic number" in str(error).lower():
        return "a record's header in its archive is damaged"
    if isinstance(error, zipfile.BadZipFile) and "not a zip file" in str(error):
        return "its archive has no directory at its end"
    return f"its archive does not read ({type(error).__name__}: {error})"


def records(path: Path, start: int = 0, length: int | None = None) -> list[ArchiveRecord]:
    """The stored records of the torch.save archive at bytes [start, start + length) of `path` (none if
    those bytes are not a zip archive: a safetensors chunk, say). Raises CheckpointError where they are one
    but its directory or headers do not read, or a record is compressed (torch.save stores every record:
    such a record's bytes would escape the CRC check)."""
    with open(path, "rb") as file:
        if length is None:
            length = file.seek(0, io.SEEK_END) - start
        if not is_archive(file, start, length):
            return []
        try:
            infos = zipfile.ZipFile(Window(file, start, length)).infolist()
            found = [ArchiveRecord(i.filename, start + _data_start(file, start, i), i.file_size, i.CRC) for i in infos]
            if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
                raise zipfile.BadZipFile("a record is compressed, which torch.save never does")
            file.seek(start)
            if file.read(4) != b"PK\x03\x04":
                raise zipfile.BadZipFile("Bad magic number for file header")
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise CheckpointError(f"{path}: {_damage(e)}; the file is truncated or corrupt: copy it again") from None
        if any(r.start + r.nbytes > start + length for r in found):
            raise CheckpointError(
                f"{path}: a record runs past the end of its archive; the file is truncated or corrupt: copy it again"
            )
        return found


CRC_CHUNK = 16 << 20


def crc_of(path: Path, start: int, nbytes: int) -> int:
    """CRC-32 of bytes [start, start + nbytes) of `path`, read a chunk at a time (zlib lets go of the GIL)."""
    import zlib

    crc, buffer = 0, bytearray(min(CRC_CHUNK, max(nbytes, 1)))
    with open(path, "rb", buffering=0) as file:
        file.seek(start)
        while nbytes:
            n = file.readinto(memoryview(buffer)[: min(len(buffer), nbytes)])
            if not n:
                break  # (short: the CRC differs, which says the file is damaged)
            crc, nbytes = zlib.crc32(memoryview(buffer)[:n], crc), nbytes - n
    return crc


def _data_start(file, start: int, info: zipfile.ZipInfo) -> int:
    """Where a stored record's bytes begin: after its local header, whose name and extra field
    (torch pads with it to align the data) may differ in length from the central directory's."""
    file.seek(start + info.header_offset)
    header = file.read(30)
    if header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"no local header for {info.filename}")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_length + extra_length

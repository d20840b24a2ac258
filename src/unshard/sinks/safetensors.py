"""Safetensors files written tensor by tensor at offsets known in advance, and read back to verify.

The safetensors library wants every tensor of a file in memory at once. Here the header comes from
the plan (names, dtypes, shapes, so every byte offset is known in advance), and each tensor is
written to its place as soon as it is assembled, by whichever thread assembled it, then dropped.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

from ..dtypes import NUMPY, DType
from ..errors import CheckpointError, UnshardError

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True)
class FileBytes:
    """A part of a tensor that lies as it is in a source file: `nbytes` bytes of `path` from `offset`."""

    path: Path
    offset: int
    nbytes: int


# What a tensor is written from: tensors, bytes lying in a source file, or bytes in memory (a band
# of a tensor assembled without torch, an encoding's numpy arrays). Parts follow one another in the tensor's bytes.
Part = Union["torch.Tensor", FileBytes, memoryview, "np.ndarray"]


COPY_CHUNK = 16 << 20  # bytes read at a time when the kernel cannot copy file to file
_KERNEL_COPIES = hasattr(os, "copy_file_range")  # until a filesystem refuses it


def _kernel_copy(source: int, dest: int, offset: int, at: int, count: int) -> int:
    """Bytes copy_file_range copied; 0 where the filesystem refuses the call (not asked again after)."""
    global _KERNEL_COPIES
    try:
        return os.copy_file_range(source, dest, count, offset, at)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM):
            raise
        _KERNEL_COPIES = False
        return 0


class SafetensorsFile:
    """One safetensors file, written tensor by tensor at offsets known in advance.

    The header is written first (names, dtypes and shapes come from the plan, so every byte offset
    is known); each tensor then goes to its own byte range with os.pwrite, in any order and from
    several threads at once. (Into one file, writers take turns on ext4 and xfs; the executor
    spreads its threads over files, where they do run in parallel.)
    """

    def __init__(self, path: Path, tensors: list[tuple[str, DType, tuple[int, ...]]]):
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        entries: dict[str, tuple[DType, tuple[int, ...], int, int]] = {}
        for name, dtype, shape in tensors:
            size = dtype.itemsize
            for d in shape:
                size *= d
            header[name] = {"dtype": dtype.safetensors, "shape": list(shape), "data_offsets": [offset, offset + size]}
            entries[name] = (dtype, tuple(shape), offset, size)
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the format asks for 8-byte alignment of the data
        self._start(path, struct.pack("<Q", len(raw)) + raw, entries)

    def _start(
        self,
        path: Path,
        header: bytes,
        entries: dict[str, tuple[DType, tuple[int, ...], int, int]],
        data_start: int | None = None,
        size: int | None = None,
    ) -> None:
        """Create the file with its header; entries: name -> (dtype, shape, offset from data_start, bytes).
        (`size`: the whole file's, where the format pads after the last tensor.)"""
        self.path, self._entries = path, entries
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._data_start = len(header) if data_start is None else data_start
        self._write_at(0, memoryview(header))
        if size is not None:
            try:
                os.ftruncate(self._fd, size)
            except OSError as e:
                raise disk_full(self.path, e) from None
        self._unwritten = set(self._entries)
        self._lock = threading.Lock()

    # Whether each write's bytes start on their way to the disk at once (the file is synced when complete: see
    # `sync`), so that writing and the disk's work overlap and the final sync has little left to wait for.
    writeback = False

    def _write_at(self, at: int, data: memoryview) -> None:
        try:
            while data.nbytes:
                n = os.pwrite(self._fd, data, at)  # may write less than asked (Linux: at most ~2 GB a call)
                self._started(at, n)
                data, at = data[n:], at + n
        except OSError as e:
            raise disk_full(self.path, e) from None

    def _started(self, at: int, nbytes: int) -> None:
        """Start the writeback of bytes [at, at + nbytes) without waiting for it (Linux's sync_file_range)."""
        if self.writeback and _SYNC_FILE_RANGE is not None:
            _SYNC_FILE_RANGE(self._fd, at, nbytes, SYNC_FILE_RANGE_WRITE)

    def _copy_at(self, at: int, part: FileBytes) -> None:
        """Copy a part file to file with copy_file_range: the kernel moves the bytes between page caches
        (or the server does, on NFS), none pass through this process, and its memory does not grow.
        Where that call is missing or refused (another filesystem, macOS), read and write in chunks."""
        source = os.open(part.path, os.O_RDONLY)
        try:
            offset, left = part.offset, part.nbytes
            while left:
                try:
                    n = _kernel_copy(source, self._fd, offset, at, left) if _KERNEL_COPIES else 0
                except OSError as e:
                    raise disk_full(self.path, e) from None
                if n == 0:  # refused, or nothing copied: read it, which also tells the end of the file
                    data = os.pread(source, min(left, COPY_CHUNK), offset)
                    if not data:
                        raise CheckpointError(
                            f"{part.path}: ends before byte {offset + left}; the file is truncated: copy it again"
                        )
                    self._write_at(at, memoryview(data))
                    n = len(data)
                else:
                    self._started(at, n)
                offset, at, left = offset + n, at + n, left - n
        finally:
            os.close(source)

    def write_parts(self, name: str, dtype: DType, shape: tuple[int, ...], parts: Iterable[Part]) -> None:
        """Write tensor `name` from parts whose bytes, one after another, are the tensor's."""
        tensor = self.tensor(name, dtype, shape)
        for part in parts:
            tensor.write(part)
        tensor.close()

    def tensor(self, name: str, dtype: DType, shape: tuple[int, ...]) -> TensorBeingWritten:
        """Tensor `name`, to be written a part at a time (an encoding fills several tensors band by band)."""
        want_dtype, want_shape, start, size = self._entries[name]
        if (dtype, tuple(shape)) != (want_dtype, want_shape):
            raise AssertionError(f"{self.path}: {name} is {want_dtype} {want_shape} in the header, got {dtype} {shape}")
        return TensorBeingWritten(self, name, dtype, self._data_start + start, size)

    def _written(self, name: str) -> None:
        with self._lock:
            self._unwritten.discard(name)

    def sync(self) -> None:
        """Have the file's bytes on the disk (fdatasync), once they are all written: before the output is put in
        place, so that a crash or power loss after that can never leave a file cut short under OUT."""
        if self._fd >= 0:
            try:
                os.fdatasync(self._fd)
            except OSError as e:
                raise disk_full(self.path, e) from None

    def close(self, check: bool = True) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if check and self._unwritten:
            raise AssertionError(f"{self.path}: {len(self._unwritten)} tensors were never written")


class TensorBeingWritten:
    """One tensor of a SafetensorsFile, written from parts in order; `close` checks it is whole."""

    def __init__(self, file: SafetensorsFile, name: str, dtype: DType, at: int, size: int):
        self.file, self.name, self.dtype, self.at, self.size, self.written = file, name, dtype, at, size, 0

    def write(self, part: Part) -> None:
        if not isinstance(part, (FileBytes, memoryview)) and not _holds(part, self.dtype):
            raise AssertionError(f"{self.name}: a part in {part.dtype} for a {self.dtype} tensor")
        data = part if isinstance(part, FileBytes) else bytes_of(part)
        if self.written + data.nbytes > self.size:
            raise AssertionError(f"{self.name}: a part of {data.nbytes} bytes does not fit what is left")
        at = self.at + self.written
        if isinstance(data, FileBytes):
            self.file._copy_at(at, data)
        elif data.nbytes:
            self.file._write_at(at, data)
        self.written += data.nbytes

    def close(self) -> None:
        if self.written != self.size:
            raise AssertionError(f"{self.name}: {self.written} of {self.size} bytes written")
        self.file._written(self.name)


SYNC_FILE_RANGE_WRITE = 2  # (linux/fs.h: start writing the range's dirty pages out, without waiting)


def _sync_file_range():
    """libc's sync_file_range, where there is one (Linux); None elsewhere (the final sync does all the work)."""
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_SYNC_FILE_RANGE = _sync_file_range()


# A write that fails for want of room: the disk or a quota full, or the file size limit (RLIMIT_FSIZE;
# Python ignores its SIGXFSZ, so the write fails with EFBIG).
ROOM_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(path: Path, error: OSError) -> Exception:
    """A write's error as the one line it should be where there is no room; otherwise as it is."""
    if error.errno not in ROOM_ERRNOS:
        return error
    return UnshardError(
        f"{path}: {os.strerror(error.errno)}; nothing was written to the output: free space on "
        "that disk (or raise the file size limit, ulimit -f) and run again"
    )


def _holds(part: torch.Tensor | np.ndarray, dtype: DType) -> bool:
    """Whether a tensor's or an array's elements are of `dtype` (see dtypes.NUMPY for an array's)."""
    import numpy as np

    if isinstance(part, np.ndarray):
        return part.dtype == np.dtype(NUMPY[dtype.name])
    return part.dtype == dtype.torch


def bytes_of(part: torch.Tensor | np.ndarray | memoryview) -> memoryview:
    """A part's bytes in memory (for a tensor, torch is imported already, since there is one)."""
    if isinstance(part, memoryview):
        return part
    import numpy as np

    if isinstance(part, np.ndarray):
        return memoryview(np.ascontiguousarray(part).reshape(-1).view(np.uint8))
    import torch

    return memoryview(part.contiguous().reshape(-1).view(torch.uint8).numpy())


class WrittenFile:
    """A safetensors file read back, to compare each tensor with its parts byte for byte (--verify).

    Reading goes through os.pread a chunk at a time, never a map, so memory stays at two chunks
    however large the tensor, and no page of the file counts in the process's RSS afterwards.
    """

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = path
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        self.data_start = 8 + length
        self.entries = {name: (e["dtype"], tuple(e["shape"]), *e["data_offsets"]) for name, e in header.items()}
        # The offsets are ours to read; the safetensors library must see the same names, dtypes and shapes.
        with safe_open(path, "numpy") as f:  # (the header only: no tensor is read)
            library = {name: (f.get_slice(name).get_dtype(), tuple(f.get_slice(name).get_shape())) for name in f.keys()}
        if library != {name: entry[:2] for name, entry in self.entries.items()}:
            raise UnshardError(f"{path}: the safetensors library reads another header than was written")

    def holds(self, name: str, parts: Iterable[Part]) -> bool:
        """Whether tensor `name`'s bytes in this file are those of `parts`, one after another."""
        _, _, begin, end = self.entries[name]
        at = self.data_start + begin
        expected, actual = _chunk_buffers()
        with open(self.path, "rb", buffering=0) as out:
            for part in parts:
                if isinstance(part, FileBytes):
                    with open(part.path, "rb", buffering=0) as source:
                        for done, n in _chunks(part.nbytes):
                            # (startswith compares with memcmp; == on memoryviews goes element by element)
                            if not (
                                _read(source, expected, n, part.offset + done)
                                and _read(out, actual, n, at + done)
                                and expected.startswith(memoryview(actual)[:n])
                            ):
                                return False
                    at += part.nbytes
                else:
                    data = bytes_of(part)
                    for done, n in _chunks(data.nbytes):
                        if not (_read(out, actual, n, at + done) and actual.startswith(data[done : done + n])):
                            return False
                    at += data.nbytes
        return at == self.data_start + end

    def holds_at(self, name: str, offset: int, data: memoryview) -> bool:
        """Whether tensor `name`'s bytes from `offset` on are `data` (a piece of an encoded tensor)."""
        _, _, begin, end = self.entries[name]
        if begin + offset + data.nbytes > end:
            return False
        _, actual = _chunk_buffers()
        with open(self.path, "rb", buffering=0) as out:
            for done, n in _chunks(data.nbytes):
                if not (
                    _read(out, actual, n, self.data_start + begin + offset + done)
                    and actual.startswith(data[done : done + n])
                ):
                    return False
        return True

    def size_of(self, name: str) -> int:
        _, _, begin, end = self.entries[name]
        return end - begin


_THREAD = threading.local()


def _chunk_buffers() -> tuple[bytearray, bytearray]:
    """This thread's two chunk buffers, made once: allocating a chunk per read costs more than reading
    it (each allocation is mapped afresh, see execute.return_freed_memory)."""
    if not hasattr(_THREAD, "buffers"):
        _THREAD.buffers = (bytearray(COPY_CHUNK), bytearray(COPY_CHUNK))
    return _THREAD.buffers


def _read(file, buffer: bytearray, n: int, offset: int) -> bool:
    """Read n bytes at offset into the start of buffer (one read call: a regular file gives all of
    them unless it ends first); False if it ends first. `file` is this thread's own, unbuffered."""
    file.seek(offset)
    return file.readinto(memoryview(buffer)[:n]) == n


def _chunks(nbytes: int) -> Iterator[tuple[int, int]]:
    """(start, length) of the COPY_CHUNK-sized chunks of `nbytes` bytes."""
    return ((start, min(COPY_CHUNK, nbytes - start)) for start in range(0, nbytes, COPY_CHUNK))


def sha256_of(path: Path) -> str:
    digest, buffer = hashlib.sha256(), _chunk_buffers()[0]
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(memoryview(buffer)[:n])
    return digest.hexdigest()

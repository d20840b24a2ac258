"""torch.load of checkpoint files, safely: torch's own `weights_only` unpickler, which builds objects
from an allow-list only. We add to that list the few torch.distributed classes that sharded
checkpoints contain. A `ShardedTensor` (FSDP1 without a device mesh) refuses to unpickle without a
process group, so its name is mapped to `ShardedTensorRecord`, a plain holder of its local shards and
their offsets; DeepSpeed's bookkeeping classes become plain `Record`s, so DeepSpeed need not be
installed. Used where `torch_archives` (which needs no torch) does not know what a file holds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import pickle
import re
import sys
import threading
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, UnsafeCheckpointError
from .safe_pickle import (
    DTENSOR_MODULES,
    FOREIGN_RECORDS,
    PLACEMENTS,
    DTensorStandIn,
    MeshRecord,
    Record,
    Window,
    forget_bytes,
)


class ShardedTensorRecord(torch.Tensor):
    """Stands in for torch.distributed's ShardedTensor: its global size, dtype and local shards."""

    @dataclasses.dataclass
    class ProcessGroupState:
        local_rank: int
        global_rank: int
        local_world_size: int
        global_world_size: int

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise TypeError("a ShardedTensorRecord only describes shards; read its local_shards")

    def __setstate__(self, state):
        self.local_shards, self.sharded_metadata, self.process_group_state = state[:3]


# DTensors (FSDP2, FSDP1 with a device mesh) unpickle into the stand-ins below rather than the real
# classes, unless torch.distributed.tensor is imported already: importing it costs about a second
# (it pulls in sympy and dynamo), more than reading a checkpoint's metadata. The stand-ins keep
# what a pickled DTensor holds and answer as a DTensor does: global shape and dtype, local tensor,
# mesh shape and this rank's coordinate on it, placements. (Once the real module is imported, torch
# registers its classes under the same names; mixing the two would be ambiguous, so then the real
# classes are used throughout.)


class DTensorRecord(torch.Tensor, DTensorStandIn):
    """Stands in for a DTensor: a tensor of its global shape and dtype holding no data, with the
    `_local_tensor` and `_spec` it was saved with."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise TypeError("a DTensorRecord only describes a shard; read its _local_tensor")


DTENSOR_RECORDS = {
    **{f"{m}.{api}DTensor": DTensorRecord for m in DTENSOR_MODULES for api in ("", "api.")},
    **{f"{m}.placement_types.{name}": cls for m in DTENSOR_MODULES for name, cls in PLACEMENTS.items()},
    **{
        f"{m}.{where}.{name}": Record
        for m in DTENSOR_MODULES
        for where in ("_dtensor_spec", "placement_types")
        for name in ("DTensorSpec", "TensorMeta", "ShardOrderEntry")
    },
    "torch.distributed.device_mesh.DeviceMesh": MeshRecord,
    "torch.distributed._tensor.device_mesh.DeviceMesh": MeshRecord,
    "torch.distributed._mesh_layout._MeshLayout": Record,
    "torch.distributed._mesh_layout._FlatLayout": Record,
}


def _nested_class_getattr(owner: Any, name: str) -> Any:
    # ShardedTensor pickles reach their ProcessGroupState through getattr(ShardedTensor, ...).
    # Only that lookup is allowed: a general getattr could reach anything.
    if owner is ShardedTensorRecord and name == "ProcessGroupState":
        return ShardedTensorRecord.ProcessGroupState
    raise pickle.UnpicklingError(f"getattr({owner!r}, {name!r}) is not allowed")


def _numpy_arrays() -> list:
    """What a plain numpy array unpickles through (Megatron-LM saves numpy's RNG state)."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    dtypes = [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64, np.float32)]
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, *dtypes]


_IMPORTING = threading.Lock()


@functools.cache
def _fixed_globals() -> tuple:
    # Imported on first use, by one thread at a time: torch.distributed._shard's modules import
    # each other, and two threads importing them at once can see one half-initialised.
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor.metadata import (
        MEM_FORMAT_ENCODING,
        ShardedTensorMetadata,
        TensorProperties,
    )
    from torch.distributed._shard.sharded_tensor.shard import Shard
    from torch.distributed._shard.sharding_spec.chunk_sharding_spec import ChunkShardingSpec
    from torch.distributed.remote_device import _remote_device

    return (
        *((stand_in, name) for name, stand_in in FOREIGN_RECORDS.items()),
        argparse.Namespace,  # Megatron-LM's `args`: plain attributes
        *_numpy_arrays(),
        (ShardedTensorRecord, "torch.distributed._shard.sharded_tensor.api.ShardedTensor"),
        (_nested_class_getattr, "builtins.getattr"),
        ShardedTensorRecord.ProcessGroupState,
        ShardedTensorMetadata,
        TensorProperties,
        MEM_FORMAT_ENCODING,
        ShardMetadata,
        Shard,
        ChunkShardingSpec,
        _remote_device,
    )


def _allowed_globals() -> list:
    with _IMPORTING:
        fixed = _fixed_globals()
    dtensors = () if any(module in sys.modules for module in DTENSOR_MODULES) else DTENSOR_RECORDS.items()
    return [*fixed, *((stand_in, name) for name, stand_in in dtensors)]


class _SharedAllowList:
    """torch.serialization.safe_globals, shared by loads running at once in several threads.

    torch keeps one allow-list per process, and the context manager removes its entries on exit: a
    thread finishing its load would take them away from another still unpickling. So the first load
    in adds them and the last one out removes them (and the stand-ins never outlive unshard's loads,
    where they would change what a user's own torch.load builds). Only the entries the list lacks are added, and so
    removed: what the process allowed itself (megatron-core allows Megatron-LM's `args` and numpy's arrays when
    imported) stays."""

    # Unpickling a real DeviceMesh without process groups logs a warning per tensor; harmless here,
    # so that logger is quiet meanwhile (a level, too, is one per process).
    MESH_LOG = logging.getLogger("torch.distributed.device_mesh")

    def __init__(self):
        self._lock, self._users, self._open, self._level = threading.Lock(), 0, None, logging.NOTSET

    def __enter__(self):
        allowed = _allowed_globals()
        with self._lock:
            if self._users == 0:
                present = set(torch.serialization.get_safe_globals())
                self._open = torch.serialization.safe_globals([entry for entry in allowed if entry not in present])
                self._open.__enter__()
                self._level = self.MESH_LOG.level
                self.MESH_LOG.setLevel(logging.ERROR)
            self._users += 1

    def __exit__(self, *exc):
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._open.__exit__(None, None, None)
                self.MESH_LOG.setLevel(self._level)


_ALLOWING = _SharedAllowList()


def load(path: Path, mmap: bool = True) -> Any:
    """torch.load a checkpoint file safely; tensor data stays on disk (mmap) until touched."""
    with _refusing_unsafe(path):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def load_mapped(path: Path) -> tuple[Any, torch.UntypedStorage | None]:
    """`load`, and the map of the file that every loaded tensor is a view of (torch.load(mmap=True)
    makes the same map but keeps it to itself): a tensor's bytes lie in the file at its address minus
    the map's, so they can be copied file to file without passing through this process."""
    with _refusing_unsafe(path):
        mapped = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=path.stat().st_size)
        archive = torch._C.PyTorchFileReader(str(path))
        value = torch.serialization._load(
            archive, "cpu", torch._weights_only_unpickler, overall_storage=mapped, encoding="utf-8"
        )
    if archive.has_record("byteorder") and archive.get_record("byteorder").decode() != sys.byteorder:
        return value, None  # torch swapped the bytes in memory: the file's are not the tensors'
    return value, mapped


@contextlib.contextmanager
def _refusing_unsafe(path: Path):
    """torch's allow-list in force; a refused or unreadable file reported in one line naming it."""
    try:
        with _ALLOWING, warnings.catch_warnings():
            # a plain pickle (not torch.save's zip) makes torch warn of its protocol before refusing or reading it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            yield
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"asks for {found.group(1)}, which is" if found else "holds an object that is"
        raise UnsafeCheckpointError(
            f"{path}: refused to load: its pickle {what} not a tensor or checkpoint metadata type; unshard "
            "never runs code from a checkpoint. Re-save the state dict as plain tensors, or report the type "
            "if it is a legitimate torch class"
        ) from None
    except (
        RuntimeError,
        zipfile.BadZipFile,
        EOFError,
        OSError,
        ValueError,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
    ) as e:  # (past its allow-list, a damaged pickle fails anywhere in torch's loader)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}: cannot be read ({first}); the file is truncated or corrupt: copy it again from "
            "the training job's storage"
        ) from None


def load_embedded(file, start: int, length: int, mapped: torch.UntypedStorage) -> Any:
    """torch.load the archive that lies at bytes [start, start + length) of an open file (DCP keeps
    one per chunk), as safely as `load`, its tensors mapped from `mapped` (the file's own map) rather
    than copied. torch.load itself takes only whole files or buffers; this is its loader on a window."""
    reader = torch._C.PyTorchFileReader(Window(file, start, length))
    with _ALLOWING:
        return torch.serialization._load(
            reader, "cpu", torch._weights_only_unpickler, overall_storage=mapped[start : start + length]
        )


def forget_pages(tensor: torch.Tensor) -> None:
    """Unmap the pages of a tensor that `load` mapped from a file, once its bytes have been copied.

    Pages read through a memory map stay counted in the process's resident memory until unmapped,
    which would make a conversion's RSS grow with the model. The file is never written through the
    map, so dropping the pages loses nothing: touching them again reads them back from the file.
    Only for tensors from `load` (file-backed); on anonymous memory this would zero the data.
    """
    forget_bytes(tensor.data_ptr(), tensor.numel() * tensor.element_size())

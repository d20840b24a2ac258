"""Unpickle checkpoint metadata without letting it run code, and without importing torch.

A pickle names the classes and functions it wants built; `load_plain_pickle` builds only those on
an explicit allow-list, each usually mapped to a stand-in that keeps the pickled state as plain
data (a `Record`). torch.save archives (.pt files, DCP chunks) are read by `torch_archives.py` with
the same allow-list idea; `safe_torch_load.py` has torch's own loader for what that cannot read.
Anything else a pickle names, `os.system` for instance, is refused and reported.
"""

from __future__ import annotations

import ctypes
import io
import math
import mmap as _mmap
import pickle
import sys
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, UnsafeCheckpointError


class Record:
    """Stands in for a trainer's bookkeeping object (a loss scaler, a fragment address): keeps its
    arguments and state as plain data, runs none of its code."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state):
        self.state = state


def is_dtensor(value) -> bool:
    """A DTensor, or a stand-in for one (safe_torch_load's, torch_archives'): a local tensor and a spec."""
    return hasattr(value, "_local_tensor") and hasattr(value, "_spec")


class DTensorStandIn:
    """What readers ask of a stand-in for a DTensor (safe_torch_load's, torch_archives'): its mesh and
    placements, from the `_spec` it was saved with."""

    @property
    def device_mesh(self) -> MeshRecord:
        return self._spec.state["mesh"]

    @property
    def placements(self) -> tuple:
        return tuple(self._spec.state["placements"])


class MeshRecord(Record):
    """Stands in for a DeviceMesh: its shape, dimension names and this rank's coordinate."""

    def _get(self, *names):
        return next((value for name in names if (value := _field(self, name)) is not None), None)

    @property
    def shape(self) -> tuple[int, ...]:
        layout, mesh = self._get("_layout"), self._get("mesh")
        axes = _field(layout, "axes")
        if axes is not None:  # newer torch: a CuTe-style layout, one axis per mesh dimension
            return tuple(math.prod(_field(axis, "shape")) for axis in axes)
        if hasattr(mesh, "shape"):  # older torch: the tensor of ranks itself
            return tuple(mesh.shape)
        raise CheckpointError(
            "a DTensor's device mesh was saved in a form unshard does not know (no layout or "
            "mesh tensor); please report the torch version that saved it"
        )

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def mesh_dim_names(self) -> tuple[str, ...] | None:
        return self._get("_mesh_dim_names", "mesh_dim_names")

    def get_coordinate(self) -> tuple[int, ...]:
        coordinate = self._get("_coordinate_on_dim")
        if coordinate is None:
            raise CheckpointError(
                "a DTensor's device mesh was saved without this rank's coordinate; "
                "please report the torch version that saved it"
            )
        return tuple(coordinate)


def _field(obj, name: str):
    """A field of an unpickled object, whether torch built it as its own class or as a Record."""
    if isinstance(obj, Record):
        return obj.state.get(name) if isinstance(getattr(obj, "state", None), dict) else None
    return getattr(obj, name, None)


class PlacementRecord(Record):
    """Stands in for a DTensor placement; the subclass name is the placement's (Shard, Replicate...)."""

    def __setstate__(self, state):
        self.__dict__.update(state or {})

    SHORT = {
        "Shard": "S({dim})",
        "_StridedShard": "_S({dim}, {split_factor})",
        "Replicate": "R",
        "Partial": "P({reduce_op})",
    }

    def __repr__(self) -> str:  # as torch prints placements
        try:
            return self.SHORT[type(self).__name__].format(**vars(self))
        except KeyError:
            return type(self).__name__


PLACEMENTS = {name: type(name, (PlacementRecord,), {}) for name in ("Shard", "_StridedShard", "Replicate", "Partial")}
DTENSOR_MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")  # the second: torch < 2.5


def enum_value(value):
    """Enums such as DeepSpeed's ZeroStageEnum unpickle as their plain value."""
    return value


# Classes of DeepSpeed (and other trainers) that appear in their checkpoints' pickles.
FOREIGN_RECORDS = {
    "deepspeed.runtime.zero.config.ZeroStageEnum": enum_value,
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": Record,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": Record,
    "deepspeed.utils.tensor_fragment.fragment_address": Record,
    # Megatron-LM's args hold a few enums (--attention-backend, the model type).
    "megatron.core.transformer.enums.AttnBackend": enum_value,
    "megatron.core.transformer.enums.ModelType": enum_value,
    "megatron.core.enums.ModelType": enum_value,
}


class Window(io.RawIOBase):
    """Bytes [start, start + length) of an open file, read as a file of their own."""

    def __init__(self, file, start: int, length: int):
        super().__init__()
        self._file, self._start, self._length, self._at = file, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._length}[whence] + offset
        return self._at

    def readinto(self, buffer) -> int:
        want = max(0, min(len(buffer), self._length - self._at))
        self._file.seek(self._start + self._at)
        got = self._file.readinto(memoryview(buffer)[:want])
        self._at += got
        return got


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_MADV_DONTNEED = 4


def forget_bytes(address: int, nbytes: int) -> None:
    """`forget_pages` for a byte range of a file map."""
    if _LIBC is None or nbytes == 0:
        return
    start = address - address % _mmap.PAGESIZE
    _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(address + nbytes - start), _MADV_DONTNEED)


# What unpickling damaged bytes raises: the pickle module's own errors, and those of opcodes given nonsense
# (a frame's length flipped to 2**63 is an OverflowError), as opposed to a refused class.
PICKLE_DAMAGE = (
    pickle.UnpicklingError,
    EOFError,
    AttributeError,
    TypeError,
    ValueError,
    IndexError,
    OverflowError,
    MemoryError,
)


class _AllowListUnpickler(pickle.Unpickler):
    def __init__(self, file, allowed: dict[tuple[str, str], Any], path: Path):
        super().__init__(file)
        self._allowed, self._path = allowed, path

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise UnsafeCheckpointError(
                f"{self._path}: refused to load: its pickle asks for {module}.{name}, which is not checkpoint "
                "metadata; unshard never runs code from a checkpoint. Report the type if it is legitimate"
            ) from None


def load_plain_pickle(path: Path, allowed: dict[tuple[str, str], Any]) -> Any:
    """pickle.load a metadata file (not a torch.save archive), building only allowed classes."""
    try:
        with open(path, "rb") as f:
            return _AllowListUnpickler(f, allowed, path).load()
    except UnsafeCheckpointError:
        raise
    except PICKLE_DAMAGE as e:
        raise CheckpointError(f"{path}: cannot be read ({e}); the file is truncated or corrupt") from None

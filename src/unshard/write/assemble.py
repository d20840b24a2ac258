"""From a group's source pieces to what the writer takes: each output tensor as parts whose bytes, in order,
are the tensor's. Streamed where the checkpoint allows (pieces read as the writer asks, cast in chunks, bands of
rows), whole where it must be (a split, a merge); and for an output with an encoding, bands of whole rows for it
to encode."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import dtypes
from ..sinks.safetensors import FileBytes, Part, bytes_of
from ..sources.base import read_bytes, thread_buffer
from ..types import ENCODING_BAND_BYTES, Group, OutputTensor, Plan

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..dtypes import DType


def materialise(plan: Plan, group: Group) -> list[tuple[str, torch.Tensor]]:
    """The output tensors of one group, whole, in the plan's dtype and order."""
    whole = plan.checkpoint.read(group.source.name)
    produced = group.convert(whole) if group.convert else {group.outputs[0].name: whole}
    return [(o.name, produced[o.name].to(o.dtype.torch)) for o in group.outputs]


@dataclass
class Parts:
    """One output tensor ready to write: parts whose bytes, in order, are the tensor's (a list, or an
    iterator producing them as the writer goes); `then` releases what the reader holds for them."""

    output: OutputTensor
    parts: Iterable[Part]
    then: Callable[[], None] | None = None


CAST_CHUNK = 16 << 20  # elements cast at a time when a streamed tensor changes dtype


def ready_to_write(plan: Plan, group: Group) -> list[Parts]:
    """A group's output tensors for the writer. A tensor that is its pieces one after another (FSDP
    rows, ZeRO ranges) is streamed: each piece is read as the writer asks for it (a dtype cast in
    chunks), so no whole tensor is built and memory follows the largest piece, not the tensor. A large
    tensor cut otherwise (columns, strided shards) is assembled a band of rows at a time (without torch,
    as bytes, where the pieces' rows lie in their files and no dtype changes)."""
    checkpoint, source, output = plan.checkpoint, group.source, group.outputs[0]
    pieces = checkpoint.flat_pieces(source.name) if group.convert is None else None
    rows = checkpoint.band_rows(source.name) if group.convert is None else None
    if pieces is None and rows is None:
        return [Parts(o, [t]) for o, (_, t) in zip(group.outputs, materialise(plan, group))]
    if pieces is None:
        release = lambda: [checkpoint.release(p) for p in source.pieces]  # noqa: E731
        return [Parts(output, _read_in_bands(checkpoint, source, rows, output.dtype), release)]
    return [Parts(output, _read_in_order(checkpoint, source, pieces, output.dtype))]


def _read_in_order(checkpoint, source, pieces, dtype: DType) -> Iterator[Part]:
    as_bytes = dtypes.casts_without_torch(source.dtype, dtype)
    for piece in pieces:
        at = checkpoint.file_offset(piece) if as_bytes else None
        if at is not None:
            in_file = FileBytes(piece.file, at, piece.block.numel * source.dtype.itemsize)
            if dtype == source.dtype:  # its bytes, as they are in the file: copied by the kernel
                yield in_file
            else:
                yield from _cast_from_file(in_file, source.dtype, dtype)
            continue
        flat = checkpoint.read_piece(piece)
        if flat.dtype == dtype.torch:
            yield flat
        else:
            for start in range(0, flat.numel(), CAST_CHUNK):
                yield flat[start : start + CAST_CHUNK].to(dtype.torch)
        # The writer asks for the next part once this one is written: its pages can go, so that a
        # tensor's mapped pages never add up to more than one piece.
        checkpoint.release(piece)


READ_CHUNK = 16 << 20  # bytes read at a time from a file to be cast


def _cast_from_file(part: FileBytes, source: DType, target: DType) -> Iterator[memoryview]:
    """A part's bytes read from its file a chunk at a time and cast by numpy: no torch, no map, and
    memory is one chunk however large the piece. (Each chunk is written before the next is asked
    for, so the thread's buffers are used again.)"""
    for chunk in _chunks_of_file(part):
        yield memoryview(_cast(chunk, source, target))


def _chunks_of_file(part: FileBytes) -> Iterator:
    """A part's bytes read from its file into this thread's read buffer, READ_CHUNK at a time (each chunk is
    used before the next is read into the same buffer)."""
    for done in range(0, part.nbytes, READ_CHUNK):
        chunk = thread_buffer("read", min(READ_CHUNK, part.nbytes - done))
        read_bytes(part.path, part.offset + done, chunk)
        yield chunk


def _cast(raw, source: DType, target: DType):
    """`raw` cast by numpy into this thread's cast buffer."""
    return dtypes.cast(raw, source, target, thread_buffer("cast", raw.nbytes // source.itemsize * target.itemsize))


def _read_in_bands(checkpoint, source, rows: int, dtype: DType) -> Iterator[Part]:
    loaded: dict[int, torch.Tensor] = {}  # each piece's local tensor, loaded once for all bands

    def local(piece):
        if id(piece) not in loaded:
            loaded[id(piece)] = checkpoint.local_tensor(piece)
        return loaded[id(piece)]

    by_numpy = dtypes.casts_without_torch(source.dtype, dtype)
    for start in range(0, source.shape[0], rows):
        stop = min(start + rows, source.shape[0])
        band = checkpoint.read_rows_as_bytes(source.name, start, stop) if by_numpy else None
        if band is None:
            yield checkpoint.read_rows(source.name, start, stop, local).to(dtype.torch)
        else:
            yield memoryview(band if dtype == source.dtype else _cast(band, source.dtype, dtype))


def encoded(output: OutputTensor, parts: Iterable[Part]) -> Iterator[tuple[str, np.ndarray]]:
    """(stored tensor, its next piece) for an output with an encoding: each band of its rows encoded."""
    for start, band in bands(output, parts):
        yield from output.encoding.encode(band, start).items()


def bands(output: OutputTensor, parts: Iterable[Part]) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, band) for an output with an encoding: the parts gathered into bands of whole rows, as numpy
    arrays of the output's elements (dtypes.as_numpy: bfloat16 as its bits). Memory: one band, however large the
    tensor. The band is this thread's, kept from tensor to tensor, and a part lying in a file is read straight into
    it; each band is used before the next is filled into it."""
    encoding = output.encoding
    row_bytes = output.nbytes_as_is // (output.shape[0] if output.shape else 1)  # (a scalar: one row)
    multiple = encoding.rows_per_band
    rows = max(multiple, ENCODING_BAND_BYTES // max(1, row_bytes) // multiple * multiple)
    band = thread_buffer("band", rows * row_bytes)
    filled, start = 0, 0

    def whole_rows(nbytes: int) -> np.ndarray:
        return dtypes.as_numpy(band[:nbytes], output.dtype).reshape(-1, *output.shape[1:])

    for part in parts:
        in_file = isinstance(part, FileBytes)
        data = None if in_file else bytes_of(part).cast("B")
        done, size = 0, part.nbytes if in_file else data.nbytes
        while done < size:
            n = min(size - done, len(band) - filled)
            if in_file:
                read_bytes(part.path, part.offset + done, band[filled : filled + n])
            else:
                band[filled : filled + n] = data[done : done + n]
            filled, done = filled + n, done + n
            if filled == len(band):
                yield start, whole_rows(filled)
                filled, start = 0, start + rows
    if filled:
        yield start, whole_rows(filled)

"""What every reader returns: a Checkpoint that lists whole tensors and the pieces they are made of.

A reader looks at file names and metadata only. Tensor bytes are read later, one whole tensor at a
time, by `Checkpoint.read`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..dtypes import DType
from ..errors import CheckpointError
from . import torch_archives
from .placements import Block, assemble, box, compose
from .torch_archives import StoredTensor

if TYPE_CHECKING:
    import numpy as np
    import torch

_MAPPING = threading.Lock()


@dataclass(frozen=True)
class Piece:
    """One box of a tensor, held by `key` (local shard `part`) in `file`."""

    file: Path
    key: str
    block: Block
    part: int = 0


@dataclass
class SourceTensor:
    name: str
    shape: tuple[int, ...]
    dtype: DType
    pieces: list[Piece]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def deduplicate(name: str, shape: tuple[int, ...], pieces: list[Piece]) -> list[Piece]:
    """Keep one copy of each box (replicas hold the same bytes) and check the boxes tile the tensor."""
    unique: dict[tuple, Piece] = {}
    for piece in pieces:
        if piece.block.numel:
            unique.setdefault((piece.block.global_offsets, piece.block.sizes), piece)
    covered = sum(p.block.numel for p in unique.values())
    if covered != math.prod(shape):
        files = sorted({str(p.file) for p in pieces})
        raise CheckpointError(
            f"{files[0]}: the shards of {name} cover {covered} of {math.prod(shape)} elements; a rank file is "
            f"missing or comes from another run (files seen: {len(files)})"
        )
    return list(unique.values())


@dataclass(frozen=True)
class Stack:
    """A tensor whose rows are whole tensors of the checkpoint (a layer's experts, which transformers keeps in one
    tensor: gpt-oss's), each turned by `band`, which takes the members' rows stacked on a first axis. Read a band of
    members at a time, so memory follows the band, not the layer."""

    members: tuple[SourceTensor, ...]
    band: Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Checkpoint:
    """A sharded checkpoint, opened: every logical tensor with its pieces, nothing read yet."""

    layout: str
    path: Path
    tensors: dict[str, SourceTensor]
    hf_folder: Path | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    # name -> applied to the assembled tensor (a row permutation no box can express, say)
    transforms: dict[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)
    # name -> the shape its pieces tile where a transform then reshapes it (a trainer's Linear of transformers' Conv3d)
    tiled_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # name -> the checkpoint's tensors it stacks (its pieces are theirs)
    stacks: dict[str, Stack] = field(default_factory=dict)
    # name -> a tensor of the output whose rows are several of the checkpoint's (its pieces are theirs: join_rows);
    # read as the checkpoint's tensors are, and not one of them
    joined: dict[str, SourceTensor] = field(default_factory=dict)
    # file -> its map, for readers whose local tensors are views of whole-file maps (see file_offset)
    maps: dict[Path, torch.UntypedStorage] = field(default_factory=dict)
    # file -> what was loaded from it, for readers of torch.save files (see `loaded`)
    states: dict[Path, Any] = field(default_factory=dict)
    # what the output's config.json says otherwise than the config beside it (a merge of layer slices: its layer count)
    config_changes: dict[str, Any] = field(default_factory=dict)
    # config_changes is the output's whole config (a model of another class: a MoE assembled from dense models)
    config_whole: bool = False

    def loaded(self, piece: Piece) -> torch.Tensor | StoredTensor | None:
        """What this reader holds for a piece's local tensor, for readers of torch.save files: a
        StoredTensor where torch_archives read the file (no torch), a tensor where torch's loader did."""
        return None

    def local_tensor(self, piece: Piece) -> torch.Tensor:
        """The piece's local tensor, as torch sees it."""
        local = self.loaded(piece)
        if local is None:
            raise NotImplementedError
        return self.as_torch(piece, local)

    def as_torch(self, piece: Piece, local: torch.Tensor | StoredTensor) -> torch.Tensor:
        return local.torch_view(self.map_file(piece.file)) if isinstance(local, StoredTensor) else local

    def fit_config(self, config: dict[str, Any] | None) -> None:
        """Called with the output's config before planning; a reader may re-cut tensors to it
        (Megatron pads the vocabulary, and only the config knows the true size)."""

    def release(self, piece: Piece) -> None:
        """Called once a piece's bytes are copied: a reader may free what it held for it. Here: the
        pages of a file map the piece's local tensor lies in (see `release_rows`)."""
        if self.file_map(piece.file) is not None:
            self.release_rows(piece, self.local_tensor(piece))

    def read(self, name: str) -> torch.Tensor:
        """The whole tensor `name`, assembled from its pieces; nothing else is loaded."""
        if name in self.stacks:
            return self._stacked(self.stacks[name], 0, len(self.stacks[name].members), self.local_tensor)
        source = self.source(name)
        shape = self.tiled_shapes.get(name, source.shape)
        whole = assemble(
            shape, source.dtype.torch, [(p.block, lambda p=p: self.local_tensor(p)) for p in source.pieces]
        )
        for piece in source.pieces:
            self.release(piece)
        transform = self.transforms.get(name)
        return whole if transform is None else transform(whole)

    def _stacked(self, stack: Stack, start: int, stop: int, local: Callable[[Piece], torch.Tensor]) -> torch.Tensor:
        """Rows [start, stop) of a stacked tensor: those members, each assembled whole, stacked and turned."""
        import torch

        members = stack.members[start:stop]
        rows = torch.empty((len(members), *members[0].shape), dtype=members[0].dtype.torch)
        for row, member in zip(rows, members):
            assemble(member.shape, row.dtype, [(p.block, lambda p=p: local(p)) for p in member.pieces], out=row)
            for piece in member.pieces:
                self.release(piece)
        return stack.band(rows)

    def join_rows(self, name: str, members: list[str]) -> SourceTensor:
        """A tensor whose rows are those of `members`, one after another (the gate, q, k and v that transformers
        splits HRM-Text's gqkv_proj into, joined as save_pretrained writes it): their pieces, moved down by the rows
        before them; nothing is read. Registered under `name`."""
        sources = [self.tensors[m] for m in members]
        turned = any(m in self.transforms or m in self.stacks or m in self.tiled_shapes for m in members)
        if turned or not all(s.pieces for s in sources) or len({(s.dtype, s.shape[1:]) for s in sources}) != 1:
            raise CheckpointError(
                f"{self.path}: {', '.join(members)} do not join into {name} by their rows; unshard cannot write it "
                "as transformers saves it: report it with the output of `unshard inspect`"
            )
        row, pieces, before = math.prod(sources[0].shape[1:]), [], 0
        for source in sources:
            for piece in source.pieces:
                block, flat = piece.block, len(piece.block.sizes) == 1 and len(source.shape) > 1
                moved = (block.global_offsets[0] + before * (row if flat else 1), *block.global_offsets[1:])
                pieces.append(replace(piece, block=Block(block.local_offsets, moved, block.sizes)))
            before += source.shape[0]
        self.joined[name] = SourceTensor(name, (before, *sources[0].shape[1:]), sources[0].dtype, pieces)
        return self.joined[name]

    def source(self, name: str) -> SourceTensor:
        """The tensor `name` is read from: the checkpoint's, or one joined of several of its tensors."""
        return self.joined[name] if name in self.joined else self.tensors[name]

    def flat_pieces(self, name: str) -> list[Piece] | None:
        """The pieces of `name` in order, when the tensor's bytes are simply theirs one after another:
        rows split along the first dimension (FSDP's Shard(0)) or ranges of the flattened tensor (ZeRO's
        flat partitions). The writer then streams them without assembling the whole tensor, which
        saves a copy and bounds memory by the largest piece. None when pieces interleave (column
        splits, strided shards) or the tensor is transformed after assembly."""
        source = self.source(name)
        if name in self.transforms or name in self.stacks or not source.shape:
            return None
        row = math.prod(source.shape[1:])
        starts = []
        for piece in source.pieces:
            block = piece.block
            if len(block.sizes) == 1 and len(source.shape) > 1:  # a range of the flattened tensor
                starts.append((block.global_offsets[0], piece))
            elif (
                tuple(block.sizes[1:]) == tuple(source.shape[1:])
                and not any(block.global_offsets[1:])
                and not any(block.local_offsets[1:])
            ):
                starts.append((block.global_offsets[0] * row, piece))
            else:
                return None
        position = 0
        for start, piece in sorted(starts, key=lambda s: s[0]):
            if start != position:
                return None
            position += piece.block.numel
        return [piece for _, piece in sorted(starts, key=lambda s: s[0])] if position == source.numel else None

    BAND_BYTES = 16 << 20  # a tensor assembled band by band is held this much at a time

    def reads_rows(self, name: str) -> bool:
        """Whether any band of rows of `name` can be read on its own (`read_rows`): its pieces are boxes
        of it, read as they lie, with nothing applied after (not ZeRO's flat ranges, not a transform)."""
        source = self.source(name)
        if name in self.stacks:  # (a band of its members)
            return len(source.shape) >= 2
        return (
            len(source.shape) >= 2
            and name not in self.transforms
            and bool(source.pieces)
            and source.numel > 0
            and all(len(p.block.sizes) == len(source.shape) for p in source.pieces)
        )

    def band_rows(self, name: str) -> int | None:
        """Rows per band when `name` is assembled a band of rows at a time: a tensor whose pieces are
        boxes of it (column splits, strided shards) read as they lie, with nothing applied after.
        Memory then follows the band, not the tensor (a tensor smaller than a band is one band). None
        otherwise (streamed pieces, see `flat_pieces`; transformed, computed or one-dimensional tensors)."""
        if not self.reads_rows(name) or self.flat_pieces(name):
            return None
        source = self.source(name)
        return max(1, min(source.shape[0], self.BAND_BYTES // (math.prod(source.shape[1:]) * source.dtype.itemsize)))

    def read_rows_as_bytes(self, name: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray | None:
        """Rows [start, stop) of `name` as their bytes, put together without torch: a piece that lies in
        its file in one run (see `file_offset`; a column shard, a DCP chunk) has its rows of the band
        there in one run too, read and placed by numpy. None if a piece does not (a strided box, a
        file read into memory): then `read_rows` does it. The bytes are `out`'s (uint8, as many as the
        band's), or else this thread's band buffer, valid until its next call."""
        if name in self.stacks:  # (turned after it is read: read_rows)
            return None
        source = self.source(name)
        band = self._band(source, start, stop)
        itemsize = source.dtype.itemsize
        runs = []
        for piece in source.pieces:
            if (block := compose(piece.block, band)) is None:
                continue
            if (at := self.file_offset(piece)) is None:
                return None
            row_bytes = math.prod(piece.block.sizes[1:]) * itemsize  # (the band holds the piece's whole rows)
            runs.append((block, piece.file, at + (block.local_offsets[0] - piece.block.local_offsets[0]) * row_bytes))
        nbytes = band.numel * itemsize
        rows = (thread_buffer("band", nbytes) if out is None else out).reshape(
            *band.sizes, itemsize
        )  # (a last axis: bytes)
        if len(runs) == 1 and runs[0][0].sizes == band.sizes:  # the band lies in one piece: read in place
            read_bytes(runs[0][1], runs[0][2], rows)
            return rows.reshape(-1)
        for block, file, at in runs:
            part = thread_buffer("band part", block.numel * itemsize).reshape(*block.sizes, itemsize)
            read_bytes(file, at, part)
            rows[box(block.global_offsets, block.sizes)] = part
        return rows.reshape(-1)

    @staticmethod
    def _band(source: SourceTensor, start: int, stop: int) -> Block:
        """Rows [start, stop) of the whole tensor as a box of the band that holds them."""
        return Block(
            (start,) + (0,) * (len(source.shape) - 1), (0,) * len(source.shape), (stop - start, *source.shape[1:])
        )

    def read_rows(self, name: str, start: int, stop: int, local: Callable[[Piece], torch.Tensor]) -> torch.Tensor:
        """Rows [start, stop) of `name`, from the parts of the pieces that fall in them (see `band_rows`);
        `local` gives a piece's local tensor, so that a caller reading several bands loads each once."""
        if name in self.stacks:
            return self._stacked(self.stacks[name], start, stop, local)
        source = self.source(name)
        band = self._band(source, start, stop)
        used = [(block, p) for p in source.pieces if (block := compose(p.block, band)) is not None]
        rows = assemble(band.sizes, source.dtype.torch, [(block, lambda p=p: local(p)) for block, p in used])
        for block, piece in used:  # copied: their pages can go before the next band maps its own
            start = block.local_offsets[0]
            self.release_rows(piece, local(piece)[start : start + block.sizes[0]])
        return rows

    def release_rows(self, piece: Piece, rows: torch.Tensor) -> None:
        """Called once these rows of a piece's local tensor are copied (a band, see `read_rows`): if they
        lie in a file map, their pages are handed back. Pages read through a map count in the process's
        RSS until then, which would make it grow with the model; the file is never written through the
        map, so dropping them loses nothing. (Never for memory of its own: that would zero it.)"""
        mapped = self.file_map(piece.file)
        start = rows.data_ptr()
        if (
            mapped is not None
            and rows.is_contiguous()
            and mapped.data_ptr() <= start < mapped.data_ptr() + mapped.nbytes()
        ):
            from .safe_torch_load import forget_pages

            forget_pages(rows)

    def file_map(self, file: Path) -> torch.UntypedStorage | None:
        """The map of `file` that this reader's local tensors are views of, if it maps the whole file."""
        return self.maps.get(file)

    def map_file(self, file: Path) -> torch.UntypedStorage:
        """A private map of the whole file, made on first use (as torch.load(mmap=True) makes), for
        readers that load chunks of a file in place, as views of it."""
        with _MAPPING:  # one map per file, also when threads ask at once: a tensor of a second map
            if file not in self.maps:  # would not be found in the first (file_offset, release_rows)
                import torch

                self.maps[file] = torch.UntypedStorage.from_file(str(file), shared=False, nbytes=file.stat().st_size)
            return self.maps[file]

    def file_offset(self, piece: Piece) -> int | None:
        """Where `read_piece(piece)`'s bytes begin in `piece.file`, when they lie there as they are, in one
        run, in a file this reader maps. The writer then copies them file to file in the kernel, and they
        never pass through this process's memory. None otherwise (a chunk read into memory, a strided box)."""
        local = self.loaded(piece)
        if isinstance(local, StoredTensor):  # where its header says; no torch needed
            return local.offset_of(piece.block.local_offsets, piece.block.sizes)
        mapped = self.file_map(piece.file)
        if mapped is None:  # (asked first: a reader without maps may read its local tensors whole)
            return None
        view = self.local_tensor(piece)[box(piece.block.local_offsets, piece.block.sizes)]
        offset = view.data_ptr() - mapped.data_ptr()
        inside = 0 <= offset and offset + view.numel() * view.element_size() <= mapped.nbytes()
        return offset if view.numel() and view.is_contiguous() and inside else None

    def copies(self, names: set[str]) -> set[str]:
        """Of these tensors, those that are another tensor of the same shape and dtype: its bytes where they lie
        in the same place (a weight tied to another, which torch.save writes once under both names), or else the
        same values (DCP writes a tied weight under each name). The others hold values of their own (a head a
        trainer kept apart from the embedding its config ties it to, as transformers 5 loads a Flan-T5's). Values
        are compared while planning, a band of rows at a time where the reader reads bands: a tied weight's few
        tensors, read once more."""
        places: dict[str, tuple | None] = {}

        def place(name: str) -> tuple | None:
            if name not in places:
                pieces = self.tensors[name].pieces
                found = [(piece.file, piece.block, self.file_offset(piece)) for piece in pieces]
                places[name] = tuple(found) if found and all(at is not None for *_, at in found) else None
            return places[name]

        def twins(name: str) -> list[str]:
            tensor = self.tensors[name]
            return [
                other
                for other, each in self.tensors.items()
                if other != name and each.shape == tensor.shape and each.dtype == tensor.dtype
            ]

        return {
            name
            for name in names
            if any(place(name) is not None and place(other) == place(name) for other in twins(name))
            or any(self.same_values(name, other) for other in twins(name))
        }

    def same_values(self, a: str, b: str) -> bool:
        """Whether two tensors of one shape and dtype hold the same bytes: compared a band of rows at a time where
        both are read in bands, else whole (torch only where it is needed: see test_fast_paths)."""
        import numpy as np

        if (same := self._same_stored_bytes(a, b)) is not None:
            return same
        rows = [self.band_rows(a), self.band_rows(b)]
        if None in rows:
            import torch

            return bool(
                torch.equal(
                    self.read(a).contiguous().view(-1).view(torch.uint8),
                    self.read(b).contiguous().view(-1).view(torch.uint8),
                )
            )
        count = self.tensors[a].shape[0]
        for start in range(0, count, min(rows)):
            stop = min(start + min(rows), count)
            if not np.array_equal(self._band_bytes(a, start, stop), self._band_bytes(b, start, stop)):
                return False
        return True

    def _same_stored_bytes(self, a: str, b: str) -> bool | None:
        """Whether two tensors cut into the same boxes, each lying in its file in one run (see `file_offset`: DCP's
        chunks), hold the same bytes, read from their files a band at a time; None where they do not lie so."""
        import numpy as np

        pairs = list(zip(self.tensors[a].pieces, self.tensors[b].pieces))
        if len(self.tensors[a].pieces) != len(self.tensors[b].pieces) or any(x.block != y.block for x, y in pairs):
            return None
        runs = [(x, self.file_offset(x), y, self.file_offset(y)) for x, y in pairs]
        if any(at is None or other is None for _, at, _, other in runs):
            return None
        itemsize = self.tensors[a].dtype.itemsize
        for x, at, y, other in runs:
            size = x.block.numel * itemsize
            for start in range(0, size, self.BAND_BYTES):
                length = min(self.BAND_BYTES, size - start)
                mine, theirs = np.empty(length, np.uint8), np.empty(length, np.uint8)
                read_bytes(x.file, at + start, mine)
                read_bytes(y.file, other + start, theirs)
                if not np.array_equal(mine, theirs):
                    return False
        return True

    def _band_bytes(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a tensor read in bands, as bytes of their own."""
        import numpy as np

        source = self.source(name)
        out = np.empty(self._band(source, start, stop).numel * source.dtype.itemsize, dtype=np.uint8)
        if (rows := self.read_rows_as_bytes(name, start, stop, out)) is not None:
            return rows
        import torch

        band = self.read_rows(name, start, stop, self.local_tensor).contiguous()
        return band.view(-1).view(torch.uint8).numpy().copy()

    def archive_of(self, piece: Piece) -> tuple[int, int | None]:
        """(start, length) of the torch.save archive holding the piece in its file: the whole file, unless
        the reader knows better (a DCP file holds an archive per chunk)."""
        return 0, None

    def check_records(self, pieces: list[tuple[Piece, int]]) -> None:
        """Check the CRC-32 of every torch.save record these pieces (and their byte counts) are read from,
        against the one the archive's directory lists: a flipped bit in a tensor's bytes is otherwise
        copied into the output unseen (the writer copies such bytes file to file, unread). A piece read
        through torch's loader has every record of its archive checked. Raises CheckpointError naming
        the file."""
        wanted: dict[tuple[Path, int, int | None], list[tuple[int, int]] | None] = {}
        for piece, nbytes in pieces:
            archive = (piece.file, *self.archive_of(piece))
            at = self.file_offset(piece)
            if at is None:
                wanted[archive] = None  # every record
            elif wanted.get(archive, []) is not None:
                wanted.setdefault(archive, []).append((at, at + nbytes))
        for (file, start, length), ranges in wanted.items():
            for record in torch_archives.records(file, start, length):
                end = record.start + record.nbytes
                if ranges is not None and not any(a < end and record.start < b for a, b in ranges):
                    continue
                if torch_archives.crc_of(file, record.start, record.nbytes) != record.crc:
                    raise CheckpointError(
                        f"{file}: record {record.name} fails its CRC-32 check; the file is "
                        "corrupt: copy it again from the training job's storage"
                    )

    def read_piece(self, piece: Piece) -> torch.Tensor:
        """One piece's elements, flattened, as they lie in the whole tensor (see `flat_pieces`)."""
        return self.local_tensor(piece)[box(piece.block.local_offsets, piece.block.sizes)].reshape(-1)

    def close(self) -> None:
        """Drop open file maps and what was loaded."""
        self.maps.clear()
        self.states.clear()


_THREAD = threading.local()


def thread_buffer(name: str, nbytes: int) -> np.ndarray:
    """`nbytes` of this thread's buffer `name` (uint8), made once and again only to grow: a fresh large
    buffer each time is mapped and page-faulted afresh (see execute.return_freed_memory), which cost
    more than the reading and casting done in it."""
    import numpy as np

    buffers = _THREAD.__dict__.setdefault("buffers", {})
    if name not in buffers or buffers[name].nbytes < nbytes:
        buffers[name] = np.empty(nbytes, np.uint8)
    return buffers[name][:nbytes]


def read_bytes(file: Path, at: int, out) -> None:
    """Fill `out` (a writable buffer: a numpy array) with the bytes of `file` from byte `at`, in one
    read call (a regular file gives them all unless it ends first)."""
    with open(file, "rb", buffering=0) as f:
        f.seek(at)
        if f.readinto(out) != out.nbytes:
            raise CheckpointError(f"{file}: ends before byte {at + out.nbytes}; the file is truncated: copy it again")


def load_archive(path: Path, maps: dict[Path, torch.UntypedStorage]) -> Any:
    """A torch.save file's contents, read by torch_archives (no torch) or, for what only torch's loader
    knows (a ShardedTensor, a trainer's object), by safe_torch_load, which also maps the file."""
    try:
        with open(path, "rb") as f:
            return torch_archives.read(f)
    except (torch_archives.NotPlain, OSError):  # (torch's loader reports an unreadable file in its words)
        from .safe_torch_load import load_mapped

        saved, maps[path] = load_mapped(path)
        return saved

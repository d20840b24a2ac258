"""Walk a plan: assemble each checkpoint tensor, convert it, write it, drop it.

`threads` threads each take the next tensor, assemble and write it to its place in its file, so
reading, copying and writing overlap while memory stays at a few tensors. Nothing is written outside
the staging folder until every file is complete.

The plan's output files can be dealt out to several writers: `workers` processes forked on this host,
or the ranks of a torchrun job (`distributed`) on a shared filesystem. Every writer builds the same
plan, writes (and verifies) its own files into one staging folder, and a single process writes the
index, config and model card, and puts the folder in place only if every writer succeeded.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import queue
import resource
import sys
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from . import dtypes
from .errors import PeerFailedError, UnshardError
from .hf_names import NamingChanged
from .plan import Group, OutputTensor, Plan, pieces_read
from .readers.base import read_bytes, thread_buffer
from .report import human_bytes
from .sinks import ENCODING_BAND_BYTES
from .sinks.safetensors import FileBytes, Part, bytes_of, sha256_of

if TYPE_CHECKING:
    import torch

    from .dtypes import DType

log = logging.getLogger("unshard")


@dataclass
class Result:
    out: Path
    tensors: int
    bytes: int
    seconds: float
    peak_rss: int
    files: list[str]
    copied: list[str]
    warnings: list[str] = field(default_factory=list)
    writers: int = 1  # processes that wrote the files
    rank: int = 0  # of this process, in a distributed run

    def line(self) -> str:
        rate = self.bytes / max(self.seconds, 1e-9)
        by = f" by {self.writers} processes" if self.writers > 1 else ""
        return (f"wrote {self.tensors} tensors, {human_bytes(self.bytes)} in {len(self.files)} file(s) to {self.out}"
                f"{by} in {self.seconds:.1f}s ({human_bytes(rate)}/s), peak memory "
                f"{human_bytes(self.peak_rss)}{' per process' if self.writers > 1 else ''}")


@dataclass(frozen=True)
class Writing:
    """How the weight files are written; the same for every writer of one conversion."""

    threads: int = 1  # tensors read, assembled and written at once
    verify: bool = False  # re-read every written tensor and compare it with the source
    checksums: bool = False  # each file's sha256 in the model card (costs a core at about 1 GB/s)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
OWN_MAP_BYTES = 1 << 20


def return_freed_memory() -> None:
    """Have allocations of 1 MB and more (assembled tensors, bands, merge inputs) mapped on their own,
    so that freeing one gives its memory back to the system. glibc's default moves that threshold up
    to 32 MB after the first large free, serves smaller tensors from its heaps and keeps what they
    free: RSS then crept up with the number of tensors assembled (tensor-parallel 5.94 GB: 0.57 GB
    peak, 0.44 GB with this, as at 0.70 GB). Process-wide, and a no-op off glibc."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, OWN_MAP_BYTES)
        except (OSError, AttributeError):
            pass


def peak_rss(children: bool = False) -> int:
    """Largest resident set of this process (or, with `children`, of it and any waited-for child)."""
    who = [resource.RUSAGE_SELF] + ([resource.RUSAGE_CHILDREN] if children else [])
    kb = max(resource.getrusage(w).ru_maxrss for w in who)
    return kb if sys.platform == "darwin" else kb * 1024


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
                yield flat[start:start + CAST_CHUNK].to(dtype.torch)
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


def _progress(total: int, enabled: bool | None, what: str = "converting"):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=what, disable=None if enabled is None else not enabled)


def convert(plan: Plan, out: str | Path, *, overwrite: bool = False, threads: int = 1, verify: bool = False,
            checksums: bool = False, progress: bool | None = None, extra_files: dict[str, str | bytes] | None = None,
            workers: int = 1, distributed: bool = False) -> Result:
    """Write the plan's folder at OUT. `extra_files` (name -> text, or bytes) are added to it (a merge's recipe);
    a README.md among them opens the model card.

    workers: processes on this host, each writing its share of the output files (forked, so each
    has the plan already). distributed: this process is one rank of a torch.distributed job (started
    by torchrun); every rank must call convert with the same plan and OUT on a shared filesystem.
    """
    out = Path(out)
    plan.require_config()
    return_freed_memory()
    writing = Writing(threads, verify, checksums)
    workers = max(1, min(workers, len(plan.files)))
    late_notes: list[str] = []
    if plan.question is not None and (distributed or workers > 1):
        # Every rank must write the same plan, and forking while a thread imports is unsafe: answer first.
        plan, late_notes = _answered(plan)
    if distributed:
        return _convert_distributed(plan, out, overwrite, writing, progress, extra_files)
    start = time.perf_counter()
    folder = plan.sink.stage(out, overwrite)
    try:
        survey(plan, threads, progress)  # (before forking: the workers are given what it found)
        with _progress(plan.total_bytes, progress) as bar:
            if workers > 1:
                digests = _write_in_processes(plan, folder.path, writing, bar, workers)
            else:
                digests = _write_part(plan, folder.path, list(plan.files), writing, bar)
        if plan.question is not None:
            late_notes = plan.question.verdict()
            plan.notes.extend(late_notes)
        copied, warnings = plan.sink.finish(plan, folder.path, digests, extra_files)
        folder.commit()
    except NamingChanged:
        folder.abort()
        log.info("transformers names this model's tensors otherwise than the checkpoint: writing again")
        return convert(plan.rebuild(), out, overwrite=overwrite, threads=threads, verify=verify, checksums=checksums,
                       progress=progress, extra_files=extra_files, workers=workers)
    except BaseException:
        folder.abort()
        raise
    return Result(out, len(plan.outputs), plan.total_bytes, time.perf_counter() - start,
                  peak_rss(children=workers > 1), list(plan.files), copied, late_notes + warnings, writers=workers)


def _answered(plan: Plan) -> tuple[Plan, list[str]]:
    """The plan once transformers has answered (itself, or made again from the answer), and the notes
    the answer adds."""
    try:
        notes = plan.question.verdict()
    except NamingChanged:
        return plan.rebuild(), []
    plan.notes.extend(notes)
    plan.question = None
    return plan, notes


def split_files(plan: Plan, parts: int) -> list[list[str]]:
    """The output files dealt to `parts` writers: largest first, each to the least loaded writer.
    Deterministic, so every rank of a distributed run computes the same split on its own."""
    sizes = {name: sum(g.nbytes for g in groups) for name, groups in plan.files.items()}
    shares: list[list[str]] = [[] for _ in range(parts)]
    load = [0] * parts
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        i = load.index(min(load))
        shares[i].append(name)
        load[i] += sizes[name]
    order = list(plan.files)
    return [sorted(share, key=order.index) for share in shares]


def _write_part(plan: Plan, folder: Path, filenames: list[str], writing: Writing, bar) -> dict[str, str | None]:
    """Write (and verify, if asked) some of the plan's files; their sha256 by name, if asked."""
    digests = _write_weights(plan, folder, filenames, writing, bar)
    if writing.verify:
        verify_folder(plan, folder, filenames, writing.threads)
    return digests


class _SharedCounter:
    """A progress bar's `update` for a forked worker: bytes written, added to a counter the parent shows."""

    def __init__(self, value):
        self.value = value

    def update(self, n: int) -> None:
        with self.value.get_lock():
            self.value.value += n


def _worker(plan, folder, filenames, writing, written, results) -> None:
    try:
        results.put(("ok", _write_part(plan, folder, filenames, writing, _SharedCounter(written))))
    except BaseException as e:  # reported to the parent, which fails the whole run
        results.put(("error", _describe(e), isinstance(e, UnshardError)))


def _describe(e: BaseException) -> str:
    return str(e) if isinstance(e, UnshardError) else f"{type(e).__name__}: {e}"


def _write_in_processes(plan: Plan, folder: Path, writing: Writing, bar, workers: int) -> dict[str, str | None]:
    """Fork `workers` processes, each writing its share of the files; any failure fails the run."""
    # fork: each worker starts with the plan (readers, open maps, a merge's methods) already built.
    context = multiprocessing.get_context("fork")
    written, results = context.Value("q", 0), context.Queue()
    procs = [context.Process(target=_worker, args=(plan, folder, share, writing, written, results), daemon=True)
             for share in split_files(plan, workers) if share]
    for proc in procs:
        proc.start()
    digests: dict[str, str | None] = {}
    try:
        for _ in procs:
            while True:
                try:
                    outcome = results.get(timeout=0.2)
                    break
                except queue.Empty:
                    bar.update(written.value - bar.n)
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead and results.empty():
                        raise UnshardError(f"a worker process died (exit code {dead[0].exitcode}: killed, or out of "
                                           "memory?); nothing was written to the output; retry with fewer --workers")
            if outcome[0] == "error":
                raise UnshardError(outcome[1]) if outcome[2] else RuntimeError(outcome[1])
            digests.update(outcome[1])
        bar.update(written.value - bar.n)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
    return digests


def _convert_distributed(plan: Plan, out: Path, overwrite: bool, writing: Writing, progress: bool | None,
                         extra_files: dict[str, str] | None) -> Result:
    """One rank's part of a torchrun conversion. Rank 0 owns the staging folder and everything in OUT
    besides the weights; each rank writes the files `split_files` deals it; a failure anywhere fails
    every rank, and rank 0 then removes the staging folder."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")  # the rendezvous torchrun set up in the environment
    rank, world = dist.get_rank(), dist.get_world_size()
    start = time.perf_counter()
    folder, refusal = None, None
    if rank == 0:
        try:
            folder = plan.sink.stage(out, overwrite)
        except UnshardError as e:
            refusal = str(e)
    shared = [str(folder.path) if folder else None, refusal]
    dist.broadcast_object_list(shared, src=0)
    if shared[1]:
        raise UnshardError(shared[1]) if rank == 0 else PeerFailedError(shared[1])
    mine = split_files(plan, world)[rank]
    try:
        survey(plan, writing.threads, progress if rank == 0 else False)  # (every rank all of it: what any file needs)
        with _progress(sum(sum(g.nbytes for g in plan.files[f]) for f in mine), progress if rank == 0 else False) as bar:
            outcome = ("ok", _write_part(plan, Path(shared[0]), mine, writing, bar), peak_rss())
    except Exception as e:
        outcome = ("error", _describe(e), peak_rss())
    outcomes: list = [None] * world
    dist.all_gather_object(outcomes, outcome)
    failures = [f"rank {r}: {o[1]}" for r, o in enumerate(outcomes) if o[0] == "error"]
    copied, warnings, status = [], [], [None]
    if rank == 0:
        try:
            if failures:
                raise UnshardError("; ".join(failures) + "; nothing was written to the output")
            digests = {f: s for o in outcomes for f, s in o[1].items()}
            copied, warnings = plan.sink.finish(plan, folder.path, digests, extra_files)
            folder.commit()
        except BaseException as e:
            folder.abort()
            status = [_describe(e)]
            dist.broadcast_object_list(status, src=0)
            raise
    dist.broadcast_object_list(status, src=0)
    if status[0] is not None:
        raise PeerFailedError(status[0])
    return Result(out, len(plan.outputs), plan.total_bytes, time.perf_counter() - start,
                  max(o[2] for o in outcomes), list(plan.files), copied, warnings, writers=world, rank=rank)


def _write_weights(plan: Plan, folder: Path, filenames: list[str], writing: Writing, bar) -> dict[str, str | None]:
    """These files of the plan, and their sha256 if asked. `writing.threads` threads each read, assemble
    and write one group at a time, so at most that many groups are held at once."""
    files = {filename: plan.sink.open(folder / filename, plan.stored(filename)) for filename in filenames}

    def write(filename: str, group: Group) -> None:
        file = files[filename]
        for ready in ready_to_write(plan, group):
            out = ready.output
            if out.encoding is None:
                file.write_parts(out.name, out.dtype, out.shape, ready.parts)
            else:
                stored = {s.name: file.tensor(s.name, s.dtype, s.shape) for s in out.stored}
                for name, piece in encoded(out, ready.parts):
                    stored[name].write(piece)
                for tensor in stored.values():
                    tensor.close()
            if ready.then is not None:
                ready.then()
            bar.update(out.nbytes)

    try:
        _each_group(plan, filenames, writing.threads, write)
        for file in files.values():
            file.close()
    finally:
        for file in files.values():
            file.close(check=False)
    if not writing.checksums:
        return dict.fromkeys(filenames)
    with ThreadPoolExecutor(max(1, writing.threads)) as pool:  # (hashlib lets go of the GIL: one core per file)
        return dict(zip(filenames, pool.map(lambda name: sha256_of(folder / name), filenames)))


def encoded(output: OutputTensor, parts: Iterable[Part]) -> Iterator[tuple[str, torch.Tensor]]:
    """(stored tensor, its next piece) for an output with an encoding: each band of its rows encoded."""
    for start, band in bands(output, parts):
        yield from output.encoding.encode(band, start).items()


def bands(output: OutputTensor, parts: Iterable[Part]) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, band) for an output with an encoding: the parts gathered into bands of whole rows. Memory: one
    band, however large the tensor. The band is this thread's, kept from tensor to tensor, and a part lying in a
    file is read straight into it; each band is used before the next is filled into it."""
    import torch

    encoding = output.encoding
    row_bytes = output.nbytes_as_is // output.shape[0]
    multiple = encoding.rows_per_band
    rows = max(multiple, ENCODING_BAND_BYTES // max(1, row_bytes) // multiple * multiple)
    band = thread_buffer("band", rows * row_bytes)
    filled, start = 0, 0

    def whole_rows(nbytes: int) -> torch.Tensor:
        flat = torch.from_numpy(band[:nbytes]).view(output.dtype.torch)
        return flat.view(-1, *output.shape[1:])

    for part in parts:
        in_file = isinstance(part, FileBytes)
        data = None if in_file else bytes_of(part).cast("B")
        done, size = 0, part.nbytes if in_file else data.nbytes
        while done < size:
            n = min(size - done, len(band) - filled)
            if in_file:
                read_bytes(part.path, part.offset + done, band[filled:filled + n])
            else:
                band[filled:filled + n] = data[done:done + n]
            filled, done = filled + n, done + n
            if filled == len(band):
                yield start, whole_rows(filled)
                filled, start = 0, start + rows
    if filled:
        yield start, whole_rows(filled)


def survey(plan: Plan, threads: int, progress: bool | None) -> None:
    """A first pass over the outputs whose encoding must see all of them before encoding any (NVFP4's global scale,
    shared by fused siblings): each read a band at a time, as writing reads it, and shown to its encoding."""
    surveyed = {o.name for o in plan.outputs if o.encoding is not None and o.encoding.surveys}
    if not surveyed:
        return

    def look(filename: str, group: Group) -> None:
        if not any(o.name in surveyed for o in group.outputs):
            return
        for ready in ready_to_write(plan, group):
            if ready.output.name in surveyed:
                for _, band in bands(ready.output, ready.parts):
                    ready.output.encoding.survey(band)
                bar.update(ready.output.nbytes_as_is)
            if ready.then is not None:
                ready.then()

    total = sum(o.nbytes_as_is for o in plan.outputs if o.name in surveyed)
    with _progress(total, progress, "surveying") as bar:
        _each_group(plan, list(plan.files), threads, look)


def _each_group(plan: Plan, filenames: list[str], threads: int, do: Callable[[str, Group], None]) -> None:
    """Call do(filename, group) for every group of these files from `threads` threads, starting a group
    only when the groups in flight leave room for it in the plan's memory estimate."""
    work = deque((filename, group, plan.held(group)) for filename, group in _across_files(plan, filenames))
    threads = max(1, threads)
    budget = plan.peak_memory_estimate(threads)
    with ThreadPoolExecutor(threads) as pool:
        running: dict = {}  # future -> bytes its group holds
        while work or running:
            if plan.question is not None and plan.question.answered():
                plan.question.verdict()  # a checkpoint that does not fit its config stops here, not at the end
            # The next group starts when a thread is free and the groups in flight leave room for it
            # (or nothing is in flight): a large tensor waits for the others rather than doubling the peak.
            while work and len(running) < threads and (not running or sum(running.values()) + work[0][2] <= budget):
                filename, group, held = work.popleft()
                running[pool.submit(do, filename, group)] = held
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                del running[future]
                future.result()  # the first error stops the run


def _across_files(plan: Plan, filenames: list[str]) -> Iterator[tuple[str, Group]]:
    """The groups of these files, taking next from the file least far along (by bytes), so that
    threads working at once mostly write different files: ext4 and xfs let one writer at a time
    into a file, and copying into the page cache is CPU-bound, so two files fill twice as fast."""
    left = {f: deque(plan.files[f]) for f in filenames if plan.files[f]}
    size = {f: max(1, sum(g.nbytes for g in left[f])) for f in left}
    done = dict.fromkeys(left, 0)
    while left:
        filename = min(left, key=lambda f: done[f] / size[f])
        group = left[filename].popleft()
        done[filename] += group.nbytes
        if not left[filename]:
            del left[filename]
        yield filename, group


def verify_folder(plan: Plan, folder: Path, filenames: list[str], threads: int = 1) -> None:
    """Check the CRC-32 of the torch.save records read, then read back every tensor written to these files
    and compare it byte for byte with the checkpoint: each piece's bytes read again from its file, or
    assembled and cast (and encoded) again, a chunk at a time. So verifying holds what writing held, and
    needs torch only where writing did."""
    plan.checkpoint.check_records(pieces_read([g for f in filenames for g in plan.files[f]]))
    written = {filename: plan.sink.read_back(folder / filename) for filename in filenames}
    for filename, file in written.items():
        planned = sorted((s.name, s.dtype.safetensors, s.shape) for s in plan.stored(filename))
        if sorted((name, *entry[:2]) for name, entry in file.entries.items()) != planned:  # (in the format's order)
            raise UnshardError(f"{file.path}: its header is not the planned one; the file was changed during conversion")

    def compare(filename: str, group: Group) -> None:
        for ready in ready_to_write(plan, group):
            file, output = written[filename], ready.output
            if output.encoding is None:
                same = file.holds(output.name, ready.parts)
            else:
                at = dict.fromkeys((s.name for s in output.stored), 0)
                same = True
                for name, piece in encoded(output, ready.parts):
                    data = bytes_of(piece)
                    same = same and file.holds_at(name, at[name], data)
                    at[name] += data.nbytes
                same = same and all(file.size_of(name) == n for name, n in at.items())
            if ready.then is not None:
                ready.then()
            if not same:
                raise UnshardError(f"{folder / filename}: {output.name} differs from the checkpoint after "
                                   "writing; the disk or the source changed during conversion")

    _each_group(plan, filenames, threads, compare)

"""The weight files written by threads: each takes the next group of the plan, assembles it (assemble.py) and
writes it to its place in its file, so reading, copying and writing overlap while memory stays at a few tensors.
Also the plan's first pass, where an encoding must see a whole tensor before writing any of it, and the check that
reads every written tensor back."""

from __future__ import annotations

import resource
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UnshardError
from ..plan import pieces_read
from ..sinks.safetensors import bytes_of, sha256_of
from ..types import Group, Plan
from ..units import human_bytes
from .assemble import bands, encoded, ready_to_write


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
        return (
            f"wrote {self.tensors} tensors, {human_bytes(self.bytes)} in {len(self.files)} file(s) to {self.out}"
            f"{by} in {self.seconds:.1f}s ({human_bytes(rate)}/s), peak memory "
            f"{human_bytes(self.peak_rss)}{' per process' if self.writers > 1 else ''}"
        )


@dataclass(frozen=True)
class Writing:
    """How the weight files are written; the same for every writer of one conversion."""

    threads: int = 1  # tensors read, assembled and written at once
    verify: bool = False  # re-read every written tensor and compare it with the source
    checksums: bool = False  # each file's sha256 in the model card (costs a core at about 1 GB/s)
    sync: bool = True  # each file's bytes on the disk (fdatasync) as soon as it is complete (--no-sync: not)


def peak_rss(children: bool = False) -> int:
    """Largest resident set of this process (or, with `children`, of it and any waited-for child)."""
    who = [resource.RUSAGE_SELF] + ([resource.RUSAGE_CHILDREN] if children else [])
    kb = max(resource.getrusage(w).ru_maxrss for w in who)
    return kb if sys.platform == "darwin" else kb * 1024


def progress_bar(total: int, enabled: bool | None, what: str = "converting"):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=what, disable=None if enabled is None else not enabled)


def write_files(plan: Plan, folder: Path, filenames: list[str], writing: Writing, bar) -> dict[str, str | None]:
    """Write (and verify, if asked) some of the plan's files; their sha256 by name, if asked."""
    digests = _write_weights(plan, folder, filenames, writing, bar)
    if writing.verify:
        verify_folder(plan, folder, filenames, writing.threads)
    return digests


def _write_weights(plan: Plan, folder: Path, filenames: list[str], writing: Writing, bar) -> dict[str, str | None]:
    """These files of the plan, and their sha256 if asked. `writing.threads` threads each read, assemble
    and write one group at a time, so at most that many groups are held at once."""
    files = {filename: plan.sink.open(folder / filename, plan.stored(filename)) for filename in filenames}
    for file in files.values():
        file.writeback = writing.sync
    # Each file is synced by the thread that writes its last group, while the others go on writing theirs.
    unwritten, lock = {f: len(plan.files[f]) for f in filenames}, threading.Lock()

    def synced_when_complete(filenames_of_group: list[str]) -> None:
        for filename in filenames_of_group:
            with lock:
                unwritten[filename] -= 1
                complete = unwritten[filename] == 0
            if complete and writing.sync:
                files[filename].sync()

    def write(filenames_of_group: list[str], group: Group) -> None:
        file = files[filenames_of_group[0]]
        for ready in ready_to_write(plan, group):
            out = ready.output
            if out.encoding is None:
                file.write_parts(out.name, out.dtype, out.shape, ready.parts)
            else:
                # (a stored tensor placed in a file another writer writes is that writer's)
                homes = {s.name: files.get(plan.placed.get(s.name, filenames_of_group[0])) for s in out.stored}
                stored = {s.name: homes[s.name].tensor(s.name, s.dtype, s.shape) for s in out.stored if homes[s.name]}
                for name, piece in encoded(out, ready.parts):
                    if name in stored:
                        stored[name].write(piece)
                for tensor in stored.values():
                    tensor.close()
            if ready.then is not None:
                ready.then()
            bar.update(out.nbytes)
        synced_when_complete(filenames_of_group)

    try:
        _each_group(plan, filenames, writing.threads, write)
        for filename, file in files.items():
            if writing.sync and not plan.files[filename]:  # (a file of no groups: its header alone)
                file.sync()
            file.close()
    finally:
        for file in files.values():
            file.close(check=False)
    if not writing.checksums:
        return dict.fromkeys(filenames)
    with ThreadPoolExecutor(max(1, writing.threads)) as pool:  # (hashlib lets go of the GIL: one core per file)
        return dict(zip(filenames, pool.map(lambda name: sha256_of(folder / name), filenames)))


def survey(plan: Plan, threads: int, progress: bool | None) -> None:
    """A first pass over the outputs whose encoding must see all of them before encoding any (NVFP4's global scale,
    shared by fused siblings): each read a band at a time, as writing reads it, and shown to its encoding."""
    surveyed = {o.name for o in plan.outputs if o.encoding is not None and o.encoding.surveys}
    if not surveyed:
        return

    def look(filenames_of_group: list[str], group: Group) -> None:
        if not any(o.name in surveyed for o in group.outputs):
            return
        for ready in ready_to_write(plan, group):
            if ready.output.name in surveyed:
                for start, band in bands(ready.output, ready.parts):
                    ready.output.encoding.survey(band, start)
                bar.update(ready.output.nbytes_as_is)
            if ready.then is not None:
                ready.then()

    total = sum(o.nbytes_as_is for o in plan.outputs if o.name in surveyed)
    with progress_bar(total, progress, "surveying") as bar:
        _each_group(plan, list(plan.files), threads, look)


def _each_group(plan: Plan, filenames: list[str], threads: int, do: Callable[[list[str], Group], None]) -> None:
    """Call do(its files among these, group) for every group of these files, once, from `threads` threads, starting
    a group only when the groups in flight leave room for it in the plan's memory estimate."""
    work = deque((held_by, group, plan.held(group)) for held_by, group in _across_files(plan, filenames))
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


def _across_files(plan: Plan, filenames: list[str]) -> Iterator[tuple[list[str], Group]]:
    """The groups of these files, each once with the files among these that hold it (several: see `Plan.placed`),
    taking next from the file least far along (by bytes), so that threads working at once mostly write different
    files: ext4 and xfs let one writer at a time into a file, and copying into the page cache is CPU-bound, so two
    files fill twice as fast."""
    left = {f: deque(plan.files[f]) for f in filenames if plan.files[f]}
    size = {f: max(1, sum(g.nbytes for g in left[f])) for f in left}
    done = dict.fromkeys(left, 0)
    held_by: dict[int, list[str]] = {}
    for filename in left:
        for group in left[filename]:
            held_by.setdefault(id(group), []).append(filename)
    given: set[int] = set()
    while left:
        filename = min(left, key=lambda f: done[f] / size[f])
        group = left[filename].popleft()
        done[filename] += group.nbytes
        if not left[filename]:
            del left[filename]
        if id(group) not in given:
            given.add(id(group))
            yield held_by[id(group)], group


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
            raise UnshardError(
                f"{file.path}: its header is not the planned one; the file was changed during conversion"
            )

    def compare(filenames_of_group: list[str], group: Group) -> None:
        filename = filenames_of_group[0]
        for ready in ready_to_write(plan, group):
            file, output = written[filename], ready.output
            if output.encoding is None:
                same = file.holds(output.name, ready.parts)
            else:
                homes = {s.name: written.get(plan.placed.get(s.name, filename)) for s in output.stored}
                at = {s.name: 0 for s in output.stored if homes[s.name]}
                same = True
                for name, piece in encoded(output, ready.parts):
                    if name in at:
                        data = bytes_of(piece)
                        same = same and homes[name].holds_at(name, at[name], data)
                        at[name] += data.nbytes
                same = same and all(homes[name].size_of(name) == n for name, n in at.items())
            if ready.then is not None:
                ready.then()
            if not same:
                raise UnshardError(
                    f"{folder / filename}: {output.name} differs from the checkpoint after "
                    "writing; the disk or the source changed during conversion"
                )

    _each_group(plan, filenames, threads, compare)

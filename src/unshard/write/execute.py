"""Walk a plan into OUT: stage the folder, write the weight files (threads.py: by threads; scale_out.py: by
processes or torchrun ranks), have the output format finish the folder, and put it in place. Nothing is written
outside the staging folder until every file is complete.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time
from pathlib import Path

from ..names.hf_names import NamingChanged
from ..plan import require_config
from ..types import Plan
from .scale_out import convert_distributed, write_in_processes
from .threads import Result, Writing, peak_rss, progress_bar, survey, write_files

log = logging.getLogger("unshard")


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


def convert(
    plan: Plan,
    out: str | Path,
    *,
    overwrite: bool = False,
    threads: int = 1,
    verify: bool = False,
    checksums: bool = False,
    progress: bool | None = None,
    extra_files: dict[str, str | bytes] | None = None,
    workers: int = 1,
    distributed: bool = False,
    sync: bool = True,
) -> Result:
    """Write the plan's folder at OUT. `extra_files` (name -> text, or bytes) are added to it (a merge's recipe);
    a README.md among them opens the model card.

    workers: processes on this host, each writing its share of the output files (forked, so each
    has the plan already). distributed: this process is one rank of a torch.distributed job (started
    by torchrun); every rank must call convert with the same plan and OUT on a shared filesystem.
    sync: every file on the disk before OUT is put in place, and OUT's name after (sinks/staging.py); False for
    scratch outputs only: a crash or power loss may then leave an OUT that looks complete with files cut short.
    """
    out = Path(out)
    require_config(plan)
    return_freed_memory()
    writing = Writing(threads, verify, checksums, sync)
    if not sync:
        plan.notes.append("written with --no-sync: its files were not flushed to the disk before it was put in place")
    workers = max(1, min(workers, len(plan.files)))
    late_notes: list[str] = []
    if plan.question is not None and (distributed or workers > 1):
        # Every rank must write the same plan, and forking while a thread imports is unsafe: answer first.
        plan, late_notes = _answered(plan)
    if distributed:
        return convert_distributed(plan, out, overwrite, writing, progress, extra_files)
    # A model's first conversion is planned under the names as saved while transformers is asked what the model
    # holds (plan.question). The first attempt writes that plan; where the answer names the tensors otherwise, the
    # second writes the plan made from the answer, which has no question left.
    start = time.perf_counter()
    written = _attempt(plan, out, overwrite, writing, progress, extra_files, workers)
    if written is None:
        log.info("transformers names this model's tensors otherwise than the checkpoint: writing again")
        shown = list(plan.notes)
        plan = plan.rebuild()
        written = _attempt(plan, out, overwrite, writing, progress, extra_files, workers)
        # (what the plan made from the answer says that the first did not: a kept MTP layer, routers in float32)
        late_notes += [note for note in plan.notes if note not in shown]
    answer_notes, copied, warnings = written
    return Result(
        out,
        len(plan.outputs),
        plan.total_bytes,
        time.perf_counter() - start,
        peak_rss(children=workers > 1),
        list(plan.files),
        copied,
        late_notes + answer_notes + warnings,
        writers=workers,
    )


def _attempt(plan: Plan, out: Path, overwrite, writing, progress, extra_files, workers: int):
    """Write the plan into a staging folder and put it in place: (the notes transformers' answer adds, the files
    copied, the warnings); None, with nothing left behind, where the answer names the tensors otherwise."""
    folder = plan.sink.stage(out, overwrite, writing.sync)
    try:
        survey(plan, writing.threads, progress)  # (before forking: the workers are given what it found)
        with progress_bar(plan.total_bytes, progress) as bar:
            if workers > 1:
                digests = write_in_processes(plan, folder.path, writing, bar, workers)
            else:
                digests = write_files(plan, folder.path, list(plan.files), writing, bar)
        answer_notes = []
        if plan.question is not None:
            answer_notes = plan.question.verdict()
            plan.notes.extend(answer_notes)
        copied, warnings = plan.sink.finish(plan, folder.path, digests, extra_files)
        folder.commit()
    except NamingChanged:
        folder.abort()
        return None
    except BaseException:
        folder.abort()
        raise
    return answer_notes, copied, warnings


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

"""A plan's output files dealt out to several writers: processes forked on this host, or the ranks of a torchrun
job on a shared filesystem. Every writer has the same plan, writes (and verifies) its own files into one staging
folder, and a single process finishes the folder (index, config, model card) and puts it in place only if every
writer succeeded."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from pathlib import Path

from ..errors import PeerFailedError, UnshardError
from ..types import Plan
from .threads import Result, Writing, peak_rss, progress_bar, survey, write_files


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


class _SharedCounter:
    """A progress bar's `update` for a forked worker: bytes written, added to a counter the parent shows."""

    def __init__(self, value):
        self.value = value

    def update(self, n: int) -> None:
        with self.value.get_lock():
            self.value.value += n


def _worker(plan, folder, filenames, writing, written, results) -> None:
    try:
        results.put(("ok", write_files(plan, folder, filenames, writing, _SharedCounter(written))))
    except BaseException as e:  # reported to the parent, which fails the whole run
        results.put(("error", _describe(e), isinstance(e, UnshardError)))


def _describe(e: BaseException) -> str:
    return str(e) if isinstance(e, UnshardError) else f"{type(e).__name__}: {e}"


def write_in_processes(plan: Plan, folder: Path, writing: Writing, bar, workers: int) -> dict[str, str | None]:
    """Fork `workers` processes, each writing its share of the files; any failure fails the run."""
    # fork: each worker starts with the plan (readers, open maps, a merge's methods) already built.
    context = multiprocessing.get_context("fork")
    written, results = context.Value("q", 0), context.Queue()
    procs = [
        context.Process(target=_worker, args=(plan, folder, share, writing, written, results), daemon=True)
        for share in split_files(plan, workers)
        if share
    ]
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
                        raise UnshardError(
                            f"a worker process died (exit code {dead[0].exitcode}: killed, or out of "
                            "memory?); nothing was written to the output; retry with fewer --workers"
                        ) from None
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


def _join_process_group(dist) -> None:
    """The process group of the ranks torchrun started (its rendezvous is in the environment). One that cannot form
    (a node's interface, an unreachable master, a port in use, a timeout) is the setup's to fix: one line per rank
    saying what to set, before anything is written."""
    try:
        dist.init_process_group("gloo")
    except Exception as e:  # (torch raises RuntimeError, DistNetworkError, DistStoreError, ValueError, TimeoutError)
        why = " ".join(str(e).split())[:300]
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        interface = os.environ.get("GLOO_SOCKET_IFNAME")
        raise UnshardError(
            f"rank {os.environ.get('RANK', '?')}: the ranks' process group did not form ({type(e).__name__}: {why}); "
            f"nothing was written: check that every node reaches the master at {where} (torchrun's --rdzv-endpoint "
            "or MASTER_ADDR and MASTER_PORT, a port no other program holds) and set GLOO_SOCKET_IFNAME to the "
            "network interface the nodes share"
            + (
                f" (it is {interface!r} here)"
                if interface
                else " (gloo otherwise binds where the host name resolves, often 127.0.0.1)"
            )
        ) from None


def convert_distributed(
    plan: Plan, out: Path, overwrite: bool, writing: Writing, progress: bool | None, extra_files: dict[str, str] | None
) -> Result:
    """One rank's part of a torchrun conversion. Rank 0 owns the staging folder and everything in OUT
    besides the weights; each rank writes the files `split_files` deals it; a failure anywhere fails
    every rank, and rank 0 then removes the staging folder."""
    import torch.distributed as dist

    if not dist.is_initialized():
        _join_process_group(dist)
    rank, world = dist.get_rank(), dist.get_world_size()
    start = time.perf_counter()
    folder, refusal = None, None
    if rank == 0:
        try:
            folder = plan.sink.stage(out, overwrite, writing.sync)
        except UnshardError as e:
            refusal = str(e)
    shared = [str(folder.path) if folder else None, refusal]
    dist.broadcast_object_list(shared, src=0)
    if shared[1]:
        raise UnshardError(shared[1]) if rank == 0 else PeerFailedError(shared[1])
    mine = split_files(plan, world)[rank]
    try:
        survey(plan, writing.threads, progress if rank == 0 else False)  # (every rank all of it: what any file needs)
        with progress_bar(
            sum(sum(g.nbytes for g in plan.files[f]) for f in mine), progress if rank == 0 else False
        ) as bar:
            outcome = ("ok", write_files(plan, Path(shared[0]), mine, writing, bar), peak_rss())
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
    return Result(
        out,
        len(plan.outputs),
        plan.total_bytes,
        time.perf_counter() - start,
        max(o[2] for o in outcomes),
        list(plan.files),
        copied,
        warnings,
        writers=world,
        rank=rank,
    )

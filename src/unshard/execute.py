"""Walk a plan: assemble each checkpoint tensor, convert it, write it, drop it.

Up to `threads` tensors are assembled ahead of the writer, so reading overlaps writing while memory
stays at a few tensors. Nothing is written outside the staging folder until every file is complete.
"""

from __future__ import annotations

import itertools
import resource
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import UnshardError
from .plan import DTYPE_NAMES, Group, Plan
from .report import human_bytes
from .writer import OutputFolder, SafetensorsStream, copy_model_files, write_index


@dataclass
class Result:
    out: Path
    tensors: int
    bytes: int
    seconds: float
    peak_rss: int
    files: list[str]
    copied: list[str]

    def line(self) -> str:
        rate = self.bytes / max(self.seconds, 1e-9)
        return (f"wrote {self.tensors} tensors, {human_bytes(self.bytes)} in {len(self.files)} file(s) to {self.out} "
                f"in {self.seconds:.1f}s ({human_bytes(rate)}/s), peak memory {human_bytes(self.peak_rss)}")


def peak_rss() -> int:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb if sys.platform == "darwin" else kb * 1024


def materialise(plan: Plan, group: Group) -> list[tuple[str, torch.Tensor]]:
    """The output tensors of one group, in the plan's dtype and order."""
    whole = plan.checkpoint.read(group.source.name)
    produced = group.convert(whole) if group.convert else {group.outputs[0].name: whole}
    return [(o.name, produced[o.name].to(o.dtype)) for o in group.outputs]


def _progress(total: int, enabled: bool | None):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="converting", disable=None if enabled is None else not enabled)


def convert(plan: Plan, out: str | Path, *, overwrite: bool = False, threads: int = 1, verify: bool = False,
            progress: bool | None = None, extra_files: dict[str, str] | None = None) -> Result:
    """Write the plan's folder at OUT. `extra_files` (name -> text) are added to it (a merge's recipe)."""
    out = Path(out)
    plan.require_config()
    start = time.perf_counter()
    folder = OutputFolder(out, overwrite)
    try:
        with _progress(plan.total_bytes, progress) as bar:
            _write_weights(plan, folder.path, threads, bar)
        write_index(folder.path, {f: [o.name for g in gs for o in g.outputs] for f, gs in plan.files.items()},
                    plan.total_bytes)
        copied = copy_model_files(plan.config_folder, folder.path, DTYPE_NAMES.get(plan.dtype, "float32"))
        for name, text in (extra_files or {}).items():
            (folder.path / name).write_text(text)
            copied.append(name)
        if verify:
            verify_folder(plan, folder.path)
        folder.commit()
    except BaseException:
        folder.abort()
        raise
    return Result(out, len(plan.outputs), plan.total_bytes, time.perf_counter() - start, peak_rss(),
                  list(plan.files), copied)


def _write_weights(plan: Plan, folder: Path, threads: int, bar) -> None:
    """Every safetensors file of the plan. Up to `threads` groups are materialised ahead, in order."""
    threads = max(1, threads)
    work = ((filename, group) for filename, groups in plan.files.items() for group in groups)
    streams: dict[str, SafetensorsStream] = {}
    try:
        with ThreadPoolExecutor(threads) as pool:
            pending = deque((f, pool.submit(materialise, plan, g)) for f, g in itertools.islice(work, threads))
            while pending:
                filename, future = pending.popleft()
                stream = streams.get(filename)
                if stream is None:
                    entries = [(o.name, o.dtype, o.shape) for g in plan.files[filename] for o in g.outputs]
                    stream = streams[filename] = SafetensorsStream(folder / filename, entries)
                for name, tensor in future.result():
                    stream.write(name, tensor)
                    bar.update(tensor.numel() * tensor.element_size())
                if stream.complete:
                    stream.close()
                # Refill only now, so no more than `threads` groups are held at once.
                for f, g in itertools.islice(work, 1):
                    pending.append((f, pool.submit(materialise, plan, g)))
    finally:
        for stream in streams.values():
            stream.close(check=False)


def verify_folder(plan: Plan, folder: Path) -> None:
    """Re-read every written tensor with the safetensors library and compare it with the source."""
    from safetensors import safe_open

    for filename, groups in plan.files.items():
        with safe_open(folder / filename, framework="pt") as f:
            for group in groups:
                for name, expected in materialise(plan, group):
                    if not torch.equal(f.get_tensor(name), expected):
                        raise UnshardError(f"{folder / filename}: {name} differs from the checkpoint after writing; "
                                           "the disk or the source changed during conversion")

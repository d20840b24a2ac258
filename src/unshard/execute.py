"""Walk a plan: assemble each checkpoint tensor, convert it, write it, drop it.

Up to `threads` tensors are assembled ahead of the writer, so reading overlaps writing while memory
stays at a few tensors. Nothing is written outside the staging folder until every file is complete.
"""

from __future__ import annotations

import itertools
import json
import resource
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import UnshardError
from .plan import DTYPE_NAMES, Group, Plan
from .report import human_bytes, model_card
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
    warnings: list[str] = field(default_factory=list)

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
    """Write the plan's folder at OUT. `extra_files` (name -> text) are added to it (a merge's recipe);
    a README.md among them opens the model card."""
    out = Path(out)
    plan.require_config()
    start = time.perf_counter()
    folder = OutputFolder(out, overwrite)
    extra = dict(extra_files or {})
    try:
        with _progress(plan.total_bytes, progress) as bar:
            checksums = _write_weights(plan, folder.path, threads, bar)
        write_index(folder.path, {f: [o.name for g in gs for o in g.outputs] for f, gs in plan.files.items()},
                    plan.total_bytes)
        copied = copy_model_files(plan.config_folder, folder.path, DTYPE_NAMES.get(plan.dtype, "float32"),
                                  plan.config_updates)
        extra["README.md"] = model_card(plan, checksums, extra.get("README.md"))
        for name, text in extra.items():
            (folder.path / name).write_text(text)
            copied.append(name)
        if verify:
            verify_folder(plan, folder.path)
        warnings = check_folder(folder.path)
        folder.commit()
    except BaseException:
        folder.abort()
        raise
    return Result(out, len(plan.outputs), plan.total_bytes, time.perf_counter() - start, peak_rss(),
                  list(plan.files), copied, warnings)


def check_folder(folder: Path) -> list[str]:
    """Load the written config (and tokenizer) as a serving stack would; what it would miss, as warnings.
    A config transformers cannot read is an error: the folder would not load anywhere."""
    warnings = []
    names = {p.name for p in folder.iterdir()}
    # (A missing tokenizer is already among the plan's notes.)
    if names & {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"} and "chat_template.jinja" not in names and "chat_template" not in _read_json(folder / "tokenizer_config.json"):
        warnings.append("no chat template in the output (fine for a base model; a chat model needs one)")
    if "generation_config.json" not in names:
        warnings.append("no generation_config.json: generation falls back to defaults (eos, sampling)")
    try:
        import transformers
    except ImportError:
        return warnings
    try:
        transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except ValueError as e:
        if "trust_remote_code" not in str(e):  # custom code is copied, never run
            raise UnshardError(f"{folder / 'config.json'}: transformers cannot read it ({e})") from None
    if names & {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"}:
        try:
            transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        except Exception as e:  # a missing optional package (sentencepiece) is the user's to install
            warnings.append(f"the tokenizer does not load here ({type(e).__name__}: {str(e)[:120]})")
    return warnings


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_weights(plan: Plan, folder: Path, threads: int, bar) -> dict[str, str]:
    """Every safetensors file of the plan, and their sha256. Up to `threads` groups are materialised
    ahead, in order."""
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
    return {name: stream.sha256 for name, stream in streams.items()}


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

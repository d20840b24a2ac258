"""GGUF as an output format (a types.Sink): one file for llama.cpp, built in a staging folder beside OUT and moved
into place when whole, with a vision-language model's mmproj file beside it."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...errors import OutputExistsError, UnshardError
from ...types import FormatRequest, Group, OutputOptions, OutputTensor, Plan
from ..staging import OutputFolder, sync_path
from .adapter import LORA_FILE_NAME, lora_path, plan_lora
from .file import GGUFFile, WrittenGGUF, header
from .model import gguf_model
from .plan import plan_gguf
from .split import split_places, split_plan, split_size
from .tensors import FILE_NAME, MMPROJ_FILE_NAME, PART, GGUFPlan, stacked

SUMMARY_KEY = "gguf"


def mmproj_path(out: Path) -> Path:
    """Where a vision-language model's mmproj file goes: beside OUT, named after it (mmproj-OUT), as llama.cpp's
    users and LM Studio find it."""
    return out.with_name("mmproj-" + out.name)


class GGUFSink:
    """One GGUF file as the output (a types.Sink), or the files of its split, and a vision-language model's mmproj
    file beside it. OUT is the file itself: it is built in a staging folder beside OUT and moved into place when
    complete."""

    def __init__(self, plan: GGUFPlan, split_max_size: int = 0, where: str = ""):
        self.plan, self.where = plan, where
        self.plans = split_plan(plan, split_max_size) if split_max_size else {FILE_NAME: plan}
        if plan.mmproj:
            self.plans[MMPROJ_FILE_NAME] = plan.mmproj
        # Stored tensors by the file holding them where a group's lie in several (see Plan.placed): a split's, and
        # the text model's tensors with rows in the mmproj file (tensors.WithRows)
        file_of = {tensor: name for name, file in self.plans.items() if file.split for tensor in file.tensors}
        if plan.mmproj and plan.elsewhere:
            file_of.update(dict.fromkeys(plan.elsewhere, MMPROJ_FILE_NAME))
            file_of.update(dict.fromkeys(plan.mmproj.elsewhere - file_of.keys(), FILE_NAME))
        self.placed = {
            s.name: file_of[stacked(s.name)[0]]
            for encoding in plan.encoded.values()
            for s in encoding.stored
            if stacked(s.name)[0] in file_of
        }

    def lay_out(self, groups: dict[str, Group], max_shard_size: int | str) -> dict[str, list[Group]]:
        files: dict[str, list[Group]] = {name: [] for name in self.plans}
        for group in groups.values():
            stored = [s.name for o in group.outputs for s in o.stored]
            held = {self.placed[name] for name in stored if name in self.placed} or {
                next(name for name, plan in self.plans.items() if group.outputs[0].name in plan.encoded)
            }
            for name in held:
                files[name].append(group)
        return {
            name: sorted(found, key=lambda g: self.plans[name].position(g.outputs[0])) for name, found in files.items()
        }

    def take_adapter(self, groups: list[Group], config: dict[str, Any]) -> dict[str, list[Group]]:
        """A LoRA adapter kept apart (--lora separate): llama.cpp's adapter file beside OUT (adapter.py)."""
        lora = plan_lora(self.plan, groups, config, self.where)
        self.plans[LORA_FILE_NAME] = lora
        self.plan.notes.extend(lora.notes)
        return {LORA_FILE_NAME: sorted(groups, key=lambda g: lora.position(g.outputs[0]))}

    def places(self, out: Path) -> dict[str, Path]:
        """Where each file goes, by its name in the staging folder, in the order they are put there: OUT (or the
        first file of its split, which llama.cpp loads the others from) last, as it says the output is whole."""
        model = [name for name in self.plans if name not in (MMPROJ_FILE_NAME, LORA_FILE_NAME)]
        places = {MMPROJ_FILE_NAME: mmproj_path(out)} if MMPROJ_FILE_NAME in self.plans else {}
        if LORA_FILE_NAME in self.plans:
            places[LORA_FILE_NAME] = lora_path(out)
        if model == [FILE_NAME]:
            return {**places, FILE_NAME: out}
        split = split_places(model, out)
        return {**places, **dict(reversed(split.items()))}

    def stage(self, out: Path, overwrite: bool, sync: bool = True) -> OutputFile:
        return OutputFile(out, self.places(out), overwrite, sync)

    def open(self, path: Path, tensors: list[OutputTensor]) -> GGUFFile:
        return GGUFFile(path, tensors, self.plans[path.name])

    def file_size(self, filename: str, tensors: list[OutputTensor]) -> int:
        return header(self.plans[filename], tensors)[3]

    def read_back(self, path: Path) -> WrittenGGUF:
        """The file's tensors read back: the computed ones checked here, the others left to --verify."""
        plan = self.plans[path.name]
        members = Counter(stacked(e.stored[0].name)[0] for e in plan.encoded.values() if PART.match(e.stored[0].name))
        written = WrittenGGUF(path, dict(members), plan.joined_rows)
        planned = plan.made_header[1][0] if plan.made_header else b""
        with open(path, "rb") as f:  # (the metadata and tensor infos as gguf-py's writer made them)
            if f.read(len(planned)) != planned:
                raise UnshardError(f"{path}: its header is not the planned one; the file was changed during conversion")
        for name, values in plan.computed.items():
            data = memoryview(values).cast("B")
            if (
                name not in written.entries
                or written.size_of(name) != data.nbytes
                or not written.holds_at(name, 0, data)
            ):
                raise UnshardError(f"{path}: {name} is not the planned one; the file was changed during conversion")
            del written.entries[name]
        return written

    def finish(self, plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None):
        return [], []  # (everything is in the file's header)

    def notes(self) -> list[str]:
        return self.plan.notes

    def config_updates(self) -> dict[str, Any]:
        return {}

    def summary(self) -> dict[str, Any]:
        files = [name for name in self.plans if name not in (MMPROJ_FILE_NAME, LORA_FILE_NAME)]
        summary = {**self.plan.summary(), **({"split": len(files)} if len(files) > 1 else {})}
        if LORA_FILE_NAME in self.plans:
            summary["lora"] = self.plans[LORA_FILE_NAME].summary()
        return {SUMMARY_KEY: summary}

    def card(self) -> tuple[list[str], list[str]]:
        return [], []  # (a GGUF file has no card: its header says what it is)


def check_config(options: OutputOptions, config_folder: Path | None, dtype_name: str, config_updates: dict) -> None:
    """The one-line refusals the config alone decides (a model llama.cpp would compute otherwise, an architecture the
    installed gguf-py lacks), before transformers is asked for the model's names and a weight is read."""
    gguf_model(options.gguf, config_folder, dtype_name, config_updates, options.target_from)


def plan_sink(request: FormatRequest) -> GGUFSink:
    """A .gguf OUT: the file's types and metadata, each output given its GGUF encoding."""
    if request.options.quantize:
        raise UnshardError(f"{request.where}: a GGUF file takes no --quantize (use --gguf-type)")
    outputs = [o for g in request.groups.values() for o in g.outputs]
    gguf = plan_gguf(
        request.options.gguf,
        outputs,
        request.config_folder,
        request.dtype.name,
        request.config_updates,
        request.read,
        request.options.target_from,
    )
    encodings = {name: e for file in gguf.files().values() for name, e in file.encoded.items()}
    for name, group in list(request.groups.items()):
        if {o.name for o in group.outputs} <= gguf.left_out:  # (a tensor of a layer the file has no place for)
            del request.groups[name]  # (not read either)
            continue
        group.outputs = [replace(o, encoding=encodings[o.name]) for o in group.outputs]
    split = split_size(request.options.gguf_split) if request.options.gguf_split else 0
    return GGUFSink(gguf, split, request.where)


def summary_lines(gguf: dict[str, Any]) -> list[str]:
    """inspect's lines for a summary's `gguf`."""
    mmproj = gguf.get("mmproj")
    files = (
        f"{gguf['split']} files for llama.cpp, OUT-00001-of-{gguf['split']:05d}.gguf on (llama.cpp loads the first)"
        if gguf.get("split")
        else "one file for llama.cpp"
    )
    lines = [
        f"gguf         {files} ({gguf['architecture']}), type {gguf['type']}: "
        + ", ".join(f"{n} tensor(s) in {t}" for t, n in gguf["tensor_types"].items()),
        f"vocabulary   {gguf['vocabulary']}",
    ]
    if gguf.get("lora"):
        lora = gguf["lora"]
        lines.append(
            f"lora         the LoRA adapter as llama.cpp's adapter file beside OUT (OUT-LoRA), type {lora['type']}: "
            + ", ".join(f"{n} tensor(s) in {t}" for t, n in lora["tensor_types"].items())
        )
    if mmproj:
        towers = " and ".join(mmproj["towers"]) + (" towers" if len(mmproj["towers"]) > 1 else " tower")
        lines.append(
            f"mmproj       the {towers}, for llama.cpp's multimodal library, in a second file beside OUT "
            f"(mmproj-OUT), type {mmproj['type']}: "
            + ", ".join(f"{n} tensor(s) in {t}" for t, n in mmproj["tensor_types"].items())
        )
    return lines


class OutputFile(OutputFolder):
    """The staging folder of an output of files (not a folder): committed by moving each file to its place, in the
    order given, the last (OUT) saying the output is whole."""

    def __init__(self, out: Path, places: dict[str, Path], overwrite: bool = False, sync: bool = True):
        self.places = places  # file in the staging folder -> where it goes
        for place in self.places.values():
            if place.is_dir():
                raise UnshardError(f"{place}: is a folder; a GGUF output is one file: choose OUT ending in .gguf")
            if place.exists() and not overwrite:
                raise OutputExistsError(f"{place}: already exists; choose another OUT or pass --overwrite")
        super().__init__(out, overwrite=True, sync=sync)
        self.overwrite = overwrite

    def commit(self) -> None:
        for name, place in self.places.items():  # (each on the disk before it is put in place, and its name after)
            if self.sync:
                sync_path(self.path / name)
            self._move(self.path / name, place)
            if self.sync:
                sync_path(place.parent)
        shutil.rmtree(self.path, ignore_errors=True)

    def _move(self, made: Path, place: Path) -> None:
        if self.overwrite:
            os.replace(made, place)
            return
        try:  # a hard link fails if another run put a file at OUT since this one started
            os.link(made, place)
        except PermissionError:  # (a filesystem without hard links: no run put a file there before the check)
            if place.exists():
                raise OutputExistsError(
                    f"{place}: another run wrote it while this one was running; choose another OUT or pass --overwrite"
                ) from None
            os.replace(made, place)
        except FileExistsError:
            shutil.rmtree(self.path, ignore_errors=True)
            raise OutputExistsError(
                f"{place}: another run wrote it while this one was running; this run's "
                "output was dropped: choose another OUT or pass --overwrite"
            ) from None

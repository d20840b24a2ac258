"""A GGUF file split into several, as llama.cpp's converter splits it (`--split-max-size`, gguf-py's writer): the
file's tensors, in its order, dealt into files of at most that many bytes each (a tensor larger than that alone in
its own), named OUT-00001-of-0000N.gguf. The first file holds the metadata; every file holds the split's three
key-values (its number, the count, the tensors of all); llama.cpp loads the model from the first. A model that
fits in one file is written as one, OUT itself, as the converter does."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from ...errors import UnshardError
from ...families.gguf_hooks import gguf_py
from .tensors import FILE_NAME, GGUFPlan, stacked

# llama.cpp's names of a split's files (llama_split_path): what its loader looks for beside the first
SPLIT_NAME = "{stem}-{number:05d}-of-{count:05d}.gguf"
_SIZE = re.compile(r"^(\d+)([KMG]?)B?$", re.IGNORECASE)


def split_size(text: str | int) -> int:
    """--gguf-split-max-size as the converter reads it: bytes, or N followed by K, M or G (powers of 1000)."""
    found = _SIZE.match(str(text).strip())
    if found is None or int(found[1]) == 0:
        raise UnshardError(
            f"--gguf-split-max-size {text}: not a size; give bytes, or a whole number followed by K, M or G "
            "(powers of 1000, as llama.cpp's converter reads it), e.g. 2G"
        )
    return int(found[1]) * 1000 ** " KMG".index(found[2].upper() or " ")


def split_plan(plan: GGUFPlan, max_size: int) -> dict[str, GGUFPlan]:
    """The plan of each file of the split, by its name in the staging folder (model-00001-of-0000N.gguf, ...), in
    order; {FILE_NAME: plan} where the model fits in one file. Each file's plan shares the model's encodings and
    positions, and holds its own tensors (`tensors`), computed ones and header."""
    sizes: dict[str, int] = {}  # the file's tensors, by llama.cpp's name: their bytes as gguf-py counts them
    for encoding in plan.encoded.values():
        for stored in encoding.stored:
            name = stacked(stored.name)[0]
            if name in plan.elsewhere:  # (another file's: the mmproj's)
                continue
            sizes[name] = sizes.get(name, 0) + stored.nbytes
    for stored in plan.computed_stored():
        sizes[stored.name] = stored.nbytes
    files: list[list[str]] = [[]]
    held = 0
    for name in sorted(sizes, key=plan.positions.__getitem__):
        if files[-1] and held + sizes[name] > max_size:  # (gguf-py's rule: a new file when this one would pass it)
            files.append([])
            held = 0
        files[-1].append(name)
        held += sizes[name]
    if len(files) == 1:
        return {FILE_NAME: plan}
    gguf = gguf_py()
    plans = {}
    for number, names in enumerate(files):
        writer = plan.writer
        if number > 0:  # (the others hold the split's key-values alone: not even the architecture)
            writer = gguf.GGUFWriter(None, plan.architecture)
            writer.kv_data = [{}]
        split = (number, len(files), len(sizes))
        name = SPLIT_NAME.format(stem=Path(FILE_NAME).stem, number=number + 1, count=len(files))
        computed = {n: values for n, values in plan.computed.items() if n in names}
        plans[name] = replace(plan, writer=writer, computed=computed, made_header=(), split=split, tensors=set(names))
    return plans


def split_fields(split: tuple[int, int, int]) -> dict:
    """The key-values every file of a split ends with (gguf-py's add_shard_kv_data): its number from 0, the count of
    files, the count of tensors in all of them."""
    gguf = gguf_py()
    number, count, tensors = split
    keys, value, kind = gguf.Keys.Split, gguf.GGUFValue, gguf.GGUFValueType
    return {
        keys.LLM_KV_SPLIT_NO: value(number, kind.UINT16),
        keys.LLM_KV_SPLIT_COUNT: value(count, kind.UINT16),
        keys.LLM_KV_SPLIT_TENSORS_COUNT: value(tensors, kind.INT32),
    }


def split_places(names: list[str], out: Path) -> dict[str, Path]:
    """Where each file of a split goes: beside OUT, named after it as llama.cpp names a split's files."""
    stem = Path(FILE_NAME).stem
    return {name: out.with_name(out.stem + name[len(stem) :]) for name in names}

"""A GGUF file's tensor infos, read from its header as llama.cpp's loader reads them (gguf.cpp), for --verify.

gguf-py's GGUFReader parses every item of every array one by one: a Llama 3 vocabulary (128,256 tokens, their types,
280,147 merges) takes it 20 s, XLM-RoBERTa's normalizer table (240 KB of bytes) 9 s. The tensor infos need none of
those values, so here each array of numbers is stepped over whole and each string by its length."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from ...errors import UnshardError

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9  # (gguf's value types; the others are numbers of these sizes)
NUMBER_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
UINT32 = 4  # (general.alignment's type)
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # (ggml's order: the fastest-varying dimension first)
    ggml_type: int
    offset: int  # (from the data's start)


class _Header:
    """The header's bytes, read from the start of the open file as far as they go."""

    def __init__(self, path: Path, file):
        self.path, self.file, self.data, self.at = path, file, b"", 0

    def take(self, size: int) -> memoryview:
        while self.at + size > len(self.data):
            more = self.file.read(max(size, len(self.data), 1 << 20))
            if not more:
                raise UnshardError(f"{self.path}: its header ends past the end of the file; it was cut short")
            self.data += more
        taken = memoryview(self.data)[self.at : self.at + size]
        self.at += size
        return taken

    def number(self, fmt: str) -> int:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.number("<Q"))).decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> None:
        if kind in NUMBER_SIZES:
            self.take(NUMBER_SIZES[kind])
        elif kind == STRING:
            self.take(self.number("<Q"))
        elif kind == ARRAY:
            item, count = self.number("<I"), self.number("<Q")
            if item in NUMBER_SIZES:
                self.take(NUMBER_SIZES[item] * count)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise UnshardError(f"{self.path}: its header holds a value of unknown type {kind}; the file is damaged")


def tensor_infos(path: Path) -> tuple[int, list[TensorInfo]]:
    """(where the tensors' data starts, each tensor's info in the header's order)."""
    with open(path, "rb") as f:
        header = _Header(path, f)
        if bytes(header.take(4)) != MAGIC:
            raise UnshardError(f"{path}: not a GGUF file (no GGUF magic at its start)")
        header.number("<I")  # (the version)
        tensors, fields = header.number("<Q"), header.number("<Q")
        alignment = DEFAULT_ALIGNMENT
        for _ in range(fields):
            key, kind = header.string(), header.number("<I")
            if key == "general.alignment" and kind == UINT32:
                alignment = header.number("<I")
            else:
                header.skip_value(kind)
        infos = []
        for _ in range(tensors):
            name = header.string()
            shape = tuple(header.number("<Q") for _ in range(header.number("<I")))
            infos.append(TensorInfo(name, shape, header.number("<I"), header.number("<Q")))
    return -(-header.at // alignment) * alignment, infos

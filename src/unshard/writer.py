"""The one writer: Hugging Face folders of safetensors shards, streamed tensor by tensor.

The safetensors library wants every tensor of a file in memory at once. Here the header comes from
the plan (names, dtypes, shapes, so every byte offset is known in advance), and each tensor is
written as soon as it is assembled, then dropped. The folder is built beside OUT under a hidden name
and renamed into place only when complete, so a failed run never leaves an OUT that looks finished.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import queue
import shutil
import struct
import threading
from pathlib import Path
from typing import Callable, Iterable

import torch

from .errors import OutputExistsError

SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
# The files of a Hugging Face model folder other than weights. Only these are copied into OUT, so
# a trainer's own files beside them (`latest`, `zero_to_fp32.py`, `trainer_state.json`,
# `training_args.bin`, optimizer states) stay behind. Python files are custom model code and are
# copied only when config.json points at them (`auto_map`).
MODEL_FILE_PATTERNS = (
    "config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json", "added_tokens.json",
    "vocab.*", "merges.txt", "*.model", "*.tiktoken", "chat_template.*", "preprocessor_config.json",
    "processor_config.json", "video_preprocessor_config.json", "image_processor_config.json",
    "feature_extractor_config.json", "*.py",
)


class SafetensorsStream:
    """Write one safetensors file whose tensors arrive one at a time, in header order.

    With `checksum`, the file's sha256 (for the model card) is computed on a thread of its own as the
    bytes go out. It is off unless asked for: sha256 runs at about 1 GB/s on one core, slower than a
    page-cache copy, so it would set the pace of the whole conversion.
    """

    def __init__(self, path: Path, tensors: list[tuple[str, torch.dtype, tuple[int, ...]]], checksum: bool = False):
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        self._expected = []
        for name, dtype, shape in tensors:
            size = dtype.itemsize
            for d in shape:
                size *= d
            header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            self._expected.append((name, dtype, tuple(shape), size))
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the format asks for 8-byte alignment of the data
        self.path = path
        self._file = open(path, "wb")
        head = struct.pack("<Q", len(raw)) + raw
        self._file.write(head)
        self._next = 0
        self._hash = hashlib.sha256(head) if checksum else None
        if not checksum:
            return
        # Bytes waiting to be hashed, or callbacks to run once everything before them is hashed. The
        # writer waits while more than HASH_BACKLOG bytes are unhashed, so hashing never holds more
        # than about one extra part in memory.
        self._to_hash: queue.Queue = queue.Queue()
        self._unhashed = 0
        self._hashed = threading.Condition()
        self._hash_error: BaseException | None = None
        self._hasher = threading.Thread(target=self._hash_in_order, daemon=True)
        self._hasher.start()

    HASH_BACKLOG = 256 << 20

    def _hash_in_order(self) -> None:
        while (item := self._to_hash.get()) is not None:
            try:
                if callable(item):
                    item()
                elif self._hash_error is None:
                    self._hash.update(item)
            except BaseException as e:  # noqa: BLE001  (re-raised by the writer)
                self._hash_error = e
            with self._hashed:
                self._unhashed -= 0 if callable(item) else item.nbytes
                self._hashed.notify_all()

    def _queue_for_hash(self, data: memoryview) -> None:
        with self._hashed:
            self._hashed.wait_for(lambda: self._unhashed == 0 or self._unhashed + data.nbytes <= self.HASH_BACKLOG)
            self._unhashed += data.nbytes
        if self._hash_error is not None:
            raise self._hash_error
        self._to_hash.put(data)

    def write_parts(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], parts: Iterable[torch.Tensor],
                    then: Callable[[], None] | None = None) -> None:
        """Write tensor `name` from parts whose bytes, one after another, are the tensor's; `then` runs
        once they are written and hashed (a reader unmaps their pages)."""
        want_name, want_dtype, want_shape, size = self._expected[self._next]
        if (name, dtype, tuple(shape)) != (want_name, want_dtype, want_shape):
            raise AssertionError(f"writer expected {want_name} {want_dtype} {want_shape}, got {name} {dtype} {shape}")
        written = 0
        for part in parts:
            if part.dtype != dtype or written + part.numel() * dtype.itemsize > size:
                raise AssertionError(f"{name}: a part of {part.dtype} {tuple(part.shape)} does not fit what is left")
            if part.numel():
                data = memoryview(part.contiguous().reshape(-1).view(torch.uint8).numpy())
                self._file.write(data)
                if self._hash is not None:
                    self._queue_for_hash(data)  # the view keeps the part alive until it is hashed
                written += data.nbytes
        if written != size:
            raise AssertionError(f"{name}: {written} of {size} bytes written")
        if then is not None and self._hash is not None:
            self._to_hash.put(then)  # run once the parts are hashed
        elif then is not None:
            then()
        self._next += 1

    @property
    def sha256(self) -> str | None:
        return self._hash.hexdigest() if self._hash is not None else None

    @property
    def complete(self) -> bool:
        return self._next == len(self._expected)

    def close(self, check: bool = True) -> None:
        if self._hash is not None and self._hasher.is_alive():
            self._to_hash.put(None)
            self._hasher.join()
        self._file.close()
        if check and self._hash is not None and self._hash_error is not None:
            raise self._hash_error
        if check and self._next != len(self._expected):
            raise AssertionError(f"{self.path}: {len(self._expected) - self._next} tensors were never written")


class OutputFolder:
    """A staging folder beside OUT that becomes OUT on `commit`, or vanishes on `abort`."""

    def __init__(self, out: Path, overwrite: bool = False):
        self.out = out
        if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
            raise OutputExistsError(f"{out}: already exists and is not empty; choose another OUT or pass --overwrite")
        out.parent.mkdir(parents=True, exist_ok=True)
        self.path = out.parent / f".{out.name}.unshard-partial-{os.getpid()}"
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir()

    def commit(self) -> None:
        old = None
        if self.out.exists():
            old = self.out.parent / f".{self.out.name}.unshard-old-{os.getpid()}"
            os.replace(self.out, old)
        os.replace(self.path, self.out)
        if old is not None:
            shutil.rmtree(old) if old.is_dir() else old.unlink()

    def abort(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def write_index(folder: Path, files: dict[str, list[str]], total_size: int) -> None:
    """model.safetensors.index.json; total_size counts bytes, as the Hub expects."""
    if len(files) <= 1:
        return
    weight_map = {name: filename for filename, names in files.items() for name in names}
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def copy_model_files(source: Path | None, folder: Path, dtype_name: str, updates: dict | None = None) -> list[str]:
    """Copy config, generation config, tokenizer, chat template, processor and code files into OUT.

    config.json gets the dtype of the written weights, under the key(s) it already uses, and the
    plan's `updates` (a head the weights have and the config did not say).
    """
    copied = []
    if source is None:
        return copied
    config = json.loads((source / "config.json").read_text()) if (source / "config.json").is_file() else {}
    for path in sorted(source.iterdir()):
        if not path.is_file() or not any(fnmatch.fnmatch(path.name, p) for p in MODEL_FILE_PATTERNS):
            continue
        if path.suffix == ".py" and not config.get("auto_map"):
            continue
        if path.name == "config.json":
            keys = [k for k in ("dtype", "torch_dtype") if k in config] or ["dtype"]
            for key in keys:
                config[key] = dtype_name
            config.update({k: v for k, v in (updates or {}).items() if k != "num_labels"})
            (folder / path.name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        else:
            shutil.copyfile(path, folder / path.name)
        copied.append(path.name)
    return copied


"""Output formats. The plan says which tensors go out (names, shapes, dtype, source pieces); an output
format says how each is stored, in which files, and what surrounds them.

Every format is fed the same way (write/execute.py, write/threads.py). The plan is made with the format's encodings (a tensor
stored otherwise than as it is) and its `lay_out` of files before any byte is read, so `inspect`,
`--dry-run`, the memory estimate and the split of work between writers see the bytes that will really be
written. Then each tensor is assembled (a band of rows at a time where it is large or encoded) and written
into the file the format `open`s in the place it `stage`s; `--verify` reads it back through `read_back`;
the format `finish`es what surrounds the tensors and the place is committed.

- hf_folder.HFFolder: a Hugging Face folder of safetensors shards (safetensors.py writes the files).
  With a quantization scheme, its Linear weights are stored as compressed-tensors encodes them
  (compressed_tensors.py): the checkpoint vLLM and transformers load quantized.
- gguf.GGUFSink: one GGUF file, as llama.cpp's converter writes it (tensors renamed, converted and
  quantized by gguf-py's kernels, metadata and vocabulary in the header); a vision-language model's vision
  part in a second, the mmproj (gguf_vision.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from ..plan import Group, OutputTensor, Plan


@dataclass(frozen=True)
class OutputOptions:
    """What describes the output, as a user asks for it (the source is described by the checkpoint)."""

    dtype: str = "auto"  # float32, bfloat16, float16; auto: the config's, else the checkpoint's
    max_shard_size: int | str = "5GB"
    quantize: str | None = None  # a compressed-tensors preset scheme (W4A16, FP8_DYNAMIC, ...)
    quantize_ignore: tuple[str, ...] = ()  # modules left unquantized besides the scheme's defaults
    gguf: str | None = None  # one GGUF file of this llama.cpp type (f16, q8_0, ..., or auto) instead of a folder


class Encoding(Protocol):
    """How one output tensor is stored when not as it is: `stored` are the tensors written in its place
    (a quantized weight's packed values, scales, zero points); `encode` turns each band of the tensor's
    rows into their bands. Bands hold a multiple of `rows_per_band` rows (the last one, what is left)."""

    stored: tuple[OutputTensor, ...]
    rows_per_band: int
    surveys: bool  # whether every band of it must be shown to `survey(band)` before the first is encoded

    def encode(self, band: np.ndarray, start: int) -> dict[str, np.ndarray]:
        """The pieces of the stored tensors made from rows [start, start + len(band)), by stored name;
        each stored tensor's pieces, in order of the bands, are its bytes. The band is a numpy array of the
        tensor's elements (dtypes.NUMPY: bfloat16 as its bits), so that no encoding needs torch; it is the
        thread's, used once, and the encoding may overwrite it. A piece may be held in the thread's scratch
        memory: it is written before the thread's next band is encoded."""
        ...


ENCODING_BAND_BYTES = 4 << 20  # of an output tensor's rows, handed to its encoding at a time (as fast as 16 MB, whose
# passes over a band no longer find it in the cache, in less memory)
# What encoding one band holds besides the band itself: its thread's scratch arrays (a float32 copy of a few of its
# rows, the values, packed), kept from band to band. An estimate for the plan's memory bound, measured in bench/ (quantize rows).
ENCODING_WORK = 6 * ENCODING_BAND_BYTES


class Sink(Protocol):
    """An output format, as write/execute.py and write/threads.py drive it."""

    def lay_out(self, groups: dict[str, Group], max_shard_size: int | str) -> dict[str, list[Group]]:
        """The output files and the groups (source tensor -> output tensors) each holds, in order."""
        ...

    def stage(self, out: Path, overwrite: bool) -> Any:
        """Where the output is written until complete: `.path`, then `.commit()` or `.abort()`."""
        ...

    def open(self, path: Path, tensors: list[OutputTensor]) -> Any:
        """A file to hold these stored tensors: `.tensor(name, dtype, shape)` gives one to `.write(part)`
        in order and `.close()`; `.write_parts(...)` writes a tensor whole; `.close(check)` ends the file."""
        ...

    def file_size(self, filename: str, tensors: list[OutputTensor]) -> int:
        """Bytes of a file holding these stored tensors (for inspect and --dry-run)."""
        ...

    def read_back(self, path: Path) -> Any:
        """A written file, for --verify: `.entries`, `.holds(name, parts)`, `.holds_at(name, offset, bytes)`."""
        ...

    def finish(self, plan: Plan, folder: Path, digests: dict[str, str | None],
               extra_files: dict[str, str] | None) -> tuple[list[str], list[str]]:
        """Everything besides the tensors; (files added, warnings)."""
        ...


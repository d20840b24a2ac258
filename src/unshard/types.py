"""The values every layer passes to the next: the output options, an output tensor and the group it is made in,
the plan, and the two interfaces an output format fills in (Encoding, Sink).

This module is the bottom floor: it imports nothing of unshard, so that sources, plan, sinks and the writer can
all use these names without importing one another. (The types it only mentions are named in comments: a
Checkpoint and SourceTensor are sources.base's, a DType is dtypes'.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch


# The value of a config change (Checkpoint.config_changes, Plan.config_updates) that removes the key from the output's
# config.json (a dequantized model's quantization_config)
REMOVED = "<removed by unshard>"


@dataclass(frozen=True)
class OutputOptions:
    """What describes the output, as a user asks for it (the source: sources.SourceOptions)."""

    dtype: str = "auto"  # float32, bfloat16, float16; auto: the config's, else the checkpoint's
    max_shard_size: int | str = "5GB"
    quantize: str | None = None  # a compressed-tensors preset scheme (W4A16, FP8_DYNAMIC, ...)
    quantize_ignore: tuple[str, ...] = ()  # modules left unquantized besides the scheme's defaults
    gguf: str | None = None  # one GGUF file of this llama.cpp type (f16, q8_0, ..., or auto) instead of a folder
    gguf_split: str | int | None = None  # the GGUF file split into files of at most this size (2G, 500M, bytes)
    target_from: str | None = None  # a drafter's GGUF file: the folder of the model it drafts for (EAGLE-3's, DSpark's)
    to: str | None = None  # a training checkpoint instead of a model folder: dcp, megatron, verl-megatron, fsdp
    names: str = "hf"  # the DCP checkpoint's tensor names: hf, torchtitan
    tp: int = 1  # --to megatron: the parallelism the args record (and the vocabulary's padding follows)
    pp: int = 1
    vpp: int | None = None
    ep: int = 1  # --to megatron: the expert parallelism the args record (the experts split over it)
    etp: int = 1  # --to megatron: the experts' own tensor parallelism the args record (each expert split over it)
    vocab_divisible: int = 128  # Megatron-LM's --make-vocab-size-divisible-by
    world_size: int = 1  # --to fsdp: the ranks the rank files are for
    fsdp_size: int = 0  # --to fsdp: the ranks each tensor is cut over (HSDP, verl's fsdp_size); 0: all of them
    mesh_device: str = "cuda"  # --to fsdp: the device type of the run's device mesh (which FSDP's loading compares)

    @property
    def format(self) -> str:
        """The output format's name, as sinks.FORMATS knows it."""
        if self.to:
            return self.to
        return "gguf" if self.gguf else "compressed-tensors" if self.quantize else "safetensors"


@dataclass(frozen=True)
class OutputTensor:
    name: str
    shape: tuple[int, ...]
    dtype: Any  # a dtypes.DType
    encoding: Encoding | None = None  # how the output format stores it, when not as it is (a quantized weight)

    @property
    def stored(self) -> tuple[OutputTensor, ...]:
        """The tensors written in its place: itself, or what its encoding makes of it."""
        return (self,) if self.encoding is None else self.encoding.stored

    @property
    def nbytes(self) -> int:
        """Bytes written for it."""
        if self.encoding is not None:
            return sum(s.nbytes for s in self.encoding.stored)
        return self.nbytes_as_is

    @property
    def nbytes_as_is(self) -> int:
        """Bytes of the tensor itself in its dtype (what its encoding, if any, is given)."""
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


class Encoding(Protocol):
    """How one output tensor is stored when not as it is: `stored` are the tensors written in its place
    (a quantized weight's packed values, scales, zero points); `encode` turns each band of the tensor's
    rows into their bands. Bands hold a multiple of `rows_per_band` rows (the last one, what is left)."""

    stored: tuple[OutputTensor, ...]
    rows_per_band: int
    surveys: bool  # whether every band of it must be shown to `survey(band, start)` before the first is encoded

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
# rows, the values, packed), kept from band to band. An estimate for the plan's memory bound, measured in bench/
# (quantize rows).
ENCODING_WORK = 6 * ENCODING_BAND_BYTES


@dataclass
class Group:
    """One checkpoint tensor and the output tensors made from it (one, unless it is split)."""

    source: Any  # a sources.base.SourceTensor
    outputs: list[OutputTensor]
    convert: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None

    @property
    def nbytes(self) -> int:
        return sum(o.nbytes for o in self.outputs)

    @property
    def encoded(self) -> bool:
        """Whether an output is stored otherwise than as it is (quantized): that takes a band's work."""
        return any(o.encoding for o in self.outputs)


@dataclass(frozen=True)
class FormatRequest:
    """What an output format plans its part from (sinks.plan_format): the user's options, the plan's groups
    (whose outputs it may give encodings), and what the plan knows of the model."""

    options: OutputOptions
    groups: dict[str, Group]  # by source tensor name
    where: str  # the file to name in a message (the config.json, else the checkpoint)
    model_type: str | None  # the config's: the family (families/), whose parts a format may need
    linear: Any  # names.model_facts.LinearLayers: which weights are Linear layers' (what --quantize may quantize)
    config_folder: Path | None
    dtype: Any  # the output's dtypes.DType
    config_updates: dict[str, Any]  # what the output's config.json changes (the checkpoint's, --architecture's)
    separate_adapter: bool = False  # a LoRA adapter is written beside the model (--lora separate)
    # An output tensor's values by its name, read while planning, whole or a slice of its rows: for a format whose
    # header carries a few of the model's values (GGUF's Apertus, MiniMax-01's zero rows); None where none can be read
    read: Callable[..., Any] | None = None


class Sink(Protocol):
    """An output format, as write/execute.py and write/threads.py drive it, and as inspect and the model card
    describe it. sinks.FORMATS finds the one a conversion asks for."""

    def lay_out(self, groups: dict[str, Group], max_shard_size: int | str) -> dict[str, list[Group]]:
        """The output files and the groups (source tensor -> output tensors) each holds, in order."""
        ...

    def stage(self, out: Path, overwrite: bool, sync: bool = True) -> Any:
        """Where the output is written until complete: `.path`, then `.commit()` (its files synced to the disk
        first, unless not `sync`: sinks/staging.py) or `.abort()`."""
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

    def finish(
        self, plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None
    ) -> tuple[list[str], list[str]]:
        """Everything besides the tensors; (files added, warnings)."""
        ...

    def notes(self) -> list[str]:
        """What the user should know of how the format stores this model (inspect's and the card's notes)."""
        ...

    def config_updates(self) -> dict[str, Any]:
        """What the format adds to the output's config.json (compressed-tensors' quantization_config)."""
        ...

    def summary(self) -> dict[str, Any]:
        """What the format adds to the plan's summary (inspect --json, --dry-run): under its own key."""
        ...

    def card(self) -> tuple[list[str], list[str]]:
        """(tags, lines) the format adds to the model card."""
        ...


@dataclass
class Plan:
    """Every output tensor and file of a conversion, decided before any tensor byte is read (plan.build_plan).
    Dry runs, `inspect`, the memory estimate and the writer all work from this one object."""

    checkpoint: Any  # a sources.base.Checkpoint
    config_folder: Path | None
    dtype: Any  # a dtypes.DType
    dtype_reason: str
    files: dict[str, list[Group]]
    dropped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    config_updates: dict[str, Any] = field(default_factory=dict)  # written into OUT's config.json
    copies_per_tensor: int = 1  # whole tensors held while one output is made (a merge holds one per input)
    extra_files: dict[str, str | bytes] = field(default_factory=dict)  # path in OUT -> text (a LoRA adapter's config)
    own_tokenizer: bool = False  # the tokenizer's files are among extra_files (a merged vocabulary's), not copied
    # Planned before transformers answered (build_plan(ask_later=True)): the answer still to come (a
    # names.hf_names.Question), and the plan made again from it, should the answer name the tensors otherwise.
    question: Any = None
    rebuild: Callable[[], Plan] | None = None
    sink: Sink | None = None  # the output format (None: sinks.hf_folder.HFFolder, set by build_plan)
    base_models: list[str] = field(default_factory=list)  # Hub ids the weights descend from (the model card's)
    # Stored tensor -> its file, where a group's stored tensors lie in several files (FSDP's rank files: each
    # tensor's rows cut between the ranks); such a group is listed under each of its files, and made once.
    placed: dict[str, str] = field(default_factory=dict)

    @property
    def model_files(self) -> dict[str, list[Group]]:
        """The weight files of the model itself, which the index lists (not lora_adapter/...)."""
        return {name: groups for name, groups in self.files.items() if "/" not in name}

    @property
    def groups(self) -> list[Group]:
        """Each group once (one listed under several files: see `placed`)."""
        return list({id(g): g for groups in self.files.values() for g in groups}.values())

    @property
    def outputs(self) -> list[OutputTensor]:
        return [o for g in self.groups for o in g.outputs]

    def stored(self, filename: str) -> list[OutputTensor]:
        """The tensors written into one of the plan's files, in order."""
        stored = (s for g in self.files[filename] for o in g.outputs for s in o.stored)
        return [s for s in stored if self.placed.get(s.name, filename) == filename]

    @property
    def total_bytes(self) -> int:
        return sum(g.nbytes for g in self.groups)

    def peak_memory_estimate(self, threads: int = 1) -> int:
        """Bytes of tensors held at once, a bound the writer keeps to (`write.threads._write_weights`): the
        largest group's, plus a typical (median) group's for each further thread. So two threads never
        hold the two largest tensors of a merge together, while groups of the usual size run side by side."""
        held = sorted(self.held(g) for g in self.groups)
        return held[-1] + (max(1, threads) - 1) * held[len(held) // 2] if held else 0

    def held(self, group: Group) -> int:
        """Bytes held while this group is made: the assembled source (one per input of a merge) plus its
        converted outputs; for a tensor streamed piece by piece, its largest piece (see
        `Checkpoint.flat_pieces`); and an encoding's band with its working copies."""
        encoding = ENCODING_WORK if group.encoded else 0
        pieces = self.checkpoint.flat_pieces(group.source.name) if group.convert is None else None
        rows = self.checkpoint.band_rows(group.source.name) if group.convert is None else None
        if rows is not None:  # a band (of each input, for a merge), and the band cast to the output dtype
            return (
                encoding + rows * (group.source.nbytes * self.copies_per_tensor + group.nbytes) // group.source.shape[0]
            )
        if pieces is None:
            return encoding + group.source.nbytes * self.copies_per_tensor + group.nbytes
        return encoding + max((p.block.numel for p in pieces), default=0) * group.source.dtype.itemsize

    def summary(self) -> dict[str, Any]:
        return {
            "gguf": None,
            "quantize": None,
            **self.sink.summary(),
            "dtype": self.dtype.name,
            "dtype_reason": self.dtype_reason,
            "tensors": len(self.outputs),
            "bytes": self.total_bytes,
            "files": {name: self.sink.file_size(name, self.stored(name)) for name in self.files},
            "dropped": self.dropped,
            "notes": self.notes,
            "config_from": str(self.config_folder) if self.config_folder else None,
        }

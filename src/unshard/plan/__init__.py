"""The conversion plan: every output tensor and file, decided before any tensor byte is read.
(On a model's first conversion, under the names as saved until transformers answers, see `Plan.question`.)

Dry runs, `inspect`, the memory estimate and the writer all work from this one object.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import dtypes
from ..dtypes import DType
from ..errors import ConfigMismatchError, UnshardError
from ..hub import fetch, hub_ids, is_hub_id
from ..names import hf_names
from ..sinks import ENCODING_WORK, Encoding, OutputOptions, Sink
from ..sinks.hf_folder import MODEL_FILE_PATTERNS, HFFolder, unreadable_model_files
from ..sources import Checkpoint, Piece, SourceOptions, SourceTensor
from . import lora

if TYPE_CHECKING:
    import torch

    from ..sinks.compressed_tensors import Quantization
    from ..sinks.gguf import GGUFPlan

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "spiece.model")


@dataclass(frozen=True)
class OutputTensor:
    name: str
    shape: tuple[int, ...]
    dtype: DType
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


@dataclass
class Group:
    """One checkpoint tensor and the output tensors made from it (one, unless it is split)."""

    source: SourceTensor
    outputs: list[OutputTensor]
    convert: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None

    @property
    def nbytes(self) -> int:
        return sum(o.nbytes for o in self.outputs)

    @property
    def encoded(self) -> bool:
        """Whether an output is stored otherwise than as it is (quantized): that takes a band's work."""
        return any(o.encoding for o in self.outputs)


@dataclass
class Plan:
    checkpoint: Checkpoint
    config_folder: Path | None
    dtype: DType
    dtype_reason: str
    files: dict[str, list[Group]]
    dropped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    config_updates: dict[str, Any] = field(default_factory=dict)  # written into OUT's config.json
    copies_per_tensor: int = 1  # whole tensors held while one output is made (a merge holds one per input)
    extra_files: dict[str, str | bytes] = field(default_factory=dict)  # path in OUT -> text (a LoRA adapter's config)
    own_tokenizer: bool = False  # the tokenizer's files are among extra_files (a merged vocabulary's), not copied
    # Planned before transformers answered (build_plan(ask_later=True)): the answer still to come, and the
    # plan made again from it, should the answer name the tensors otherwise.
    question: hf_names.Question | None = None
    rebuild: Callable[[], Plan] | None = None
    sink: Sink = field(default_factory=HFFolder)  # the output format
    quantization: Quantization | None = None  # what --quantize does to this model
    gguf: GGUFPlan | None = None  # the GGUF file's types and metadata, when that is the output
    base_models: list[str] = field(default_factory=list)  # Hub ids the weights descend from (the model card's)

    @property
    def model_files(self) -> dict[str, list[Group]]:
        """The weight files of the model itself, which the index lists (not lora_adapter/...)."""
        return {name: groups for name, groups in self.files.items() if "/" not in name}

    @property
    def groups(self) -> list[Group]:
        return [g for groups in self.files.values() for g in groups]

    @property
    def outputs(self) -> list[OutputTensor]:
        return [o for g in self.groups for o in g.outputs]

    def stored(self, filename: str) -> list[OutputTensor]:
        """The tensors written into one of the plan's files, in order."""
        return [s for g in self.files[filename] for o in g.outputs for s in o.stored]

    @property
    def total_bytes(self) -> int:
        return sum(g.nbytes for g in self.groups)

    def require_config(self) -> None:
        """A folder without config.json does not load anywhere: stop before writing anything."""
        if self.config_folder is None or not (self.config_folder / "config.json").exists():
            base = self.checkpoint.facts.get("base_model")
            hint = f" (train_params.yaml names the base model: {base})" if base else ""
            raise UnshardError(f"{self.checkpoint.path}: the checkpoint has no config.json; pass --config-from DIR, "
                               f"a Hugging Face folder of the model it was trained from{hint}")

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
            return encoding + rows * (group.source.nbytes * self.copies_per_tensor + group.nbytes) // group.source.shape[0]
        if pieces is None:
            return encoding + group.source.nbytes * self.copies_per_tensor + group.nbytes
        return encoding + max((p.block.numel for p in pieces), default=0) * group.source.dtype.itemsize

    def summary(self) -> dict[str, Any]:
        quantization = self.quantization
        return {
            "gguf": None if self.gguf is None else self.gguf.summary(),
            "quantize": None if quantization is None else {
                "scheme": quantization.scheme.name, "format": quantization.scheme.format,
                "quantized": len(quantization.encoded), "ignored": quantization.ignored,
                "bytes_as_is": sum(o.nbytes_as_is for o in quantization.encoded.values()),
                "surveyed": sum(o.encoding.surveys for o in quantization.encoded.values())},
            "dtype": self.dtype.name,
            "dtype_reason": self.dtype_reason,
            "tensors": len(self.outputs),
            "bytes": self.total_bytes,
            "files": {name: self.sink.file_size(name, self.stored(name)) for name in self.files},
            "dropped": self.dropped,
            "notes": self.notes,
            "config_from": str(self.config_folder) if self.config_folder else None,
        }


def pieces_read(groups: list[Group]) -> list[tuple[Piece, int]]:
    """Every piece these groups are read from, with its byte count (for `Checkpoint.check_records`)."""
    return [(p, p.block.numel * g.source.dtype.itemsize) for g in groups for p in g.source.pieces]


def choose_dtype(requested: str, config: dict | None, checkpoint: Checkpoint) -> tuple[DType, str]:
    if requested != "auto":
        return dtypes.OUTPUT[requested], "asked for with --dtype"
    declared = (config or {}).get("dtype") or (config or {}).get("torch_dtype")
    if declared in dtypes.OUTPUT:
        return dtypes.OUTPUT[declared], "declared by config.json"
    floats = [t.dtype for t in checkpoint.tensors.values() if t.dtype.is_floating_point]
    if floats:
        most = max(set(floats), key=floats.count)
        return most, "as stored in the checkpoint"
    return dtypes.float32, "default"


def resolve_config_source(config_from: str | Path) -> Path:
    """A local folder as it is; otherwise a Hub repository id, whose non-weight files are downloaded."""
    path = Path(config_from)
    if path.is_dir():
        return path
    if path.exists() or not is_hub_id(str(config_from)):
        raise UnshardError(f"{config_from}: --config-from needs a folder with config.json, or a Hub model id")
    return fetch(str(config_from), list(MODEL_FILE_PATTERNS), "--config-from")


def build_plan(checkpoint: Checkpoint, output: OutputOptions = OutputOptions(),
               source: SourceOptions = SourceOptions(), *, ask_later: bool = False) -> Plan:
    """ask_later: a config transformers has not answered for before is answered while the writing starts
    (see hf_names.Question); the writer then checks `plan.question` before it finishes. (Not when
    quantizing: which tensors are Linear layers is part of the answer, and needed now.)"""
    config_from, check, architecture = source.config_from, source.check, source.architecture
    config_folder = resolve_config_source(config_from) if config_from else checkpoint.hf_folder
    config = hf_names.read_config(config_folder)
    if config is not None:
        config = dict(checkpoint.config_changes) if checkpoint.config_whole else {**config, **checkpoint.config_changes}
    if check and (broken := unreadable_model_files(config_folder)):
        path, why = broken[0]
        raise ConfigMismatchError(f"{path}: {why}; fix or remove it, or pass --no-check to copy it as it is")
    checkpoint.fit_config(config)
    out_dtype, reason = choose_dtype(output.dtype, config, checkpoint)
    fold = lora.plan_fold(checkpoint, source.lora_alpha, source.lora)
    shapes = {n: t.shape for n, t in checkpoint.tensors.items() if n not in fold.dropped}
    head = hf_names.head_updates(set(shapes), shapes, config, architecture)
    updates = {**checkpoint.config_changes, **head}
    naming = hf_names.plan_names(shapes, config_folder, check, renames=fold.renames, updates=updates,
                                 ask_later=ask_later and not output.quantize and not output.gguf)

    groups: dict[str, Group] = {}
    for name, outputs in naming.outputs.items():
        tensor = checkpoint.tensors[name]
        # Only floating-point tensors change dtype; integer buffers keep theirs.
        target = out_dtype if tensor.dtype.is_floating_point else tensor.dtype
        groups[name] = Group(tensor, [OutputTensor(n, s, target) for n, s in outputs],
                             _compose(fold.folds.get(name), naming.converters.get(name), outputs[0][0]))
    sink, quantization, gguf = _encode_for_format(output, groups, checkpoint, fold, naming.linear, config_folder,
                                                  out_dtype, updates)
    files = sink.lay_out(groups, output.max_shard_size)
    extra_files = {}
    if fold.adapter is not None:
        files[lora.ADAPTER_FILE], extra_files = _adapter_plan(checkpoint, fold.adapter, naming.outputs, out_dtype)
    notes = fold.notes + naming.notes + (gguf.notes if gguf else [])
    notes += _missing_notes(config, config_folder, updates if "architectures" in head and not architecture else None)
    if quantization is not None:
        updates = {**updates, "quantization_config": quantization.config()}
    rebuild = None
    if naming.question is not None:
        rebuild = partial(build_plan, checkpoint, output, replace(source, config_from=config_folder))
    # Where the weights come from, as recorded: a --config-from Hub id, the Hub id transformers 4 saved in a
    # config, an adapter's base as peft saved it.
    origins = [str(config_from) if config_from and not Path(config_from).exists() else None,
               (config or {}).get("_name_or_path"), (fold.adapter.meta if fold.adapter else {}).get("base_model_name_or_path")]
    return Plan(checkpoint, config_folder, out_dtype, reason, files, {**fold.dropped, **naming.dropped}, notes,
                config_updates=updates, extra_files=extra_files, question=naming.question, rebuild=rebuild,
                sink=sink, quantization=quantization, gguf=gguf, base_models=hub_ids(origins))


def _encode_for_format(output: OutputOptions, groups: dict[str, Group], checkpoint: Checkpoint, fold: lora.LoraFold,
                       linear: hf_names.LinearLayers, config_folder: Path | None, out_dtype: DType,
                       config_updates: dict[str, Any]):
    """The sink that writes the output format, with each output tensor's encoding for it set in `groups`
    (compressed-tensors' for --quantize, GGUF's types for a .gguf OUT); and the Quantization or GGUFPlan.
    config_updates: what the output's config.json changes (the checkpoint's, --architecture's)."""
    outputs = [o for g in groups.values() for o in g.outputs]
    if output.gguf:
        from ..sinks.gguf import GGUFSink, plan_gguf

        if output.quantize or fold.adapter is not None:
            raise UnshardError(f"{checkpoint.path}: a GGUF file takes neither --quantize (use --gguf-type) nor "
                               "--lora separate")
        gguf = plan_gguf(output.gguf, outputs, config_folder, out_dtype.name, config_updates)
        encodings = {name: e for file in gguf.files().values() for name, e in file.encoded.items()}
        for group in groups.values():
            group.outputs = [replace(o, encoding=encodings[o.name]) for o in group.outputs]
        return GGUFSink(gguf), None, gguf
    if output.quantize:
        from ..sinks.compressed_tensors import plan_quantization

        quantization = plan_quantization(output.quantize, output.quantize_ignore, outputs, linear,
                                         str(config_folder / "config.json" if config_folder else checkpoint.path))
        for group in groups.values():
            group.outputs = [quantization.encoded.get(o.name, o) for o in group.outputs]
        return HFFolder(), quantization, None
    return HFFolder(), None, None


def _missing_notes(config: dict | None, config_folder: Path | None, new_head: dict | None) -> list[str]:
    """What the user should know of the folder: a head config.json now names (`new_head`, the config's updates),
    or a config or tokenizer not found."""
    notes = []
    if new_head is not None:
        notes.append(f"the weights end in a `score` head: config.json says {new_head['architectures'][0]}"
                     + (f" with {new_head['num_labels']} label(s)" if "num_labels" in new_head else ""))
    if config is None:
        notes.append("no config.json found: pass --config-from DIR so the output folder loads with transformers")
    elif not any((config_folder / name).exists() for name in TOKENIZER_FILES):
        notes.append("no tokenizer beside the checkpoint: pass --config-from DIR (the Hugging Face model it was "
                     "trained from) to include tokenizer, chat template and generation config")
    return notes


def _adapter_plan(checkpoint: Checkpoint, adapter: lora.Adapter, outputs: dict, dtype: DType):
    """The adapter's tensors under the names PEFT's save_pretrained writes for the written model, and
    adapter_config.json."""
    import json

    def written_name(source: str) -> str:
        names = [n for n, _ in outputs[source]]
        if len(names) != 1:
            raise UnshardError(f"{checkpoint.path}: {source} carries LoRA but is written as {names}; use --lora merge")
        return names[0]

    hf_modules = {m: written_name(f"{m}.base_layer.weight").removesuffix(".weight") for m in adapter.modules}
    tensors = {}  # PEFT name -> checkpoint name
    for module, parts in adapter.modules.items():
        embedding = module in adapter.embeddings
        for part, name in parts.items():
            # PEFT drops the adapter name, and `.weight` where the tensor is a parameter, not a layer's.
            key = ("lora_magnitude_vector" if part == "magnitude_vector"
                   else f"lora_embedding_{part}" if embedding else f"lora_{part}.weight")
            tensors[f"base_model.model.{hf_modules[module]}.{key}"] = name
    for module in adapter.embeddings:  # as PEFT does, so the adapter also fits a resized vocabulary
        tensors[f"base_model.model.{hf_modules[module]}.base_layer.weight"] = f"{module}.base_layer.weight"
    hf_saved = [written_name(original) for original in adapter.saved.values()]
    for trained, hf_name in zip(adapter.saved, hf_saved):
        tensors[f"base_model.model.{hf_name}"] = trained
    groups = []
    for name, source_name in tensors.items():
        source = checkpoint.tensors[source_name]
        target = dtype if source.dtype.is_floating_point else source.dtype
        groups.append(Group(source, [OutputTensor(name, source.shape, target)]))
    config = json.dumps(adapter.config(hf_modules, hf_saved), indent=2, sort_keys=True) + "\n"
    return groups, {f"{lora.ADAPTER_FOLDER}/adapter_config.json": config}


def _compose(fold, convert, only_output: str):
    """One whole-tensor step for a group: fold a LoRA adapter in, then transformers' conversion."""
    if fold is None:
        return convert
    if convert is None:
        return lambda tensor: {only_output: fold(tensor)}
    return lambda tensor: convert(fold(tensor))

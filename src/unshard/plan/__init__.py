"""Planning a conversion: every output tensor and file (a types.Plan), decided before any tensor byte is read.
(On a model's first conversion, under the names as saved until transformers answers, see `Plan.question`.)

The output format is looked up by name (sinks.FORMATS), and plans its own part: each tensor's encoding,
the files, what it tells inspect and the model card.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

from .. import dtypes, families, sinks
from ..dtypes import DType
from ..errors import ConfigMismatchError, UnshardError
from ..hub import fetch, hub_ids, is_hub_id
from ..model_files import MODEL_FILE_PATTERNS, unreadable_model_files
from ..names import hf_names
from ..sources import Checkpoint, Piece, SourceOptions
from ..sources.hf_safetensors import LAYOUT as HF_SAFETENSORS
from ..types import FormatRequest, Group, OutputOptions, OutputTensor, Plan
from . import lora

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "spiece.model")


def require_config(plan: Plan) -> None:
    """A folder without config.json does not load anywhere: stop before writing anything."""
    if plan.config_folder is None or not (plan.config_folder / "config.json").exists():
        base = plan.checkpoint.facts.get("base_model")
        hint = f" (train_params.yaml names the base model: {base})" if base else ""
        raise UnshardError(
            f"{plan.checkpoint.path}: the checkpoint has no config.json; pass --config-from DIR, "
            f"a Hugging Face folder of the model it was trained from{hint}"
        )


def pieces_read(groups: list[Group]) -> list[tuple[Piece, int]]:
    """Every piece these groups are read from, with its byte count (for `Checkpoint.check_records`)."""
    return [(p, p.block.numel * g.source.dtype.itemsize) for g in groups for p in g.source.pieces]


def choose_dtype(
    requested: str, config: dict | None, checkpoint: Checkpoint, as_stored: bool = False
) -> tuple[DType, str]:
    """The output's dtype: asked for, else the config's, else the checkpoint's; the checkpoint's where its tensors are
    kept as stored (as_stored: a GGUF file of a folder)."""
    if requested != "auto":
        return dtypes.OUTPUT[requested], "asked for with --dtype"
    declared = (config or {}).get("dtype") or (config or {}).get("torch_dtype")
    stored = [t.dtype for t in checkpoint.tensors.values() if t.dtype.is_floating_point]
    most = max(set(stored), key=stored.count) if stored else None
    if as_stored and most is not None:
        return most, "each tensor as stored in the folder, as llama.cpp's converter reads it"
    if declared in dtypes.OUTPUT:
        return dtypes.OUTPUT[declared], "declared by config.json"
    if most is not None:
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


def build_plan(
    checkpoint: Checkpoint,
    output: OutputOptions = OutputOptions(),
    source: SourceOptions = SourceOptions(),
    *,
    ask_later: bool = False,
) -> Plan:
    """ask_later: a config transformers has not answered for before is answered while the writing starts
    (see hf_names.Question); the writer then checks `plan.question` before it finishes. (Not when
    quantizing: which tensors are Linear layers is part of the answer, and needed now.)"""
    config_from, check, architecture = source.config_from, source.check, source.architecture
    config_folder, config = _model_config(checkpoint, config_from, check)
    # (a GGUF file of a Hugging Face folder is made of its tensors as stored, each as llama.cpp's converter reads it:
    # a folder may hold float32 weights beside a bfloat16 embedding under a config declaring bfloat16, SpecForge's)
    as_stored = output.format == "gguf" and output.dtype == "auto" and checkpoint.layout == HF_SAFETENSORS
    out_dtype, reason = choose_dtype(output.dtype, config, checkpoint, as_stored)
    # (where --lora separate puts the adapter: a folder's lora_adapter/, or beside a GGUF file, sinks/gguf/adapter.py)
    kept_in = "llama.cpp's adapter file OUT-LoRA.gguf" if output.format == "gguf" else f"{lora.ADAPTER_FOLDER}/"
    fold = lora.plan_fold(checkpoint, source.lora_alpha, source.lora, kept_in)
    shapes = {n: t.shape for n, t in checkpoint.tensors.items() if n not in fold.dropped}
    head = hf_names.head_updates(set(shapes), shapes, config, architecture)
    updates = {**checkpoint.config_changes, **head}
    sinks.check_config(output, config_folder, out_dtype.name, updates)
    family = families.by_model_type((config or {}).get("model_type"))
    naming = hf_names.plan_names(
        shapes,
        config_folder,
        check,
        renames=fold.renames,
        updates=updates,
        ask_later=ask_later and output.format == "safetensors",
        table=families.tensor_table((config or {}).get("model_type")),
        as_saved=getattr(family, "hub_names", None),
        hub_renames=getattr(family, "hub_renames", ()),
        copies=checkpoint.copies,
    )
    groups = _groups(checkpoint, naming, fold, out_dtype, as_stored)
    where = str(config_folder / "config.json" if config_folder else checkpoint.path)
    sink = sinks.plan_format(
        FormatRequest(
            output,
            groups,
            where,
            (config or {}).get("model_type"),
            naming.linear,
            config_folder,
            out_dtype,
            updates,
            separate_adapter=fold.adapter is not None,
            read=partial(_read_output, checkpoint, groups),
        )
    )
    files = sink.lay_out(groups, output.max_shard_size)
    extra_files = _place_adapter(checkpoint, fold.adapter, naming.outputs, out_dtype, sink, files)
    notes = fold.notes + naming.notes + sink.notes() + _float32_notes(naming, groups, out_dtype)
    notes += _missing_notes(config, config_folder, updates if "architectures" in head and not architecture else None)
    rebuild = None
    if naming.question is not None:
        rebuild = partial(build_plan, checkpoint, output, replace(source, config_from=config_folder))
    # Where the weights come from, as recorded: a --config-from Hub id, the Hub id transformers 4 saved in a
    # config, an adapter's base as peft saved it.
    origins = [
        str(config_from) if config_from and not Path(config_from).exists() else None,
        (config or {}).get("_name_or_path"),
        (fold.adapter.meta if fold.adapter else {}).get("base_model_name_or_path"),
    ]
    return Plan(
        checkpoint,
        config_folder,
        out_dtype,
        reason,
        files,
        {**fold.dropped, **naming.dropped},
        notes,
        config_updates={**updates, **sink.config_updates()},
        extra_files=extra_files,
        question=naming.question,
        rebuild=rebuild,
        sink=sink,
        base_models=hub_ids(origins),
        placed=getattr(sink, "placed", {}),
    )


def _model_config(checkpoint: Checkpoint, config_from, check: bool) -> tuple[Path | None, dict | None]:
    """The folder the model's config comes from (--config-from's, else the checkpoint's own) and that config with the
    checkpoint's changes (over it, or whole where the checkpoint carries the whole config), fitted to the
    checkpoint; a model file there that cannot be read is refused unless --no-check."""
    config_folder = resolve_config_source(config_from) if config_from else checkpoint.hf_folder
    config = hf_names.read_config(config_folder)
    if config is not None:
        config = dict(checkpoint.config_changes) if checkpoint.config_whole else {**config, **checkpoint.config_changes}
    if check and (broken := unreadable_model_files(config_folder)):
        path, why = broken[0]
        raise ConfigMismatchError(f"{path}: {why}; fix or remove it, or pass --no-check to copy it as it is")
    checkpoint.fit_config(config)
    return config_folder, config


def _groups(checkpoint: Checkpoint, naming, fold, out_dtype: DType, as_stored: bool) -> dict[str, Group]:
    """Each checkpoint tensor (or tensor joined of several of its rows) with the output tensors written of it, in their
    dtypes, and the whole-tensor step between (a LoRA folded in, transformers' conversion)."""
    groups: dict[str, Group] = {}
    # (a MoE's router, which transformers loads and save_pretrained writes in float32 beside 16-bit weights)
    kept_in_float32 = naming.float32.get(out_dtype.name, set())
    for name, outputs in naming.outputs.items():
        tensor = checkpoint.tensors[name]
        # Only floating-point tensors change dtype; integer buffers keep theirs.
        target = out_dtype if tensor.dtype.is_floating_point and not as_stored else tensor.dtype
        if name in kept_in_float32 and tensor.dtype.is_floating_point:
            target = dtypes.float32
        groups[name] = Group(
            tensor,
            [OutputTensor(n, s, target) for n, s in outputs],
            _compose(fold.folds.get(name), naming.converters.get(name), outputs[0][0]),
        )
    for name, (members, shape, order) in naming.joined.items():  # (one tensor of several of the checkpoint's rows)
        if folded := [m for m in members if m in fold.folds]:
            raise UnshardError(
                f"{checkpoint.path}: {folded[0]} holds a LoRA adapter and is written as part of {name}, which "
                "unshard cannot fold it into yet; merge the adapter with peft first, or pass --lora separate"
            )
        tensor = checkpoint.join_rows(name, members)
        target = out_dtype if tensor.dtype.is_floating_point and not as_stored else tensor.dtype
        gathered = None if order is None else lambda whole, name=name, order=order: {name: whole[list(order)]}
        groups[name] = Group(tensor, [OutputTensor(name, shape, target)], gathered)
    return groups


def _place_adapter(checkpoint: Checkpoint, adapter, outputs: dict, dtype: DType, sink, files: dict) -> dict:
    """--lora separate: the adapter's tensors added to `files`, where the format takes them its own way (GGUF's
    adapter file) or as PEFT's adapter file; the extra files written beside (PEFT's adapter_config.json)."""
    if adapter is None:
        return {}
    adapter_groups, adapter_config = _adapter_plan(checkpoint, adapter, outputs, dtype)
    take_adapter = getattr(sink, "take_adapter", None)  # (a format that writes the adapter its own way: GGUF)
    if take_adapter is not None:
        files.update(take_adapter(adapter_groups, adapter_config))
        return {}
    files[lora.ADAPTER_FILE] = adapter_groups
    text = json.dumps(adapter_config, indent=2, sort_keys=True) + "\n"
    return {f"{lora.ADAPTER_FOLDER}/adapter_config.json": text}


def _float32_notes(naming, groups: dict[str, Group], out_dtype: DType) -> list[str]:
    """Tensors kept in float32 beside a 16-bit output, as transformers keeps them."""
    if kept := sorted(naming.float32.get(out_dtype.name, set()) & set(groups)):
        return [
            f"{len(kept)} tensor(s) kept in float32 beside {out_dtype.name}, as transformers loads and saves "
            f"them ({groups[kept[0]].outputs[0].name}, ...)"
        ]
    return []


def _missing_notes(config: dict | None, config_folder: Path | None, new_head: dict | None) -> list[str]:
    """What the user should know of the folder: a head config.json now names (`new_head`, the config's updates),
    or a config or tokenizer not found."""
    notes = []
    if new_head is not None:
        notes.append(
            f"the weights end in a `score` head: config.json says {new_head['architectures'][0]}"
            + (f" with {new_head['num_labels']} label(s)" if "num_labels" in new_head else "")
        )
    if config is None:
        notes.append("no config.json found: pass --config-from DIR so the output folder loads with transformers")
    elif not any((config_folder / name).exists() for name in TOKENIZER_FILES) and not _drafts_for_a_target(config):
        # (a drafter's own folder has none: its tokenizer is its target's, which vLLM and its GGUF file take)
        notes.append(
            "no tokenizer beside the checkpoint: pass --config-from DIR (the Hugging Face model it was "
            "trained from) to include tokenizer, chat template and generation config"
        )
    return notes


def _drafts_for_a_target(config: dict) -> bool:
    """A drafter's config: a draft vocabulary, or a family whose GGUF file takes its target's vocabulary."""
    family = families.by_architecture((config.get("architectures") or [None])[0])
    return bool(config.get("draft_vocab_size")) or (
        family is not None and families.supports(family, "gguf") and family.gguf.target is not None
    )


def _adapter_plan(checkpoint: Checkpoint, adapter: lora.Adapter, outputs: dict, dtype: DType):
    """The adapter's tensors under the names PEFT's save_pretrained writes for the written model, and its
    adapter_config.json."""

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
            key = (
                "lora_magnitude_vector"
                if part == "magnitude_vector"
                else f"lora_embedding_{part}"
                if embedding
                else f"lora_{part}.weight"
            )
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
    return groups, adapter.config(hf_modules, hf_saved)


def _read_output(checkpoint: Checkpoint, groups: dict[str, Group], name: str, rows: slice | None = None):
    """Output tensor `name`, whole or those rows of it, as the writer makes it (its checkpoint tensor read, converted,
    in the output's dtype), for a format that writes a few values into its header (FormatRequest.read). Rows of a
    tensor read as it lies are read alone: memory follows them, not the tensor."""
    source, group = next((source, g) for source, g in groups.items() if any(o.name == name for o in g.outputs))
    output = next(o for o in group.outputs if o.name == name)
    if rows is not None and group.convert is None and checkpoint.reads_rows(source):
        return checkpoint.read_rows(source, rows.start, rows.stop, checkpoint.local_tensor).to(output.dtype.torch)
    whole = checkpoint.read(source)
    whole = whole if group.convert is None else group.convert(whole)[name]
    return (whole if rows is None else whole[rows]).to(output.dtype.torch)


def _compose(fold, convert, only_output: str):
    """One whole-tensor step for a group: fold a LoRA adapter in, then transformers' conversion."""
    if fold is None:
        return convert
    if convert is None:
        return lambda tensor: {only_output: fold(tensor)}
    return lambda tensor: convert(fold(tensor))

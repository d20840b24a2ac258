"""A Hugging Face model folder: safetensors shards and their index, config and tokenizer files, a model card.

The folder is built beside OUT under a hidden name and renamed into place only when complete, so a
failed run never leaves an OUT that looks finished. Before that, the folder is loaded as a serving
stack would load it (`check_folder`).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from .. import families
from ..errors import UnshardError
from ..model_files import MODEL_FILE_PATTERNS, TOKENIZER_PATTERNS, unreadable_model_files
from ..names import dense_tables, known
from ..types import REMOVED, FormatRequest, Group, OutputTensor, Plan
from .model_card import model_card
from .safetensors import SafetensorsFile, WrittenFile
from .staging import OutputFolder

log = logging.getLogger("unshard")

SUMMARY_KEY = None  # (a plain folder adds nothing to the plan's summary)


def plan_sink(request: FormatRequest) -> HFFolder:
    return HFFolder()


def summary_lines(summary: dict[str, Any]) -> list[str]:
    return []


class HFFolder:
    """The Hugging Face folder as an output format (a types.Sink, found by sinks.FORMATS)."""

    def lay_out(self, groups: dict[str, Group], max_shard_size: int | str) -> dict[str, list[Group]]:
        """The weight files and the groups each holds, by the bytes written (huggingface_hub's split)."""
        from huggingface_hub import split_state_dict_into_shards_factory

        try:
            split = split_state_dict_into_shards_factory(
                groups,
                get_storage_size=lambda g: g.nbytes,
                filename_pattern="model{suffix}.safetensors",
                max_shard_size=max_shard_size,
            )
        except ValueError:
            raise UnshardError(f"--max-shard-size {max_shard_size!r}: give a size such as 5GB or 500MB") from None
        return {filename: [groups[n] for n in names] for filename, names in split.filename_to_tensors.items()}

    def stage(self, out: Path, overwrite: bool, sync: bool = True) -> OutputFolder:
        return OutputFolder(out, overwrite, sync)

    def open(self, path: Path, tensors: list[OutputTensor]) -> SafetensorsFile:
        path.parent.mkdir(exist_ok=True)  # lora_adapter/
        return SafetensorsFile(path, [(t.name, t.dtype, t.shape) for t in tensors])

    def file_size(self, filename: str, tensors: list[OutputTensor]) -> int:
        return sum(t.nbytes for t in tensors)  # (and a header of a few KB)

    def read_back(self, path: Path) -> WrittenFile:
        return WrittenFile(path)

    def finish(self, plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None):
        return finish_folder(plan, folder, digests, extra_files)

    def notes(self) -> list[str]:
        return []

    def config_updates(self) -> dict[str, Any]:
        return {}

    def summary(self) -> dict[str, Any]:
        return {}

    def card(self) -> tuple[list[str], list[str]]:
        return [], []


def write_index(folder: Path, files: dict[str, list[str]], total_size: int) -> None:
    """model.safetensors.index.json; total_size counts bytes, as the Hub expects."""
    if len(files) <= 1:
        return
    weight_map = {name: filename for filename, names in files.items() for name in names}
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def copy_model_files(
    source: Path | None,
    folder: Path,
    dtype_name: str,
    updates: dict | None = None,
    whole: bool = False,
    tokenizer: bool = True,
) -> list[str]:
    """Copy config, generation config, tokenizer, chat template, processor and code files into OUT.

    config.json gets the dtype of the written weights, under the key(s) it already uses, and the
    plan's `updates` (a head the weights have and the config did not say; with `whole`, all of it).
    """
    copied = []
    if source is None:
        return copied
    config = (
        json.loads((source / "config.json").read_text()) if (source / "config.json").is_file() and not whole else {}
    )
    for path in sorted(source.iterdir()):
        if not path.is_file() or not any(fnmatch.fnmatch(path.name, p) for p in MODEL_FILE_PATTERNS):
            continue
        if path.suffix == ".py" and not config.get("auto_map"):
            continue
        if not tokenizer and any(fnmatch.fnmatch(path.name, p) for p in TOKENIZER_PATTERNS):
            continue
        if path.name == "config.json":
            keys = [k for k in ("dtype", "torch_dtype") if k in config] or ["dtype"]
            for key in keys:
                config[key] = dtype_name
            config.update({k: v for k, v in (updates or {}).items() if k != "num_labels"})
            for key in [k for k, v in config.items() if v == REMOVED]:
                del config[key]
            (folder / path.name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        else:
            shutil.copyfile(path, folder / path.name)
        copied.append(path.name)
    return copied


# Tokenizer classes that transformers loads from tokenizer.json alone, with no code of the model's.
TOKENIZERS_JSON_CLASSES = frozenset(
    {
        None,
        "PreTrainedTokenizerFast",
        "TokenizersBackend",
        "LlamaTokenizer",
        "LlamaTokenizerFast",
        "Qwen2Tokenizer",
        "Qwen2TokenizerFast",
        "GPT2Tokenizer",
        "GPT2TokenizerFast",
        "GemmaTokenizer",
        "GemmaTokenizerFast",
    }
)


def loads_without_transformers(folder: Path) -> bool:
    """Whether this output folder is known to load without asking transformers: its config is one its
    family's tensor table covers, and its tokenizer, if any, is a tokenizer.json that the tokenizers library reads."""
    try:
        config = json.loads((folder / "config.json").read_text())
        table = families.tensor_table(config.get("model_type"))
        if table is None or dense_tables.settings(table, config) is None:
            return False
        if not (folder / "tokenizer.json").exists():
            return not any((folder / name).exists() for name in ("tokenizer.model", "tokenizer_config.json"))
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        if "auto_map" in tokenizer_config or tokenizer_config.get("tokenizer_class") not in TOKENIZERS_JSON_CLASSES:
            return False
        import tokenizers

        tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        return True
    except Exception:  # anything unusual: transformers is asked and says what is wrong
        return False


def finish_folder(plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None):
    """Everything in OUT besides the weights: index, config and tokenizer, model card; then the load check."""
    model_files = plan.model_files
    write_index(
        folder,
        {f: [s.name for s in plan.stored(f)] for f in model_files},
        sum(g.nbytes for gs in model_files.values() for g in gs),
    )
    copied = copy_model_files(
        plan.config_folder,
        folder,
        plan.dtype.name,
        plan.config_updates,
        plan.checkpoint.config_whole,
        tokenizer=not plan.own_tokenizer,
    )
    extra = {**plan.extra_files, **(extra_files or {})}
    extra["README.md"] = model_card(plan, {f: digests[f] for f in plan.files}, extra.get("README.md"))
    for name, text in extra.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):  # (a plot)
            (folder / name).write_bytes(text)
        else:
            (folder / name).write_text(text)
        copied.append(name)
    return copied, check_folder(folder)


def check_folder(folder: Path) -> list[str]:
    """Load the written config (and tokenizer) as a serving stack would; what it would miss, as warnings.
    A config transformers cannot read is an error: the folder would not load anywhere."""
    warnings = [f"{path.name}: {why}; copied as it is (--no-check)" for path, why in unreadable_model_files(folder)]
    names = {p.name for p in folder.iterdir()}
    # (A missing tokenizer is already among the plan's notes.)
    if (
        names & {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"}
        and "chat_template.jinja" not in names
        and "chat_template" not in _read_json(folder / "tokenizer_config.json")
    ):
        warnings.append("no chat template in the output (fine for a base model; a chat model needs one)")
    if "generation_config.json" not in names:
        warnings.append("no generation_config.json: generation falls back to defaults (eos, sampling)")
    version = known.transformers_version()
    if version is None:
        return warnings
    # The same config and tokenizer files load the same way with the same transformers: ask once.
    model_files = [
        p
        for p in folder.iterdir()
        if p.is_file() and any(fnmatch.fnmatch(p.name, pattern) for pattern in MODEL_FILE_PATTERNS)
    ]
    entry = known.key("folder", version, known.files_digest(model_files))
    if (cached := known.recall("folders", entry)) is None:
        light = loads_without_transformers(folder)  # (known to load: transformers not imported)
        cached = [] if light else _load_as_transformers_would(folder, names)
        known.remember("folders", entry, cached)
    return warnings + cached


def _load_as_transformers_would(folder: Path, names: set[str]) -> list[str]:
    with known.transformers_quiet():
        return _transformers_load_warnings(folder, names)


def _transformers_load_warnings(folder: Path, names: set[str]) -> list[str]:
    import transformers

    try:
        transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except ValueError as e:
        # (custom code is copied, never run: a config naming its own classes (auto_map) is its code's to read, as
        # speculators' drafters', whose config class transformers does not find by the empty name it is mapped to)
        if "trust_remote_code" not in str(e) and "auto_map" not in _read_json(folder / "config.json"):
            raise UnshardError(f"{folder / 'config.json'}: transformers cannot read it ({e})") from None
    if names & {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"}:
        tokenizer_config = _read_json(folder / "tokenizer_config.json")
        named = tokenizer_config.get("tokenizer_class")
        if isinstance(named, str) and not hasattr(transformers, named) and "auto_map" not in tokenizer_config:
            # (a package's own tokenizer, RWKV7Tokenizer's: transformers finds it where that package is imported)
            return [
                f"tokenizer_config.json names {named}, which transformers has no class of: it loads the tokenizer "
                "where the package that defines it is imported"
            ]
        try:
            transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        except Exception as e:  # a missing optional package (sentencepiece) is the user's to install
            return [f"the tokenizer does not load here ({type(e).__name__}: {' '.join(str(e).split())[:120]})"]
    return []


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}

"""What the GGUF sink reads and writes of every family's header besides the family's hooks: the config as the
converter reads it, and the general key-values."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ...errors import ConfigMismatchError, read_json
from ...families.gguf_hooks import gguf_py, json_or_empty
from ...names import known

# The configs Qwen's omni models keep within thinker_config, which the converter reads there (its text_config as the
# text model's; its MmprojModel the towers' from the thinker's)
THINKER_CONFIGS = ("text_config", "vision_config", "audio_config")
BAND_BYTES = 16 << 20  # (rows of the embedding read at a time, as float32, for zero_embedding_tokens)


def as_the_converter_nests(config: dict[str, Any]) -> dict[str, Any]:
    """The config with a thinker's text and towers' configs at the top, where the other models keep theirs."""
    thinker = config.get("thinker_config")
    if not isinstance(thinker, dict):
        return config
    return {**config, **{key: thinker[key] for key in THINKER_CONFIGS if isinstance(thinker.get(key), dict)}}


def read_hparams(folder: Path) -> dict[str, Any]:
    """config.json with the defaults its config class fills in, as the converter reads it (AutoConfig's to_dict,
    where transformers is installed). Importing transformers costs seconds, so the answer is kept (known.py)
    for the next checkpoint of the same config."""
    import json

    config = read_json(folder / "config.json", "fix it or pass --config-from DIR", ConfigMismatchError)
    text = (folder / "config.json").read_text()
    version = known.transformers_version()
    if version is None:  # (no transformers: the file as it is, as the converter would have it)
        return config
    entry = known.key("gguf-hparams", version, text)
    full = known.recall("configs", entry)
    if full is None:
        try:
            from transformers import AutoConfig

            with known.transformers_quiet():
                full = AutoConfig.from_pretrained(folder, trust_remote_code=False).to_dict()
        except Exception:  # (a config transformers cannot read: the file as it is, as the converter does)
            return config
        full = json.loads(json.dumps(full, default=str))  # (as it is kept: the same values first time and after)
        known.remember("configs", entry, full)
    # (to_dict names the installed transformers; the file names the one its trainer ran, which a family may read)
    saved_by = {"transformers_version": config.get("transformers_version")}
    return {**full, **{k: v for k, v in config.items() if k not in full}, **saved_by}


def zero_embedding_tokens(outputs: list, folder: Path, read) -> list[int]:
    """The tokens past the tokenizer's own (its vocab_size, added tokens not counted) whose embedding rows are all
    zero, as the converter's MiniMaxText01Model finds them to suppress: those rows alone read, a band at a time."""
    from .vocabulary import transformers_tokenizer

    embedding = next((o for o in outputs if o.name.endswith("embed_tokens.weight")), None)
    if embedding is None or read is None:
        return []
    rows, band = embedding.shape[0], max(1, BAND_BYTES // (math.prod(embedding.shape[1:]) * 4))
    zero = []
    for start in range(transformers_tokenizer(folder).vocab_size, rows, band):
        values = read(embedding.name, slice(start, min(rows, start + band)))
        zero.extend(start + int(row) for row in (values == 0).all(dim=1).nonzero().flatten())
    return zero


def general_metadata(writer, folder: Path, parameters: tuple[int, int, int, int]) -> None:
    """The general key-values: gguf-py's Metadata of the folder (model card, generation config's sampling), its name
    the folder's (which names the converter's file; OUT's name would do as well), the size label from the parameters
    of the file's tensors (all, outside the experts, one expert's, experts)."""
    gguf = gguf_py()
    general = gguf.Metadata.load(None, folder, None, parameters[0])
    general.name = general.name or folder.name
    if general.sampling_penalty_repeat is None:  # (llama.cpp's own gguf-py, newer than PyPI's 0.19.0, reads this too)
        general.sampling_penalty_repeat = json_or_empty(folder / "generation_config.json").get("repetition_penalty")
    if general.size_label is None and parameters[0] > 0:
        general.size_label = gguf.size_label(*parameters)  # ("8x7B" for experts)
    general.set_gguf_meta_model(writer)


def parameter_counts(shapes: dict[str, tuple[int, ...]]) -> tuple[int, int, int, int]:
    """The file's parameters as gguf-py counts them for the size label (GGUFWriter.get_total_parameter_count): all,
    those outside the experts' stacks, one expert's, and the experts."""
    total = shared = expert = stacked_experts = stacks = 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        total += size
        if "_exps." in name and len(shape) >= 3:
            count = shape[-2 if ".bias" in name else -3]
            expert, stacked_experts, stacks = expert + size // count, stacked_experts + count, stacks + 1
        else:
            shared += size
    return total, shared, expert, stacked_experts // stacks if stacks else 0

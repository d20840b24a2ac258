"""The files of a Hugging Face model folder other than its weights: which they are, and whether the loaders
that read them would."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

# The files of a Hugging Face model folder other than weights. Only these are copied into OUT, so
# a trainer's own files beside them (`latest`, `zero_to_fp32.py`, `trainer_state.json`,
# `training_args.bin`, optimizer states) stay behind. Python files are custom model code and are
# copied only when config.json points at them (`auto_map`).
MODEL_FILE_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.model",
    "*.tiktoken",
    "rwkv_vocab_*.txt",  # (RWKV's world vocabulary, which its tokenizers read by this name)
    "chat_template.*",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "image_processor_config.json",
    "feature_extractor_config.json",
    "spk_dict.pt",  # (Qwen2.5-Omni's voices, which transformers loads beside the model; copied, never read here)
    "*.py",
)

# The tokenizer's files among them (left for a merged vocabulary's own)
TOKENIZER_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.model",
    "*.tiktoken",
    "rwkv_vocab_*.txt",
)


def unreadable_model_files(folder: Path | None) -> list[tuple[Path, str]]:
    """The model files of a folder that its loaders would fail on, and why: JSON files that do not parse
    (tokenizer.json also as the tokenizers library reads it, where installed), and text files (a chat
    template, merges.txt, vocab.txt) that are not UTF-8. Copied into OUT, a tokenizer_config.json cut
    short or a garbled chat template would make the folder fail to load its tokenizer."""
    broken = []
    for path in sorted(folder.iterdir()) if folder is not None else []:
        if not (
            path.suffix in (".json", ".jinja", ".txt")
            and path.is_file()
            and any(fnmatch.fnmatch(path.name, p) for p in MODEL_FILE_PATTERNS)
        ):
            continue
        try:
            text = path.read_bytes().decode()
            if path.suffix == ".json":
                json.loads(text)
        except ValueError as e:  # (UnicodeDecodeError is one)
            broken.append((path, f"not {'valid JSON' if path.suffix == '.json' else 'UTF-8 text'} ({str(e)[:200]})"))
            continue
        if path.name == "tokenizer.json" and (why := _tokenizer_refusal(text)):
            broken.append((path, why))
    return broken


def _tokenizer_refusal(text: str) -> str | None:
    """Why the tokenizers library cannot read a tokenizer.json (None: it can, or is not installed)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        Tokenizer.from_str(text)
    except Exception as e:  # (the library raises its own Exception type)
        return f"the tokenizers library cannot read it ({str(e)[:200]})"
    return None

"""The RWKV world vocabulary (rwkv_vocab_v20230424.txt: one token a line, `<id> <Python literal> <byte length>`, for a
byte-level trie) as llama.cpp's converter writes it: llama.cpp's `rwkv` tokenizer model, `<s>` first as a control
token, then each line's bytes as Python's repr spells them, then padding up to the config's vocabulary; gguf-py's
SpecialVocab of the folder with the converter's own settings over it (its end of turn, `\\n\\n`, 261, the start and end
tokens 0) and, where the folder has no chat template, llama.cpp's built-in one by its name."""

from __future__ import annotations

import ast
from pathlib import Path

from ...errors import ConfigMismatchError
from ...families.gguf_hooks import gguf_py, special_vocab
from .vocabulary import add_special_vocab

WORLD_VOCABULARY = "rwkv_vocab_v20230424.txt"
# the token the converter names the end of a turn in every RWKV world vocabulary: `\n\n`
END_OF_TURN = 261


def write_rwkv_world_vocabulary(writer, hparams: dict, folder: Path) -> str:
    """Writes the vocabulary; says what it wrote."""
    gguf = gguf_py()
    path = folder / WORLD_VOCABULARY
    if not path.is_file():
        raise ConfigMismatchError(
            f"{folder}: no {WORLD_VOCABULARY}, RWKV's world vocabulary, which a GGUF file of RWKV-7 holds: pass "
            "--config-from the folder of the model the run started from"
        )
    size = hparams.get("vocab_size", 65536)
    tokens, kinds = [b"<s>"], [gguf.TokenType.CONTROL]
    lines = path.read_text(encoding="utf-8").split("\n")  # (by newlines alone, as the converter reads it)
    for number, line in enumerate(lines[:-1] if lines[-1] == "" else lines, 1):
        tokens.append(repr(_token(line, path, number))[2:-1].encode())
        kinds.append(gguf.TokenType.NORMAL)
    if len(tokens) > size:
        raise ConfigMismatchError(
            f"{path}: {len(tokens)} tokens with the converter's <s>, more than the config's vocab_size {size}: pass "
            "--config-from the folder of the model the run started from"
        )
    tokens += [f"[PAD{i}]".encode() for i in range(len(tokens), size)]
    kinds += [gguf.TokenType.UNUSED] * (size - len(kinds))
    writer.add_tokenizer_model("rwkv")
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    special = special_vocab(folder, load_merges=False)
    said = f"{size} tokens from {WORLD_VOCABULARY} (RWKV's world vocabulary)"
    if special.chat_template is None:
        # (the converter reads llama.cpp's own template of the name from its checkout, and writes the name where it
        # has none: llama.cpp runs the same template by either)
        special.chat_template = "rwkv-world"
        said += "; no chat template beside it: llama.cpp's built-in rwkv-world named in its place"
    special._set_special_token("eot", END_OF_TURN)
    special.special_token_ids["bos"] = 0
    special.special_token_ids["eos"] = 0
    add_special_vocab(special, writer, folder)
    return said


def _token(line: str, path: Path, number: int) -> bytes:
    """A line's token, its literal read as a value alone (never run), checked against the length the line gives."""
    parts = line.split(" ")
    try:
        value = ast.literal_eval(" ".join(parts[1:-1]))
        token = value.encode() if isinstance(value, str) else value
        if not isinstance(token, bytes) or len(token) != int(parts[-1]):
            raise ValueError
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ConfigMismatchError(
            f"{path}, line {number}: not `<id> <token as a Python literal> <its length in bytes>`; the vocabulary "
            "is damaged: pass --config-from a folder with the model's own"
        ) from None
    return token

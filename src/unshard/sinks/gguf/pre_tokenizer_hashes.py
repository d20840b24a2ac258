"""llama.cpp's converter's own table of pre-tokenizers, where the user has the converter (a llama.cpp checkout named
by UNSHARD_LLAMA_CPP): the converter names a byte-level BPE pre-tokenizer by the SHA-256 of the token ids its
tokenizer gives one fixed text, listed per model it knows (`get_vocab_base_pre`). With the table, unshard names the
pre-tokenizer as the converter does for every tokenizer it knows, including those it lists under a name of their
own over a split unshard would name otherwise; without it (or for a tokenizer it does not list), by the split
tokenizer.json declares (vocabulary.py).

The table is read from the converter's source as text (its syntax tree): nothing of the converter is run, and it
stays the converter's own, however many models a newer llama.cpp adds.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
from pathlib import Path

from ...errors import UnshardError

CHECKOUT_VARIABLE = "UNSHARD_LLAMA_CPP"
# Where llama.cpp keeps the table: its converter's base module since the converter was split into a package, the
# converter script itself before
TABLE_FILES = ("conversion/base.py", "convert_hf_to_gguf.py")
TABLE_FUNCTION = "get_vocab_base_pre"


def converter_name(tokenizer_json: Path) -> str | None:
    """The converter's name for this tokenizer.json's pre-tokenizer, or None: no checkout named, or a tokenizer the
    converter does not list."""
    checkout = os.environ.get(CHECKOUT_VARIABLE)
    if not checkout:
        return None
    text, names = _table(Path(checkout))
    from tokenizers import Tokenizer

    # As the converter: the ids its transformers' fast tokenizer gives, special tokens added, as Python prints the
    # list. That tokenizer is tokenizer.json as it is, which the tokenizers library runs; transformers 5's classes
    # rebuild some tokenizers from their vocabulary with a pre-tokenizer of their own, so they may tokenize otherwise.
    try:
        ids = Tokenizer.from_file(str(tokenizer_json)).encode(text).ids
    except Exception as e:  # (the tokenizers library raises its own kinds on a file it cannot run)
        raise UnshardError(
            f"{tokenizer_json}: the tokenizers library cannot run it ({str(e)[:120]}); restore it"
        ) from None
    return names.get(hashlib.sha256(str(ids).encode()).hexdigest())


@functools.cache
def _table(checkout: Path) -> tuple[str, dict[str, str]]:
    """(the text the converter tokenizes, {hash: pre-tokenizer name}) from the checkout's converter source."""
    for name in TABLE_FILES:
        path = checkout / name
        if not path.is_file():
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError) as e:
            raise UnshardError(f"{path}: not Python that can be read ({e}); fix {CHECKOUT_VARIABLE}") from None
        function = next(
            (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == TABLE_FUNCTION), None
        )
        if function is not None:
            return _read_table(function, path)
    raise UnshardError(
        f"{CHECKOUT_VARIABLE}={checkout}: no llama.cpp converter there ({' or '.join(TABLE_FILES)} with "
        f"{TABLE_FUNCTION}); point it at a llama.cpp checkout, or unset it"
    )


def _read_table(function: ast.FunctionDef, path: Path) -> tuple[str, dict[str, str]]:
    """The function's `chktxt = "..."` and each `if chkhsh == "<hash>": res = "<name>"`."""
    text, names = None, {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and _assigns(node, "chktxt") and isinstance(node.value, ast.Constant):
            text = node.value.value
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            compared = node.test
            if (
                isinstance(compared.left, ast.Name)
                and compared.left.id == "chkhsh"
                and len(compared.comparators) == 1
                and isinstance(compared.comparators[0], ast.Constant)
            ):
                named = [s.value.value for s in node.body if isinstance(s, ast.Assign) and _assigns(s, "res")]
                if named and isinstance(named[0], str):
                    names[compared.comparators[0].value] = named[0]
    if not isinstance(text, str) or not names:
        raise UnshardError(
            f"{path}: its {TABLE_FUNCTION} is not the table unshard reads (a text and hashes); "
            f"point {CHECKOUT_VARIABLE} at another llama.cpp checkout, or unset it"
        )
    return text, names


def _assigns(node: ast.Assign, name: str) -> bool:
    return len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name

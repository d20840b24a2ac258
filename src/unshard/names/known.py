"""What transformers said about a model config or a folder, kept on disk for the next conversion.

Asking transformers (which names and shapes a config's model has, whether a folder's config and
tokenizer load) means importing it and the model's code: about 3 seconds, as long as writing a few
GB. Users convert checkpoint after checkpoint of the same run, so the answers are kept, keyed by
the transformers version and the exact bytes asked about; anything else is a miss and asks again.
Entries are plain JSON (names, shapes, warnings), never code.

Location: $UNSHARD_CACHE, else $XDG_CACHE_HOME/unshard, else ~/.cache/unshard; UNSHARD_CACHE=off
turns it off. A cache that cannot be read or written is skipped, never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger("unshard")


def transformers_version() -> str | None:
    """The installed transformers version, without importing it; None if it is not installed."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


@contextmanager
def transformers_quiet():
    """transformers' warnings silenced while unshard asks it about a config (a config key its class does not know, a
    key it will stop reading: transformers 4's `rope_scaling`): unshard's own checks say what matters, each in one
    line."""
    from transformers.utils import logging as transformers_logging

    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        transformers_logging.set_verbosity(level)


def _folder() -> Path | None:
    where = os.environ.get("UNSHARD_CACHE")
    if where == "off":
        return None
    if where:
        return Path(where)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "unshard"


def key(*parts: Any) -> str:
    """A key for these JSON-able parts (always include what transformers version answered)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def files_digest(paths: list[Path]) -> dict[str, str]:
    """name -> sha256 of the bytes of these (small) files."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths)}


def recall(kind: str, entry: str) -> Any | None:
    folder = _folder()
    if folder is None:
        return None
    try:
        return json.loads((folder / kind / f"{entry}.json").read_text())
    except (OSError, ValueError):
        return None


def remember(kind: str, entry: str, value: Any) -> None:
    folder = _folder()
    if folder is None:
        return
    try:
        (folder / kind).mkdir(parents=True, exist_ok=True)
        # Written aside and renamed, so a concurrent reader sees the whole entry or none.
        with tempfile.NamedTemporaryFile("w", dir=folder / kind, suffix=".tmp", delete=False) as f:
            json.dump(value, f)
        os.replace(f.name, folder / kind / f"{entry}.json")
    except OSError as e:
        log.debug("not caching %s: %s", kind, e)

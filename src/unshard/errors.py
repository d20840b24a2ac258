"""Errors unshard raises. Each message is one line that names the file and says what to do.

They also subclass the built-in exception a caller would expect (ValueError for bad input,
FileExistsError for an output in the way), so `except ValueError` works without importing unshard.
"""

from __future__ import annotations


class UnshardError(Exception):
    """Base of every error unshard raises on purpose."""


class CheckpointError(UnshardError, ValueError):
    """The input checkpoint is missing pieces, corrupt, or of a layout unshard does not know."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle in the checkpoint references something other than tensors and their metadata."""


class OutputExistsError(UnshardError, FileExistsError):
    """OUT exists and is not empty, and overwriting was not asked for."""


class ConfigMismatchError(UnshardError, ValueError):
    """The weights do not fit the model config (missing, unexpected or mis-shaped tensors)."""


class PeerFailedError(UnshardError):
    """Another rank of a distributed run failed (rank 0 reports why); this rank stops too."""


def read_json(path, fix: str, error: type[UnshardError] = CheckpointError):
    """A JSON file of the input, parsed; one that does not parse is `error`, naming it and saying `fix`."""
    import json

    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as e:  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
        raise error(f"{path}: not valid JSON ({str(e)[:120]}); {fix}") from None

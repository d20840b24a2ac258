"""Pushing a finished output folder to the Hugging Face Hub, through huggingface_hub.

The folder is complete on disk before anything is sent, and stays whatever the Hub answers: a missing
token, no network or a refused push is one line (PushFailedError) naming the repository and what to do.
huggingface_hub does the rest as for any upload: the token from HF_TOKEN or `hf auth login`, the endpoint
from HF_ENDPOINT, repository creation, large files through Xet storage (or LFS), one commit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import UnshardError


class PushFailedError(UnshardError, ConnectionError):
    pass


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9]")


def is_hub_id(name: str) -> bool:
    """`owner/name`, not a path: what a model card's base_model may name, and what unshard fetches."""
    return isinstance(name, str) and bool(HUB_ID.fullmatch(name)) and ".." not in name


def hub_ids(names) -> list[str]:
    """Those of `names` that are Hub model ids, each once (the Hub refuses a card whose base_model is a path)."""
    found = []
    for name in names:
        if is_hub_id(name) and name not in found:
            found.append(name)
    return found


def fetch(repo_id: str, patterns: list[str], what: str) -> Path:
    """The files of Hub model REPO_ID matching PATTERNS, through huggingface_hub's cache (HF_ENDPOINT, HF_TOKEN,
    HF_HUB_OFFLINE as for any download); a missing repository or no network is one line naming the id."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as e:
        raise UnshardError(
            f"{repo_id}: {what} is no local folder, and the Hub's copy could not be fetched "
            f"({_first_line(e)}); download it (`hf download {repo_id} --local-dir DIR`) and name "
            "the folder"
        ) from None


@dataclass(frozen=True)
class HubTarget:
    """Where `--push-to-hub` sends the output."""

    repo_id: str
    private: bool = False
    revision: str | None = None  # a branch, made from main if it does not exist
    commit_message: str | None = None


def check_repo_id(repo_id: str) -> None:
    """A repository id the Hub would refuse is one line before anything is written, not after."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise PushFailedError(
            f"--push-to-hub {repo_id!r}: not a Hub repository id ({_first_line(e)}); use owner/name"
        ) from None


def push(out: str | Path, target: HubTarget, progress: bool | None = None, files: Iterable[Path] = ()) -> str:
    """Upload OUT (every file of a folder), or the `files` of an output of files (a GGUF file, its split, its mmproj),
    to the model repository TARGET.repo_id, created if needed, in one commit; the commit's URL."""
    from huggingface_hub import CommitOperationAdd, HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    folder = Path(out)
    keep = f"{folder} is complete on disk and stays; run `hf upload {target.repo_id} {folder}` once that is fixed"
    if progress is False:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    api = HfApi()
    try:
        if get_token() is None:
            raise LocalTokenNotFoundError("no token")
        api.create_repo(target.repo_id, private=target.private or None, exist_ok=True)  # (None: the namespace default)
        if target.revision:
            api.create_branch(target.repo_id, branch=target.revision, exist_ok=True)
        message = target.commit_message or f"Upload {folder.name} (written by unshard)"
        if files or folder.is_file():
            commit = api.create_commit(
                repo_id=target.repo_id,
                operations=[CommitOperationAdd(path.name, path) for path in (files or [folder])],
                revision=target.revision,
                commit_message=message,
            )
        else:
            commit = api.upload_folder(
                repo_id=target.repo_id, folder_path=folder, revision=target.revision, commit_message=message
            )
    except LocalTokenNotFoundError:
        raise PushFailedError(
            f"push to {target.repo_id}: no Hugging Face token (set HF_TOKEN or run `hf auth login`); {keep}"
        ) from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        why = {
            401: "the token was refused (check HF_TOKEN)",
            403: "this token may not write there (a write token, and the namespace yours or your organisation's?)",
            404: "no such repository or namespace",
        }.get(status, "")
        raise PushFailedError(
            f"push to {target.repo_id} refused ({status}{': ' + why if why else ''}; {_first_line(e)}); {keep}"
        ) from None
    except Exception as e:
        # No network: huggingface_hub's offline mode (a ConnectionError), its HTTP client's connect, read and
        # name-lookup errors (httpx's, whose classes are not OSErrors).
        if isinstance(e, ConnectionError) or type(e).__module__.split(".")[0].startswith("httpx"):
            raise PushFailedError(
                f"push to {target.repo_id}: the Hub cannot be reached ({_first_line(e)}); {keep}"
            ) from None
        raise
    return str(commit.commit_url)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]

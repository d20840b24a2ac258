"""Staging: an output is written in a hidden folder beside OUT and put in place only when it is whole and on the
disk, so that a present OUT is a complete one, even after a crash or a power loss.

The order, as databases and git keep it: every staged file's bytes synced (the writers fdatasync each weight file
as soon as it is complete; the rest here), the staging folder synced, the one rename (or link) into place, OUT's
parent folder synced. `sync=False` (--no-sync) skips the syncs, for scratch outputs.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
import socket
from pathlib import Path

from ..errors import OutputExistsError, UnshardError

log = logging.getLogger("unshard")


def sync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(folder: Path) -> None:
    """Every file under `folder` (already synced ones cost nothing), then every folder, deepest first, itself last."""
    folders = []
    for root, _, names in os.walk(folder):
        for name in names:
            sync_path(Path(root) / name)
        folders.append(Path(root))
    for each in reversed(folders):
        sync_path(each)


class OutputFolder:
    """A staging folder beside OUT that becomes OUT on `commit`, or vanishes on `abort`.

    Its name says which host and process own it, so that a later run writing into the same parent
    removes what a run killed outright (SIGKILL, the OOM killer) left there, and never a live run's.
    """

    def __init__(self, out: Path, overwrite: bool = False, sync: bool = True):
        self.out, self.overwrite, self.sync = out, overwrite, sync
        if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
            raise OutputExistsError(f"{out}: already exists and is not empty; choose another OUT or pass --overwrite")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            self.removed = remove_stale_staging(out.parent)
            # (a token of its own: two conversions in one process, or threads, never share a staging folder)
            self.path = (
                out.parent / f".{out.name}.unshard-partial-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
            )
            self.path.mkdir()
        except OSError as e:  # not writable by this user, a file, a read-only filesystem
            why = (
                "a file is where a folder must be"
                if isinstance(e, (FileExistsError, NotADirectoryError))
                else e.strerror
            )
            raise UnshardError(
                f"{out.parent}: cannot hold the output ({why}); choose an OUT in a folder you can write to"
            ) from None
        for path, pid in self.removed:
            log.info(f"note: removed {path}, left by process {pid} of this host, which is no longer running")

    def commit(self) -> None:
        if self.sync:
            sync_tree(self.path)
        if not self.overwrite:
            try:  # one rename: it fails if another run put a folder at OUT since this one started
                os.rename(self.path, self.out)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                    raise
                raise OutputExistsError(
                    f"{self.out}: another run wrote it while this one was running; this run's "
                    "output was dropped: choose another OUT or pass --overwrite"
                ) from None
            self._synced_in_place()
            return
        old = None
        if self.out.exists():
            old = self.out.parent / self.path.name.replace(".unshard-partial-", ".unshard-old-", 1)
            os.replace(self.out, old)
        os.replace(self.path, self.out)
        self._synced_in_place()
        if old is not None:
            shutil.rmtree(old) if old.is_dir() else old.unlink()

    def _synced_in_place(self) -> None:
        """The rename made durable: OUT's parent folder synced."""
        if self.sync:
            sync_path(self.out.parent)

    def abort(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


# `.OUT.unshard-partial-HOST-PID-TOKEN` (staging; TOKEN: 8 random hex digits) and `.OUT.unshard-old-...`
# (an OUT being replaced); before unshard named the host, `...-PID` alone.
_STAGING = re.compile(r"^\..+\.unshard-(?:partial|old)-(?:(?P<host>.+)-(?P<pid>\d+)-[a-z0-9_]{8}|(?P<legacy>\d+))$")


def remove_stale_staging(parent: Path) -> list[tuple[Path, int]]:
    """Remove the staging folders in `parent` of unshard processes of this host that are no longer running;
    (path, pid) of each. A folder of another host (a shared filesystem) or of a live process stays."""
    removed = []
    for path in parent.iterdir():
        found = _STAGING.match(path.name)
        pid = int(found["pid"] or found["legacy"]) if found else None
        if pid is None or found["host"] not in (None, socket.gethostname()) or _alive(pid):
            continue
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        removed.append((path, pid))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True

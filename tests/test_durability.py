"""Nothing appears as OUT before its bytes are on the disk: strace follows a conversion's system calls, and every
file of the output must be synced (fsync or fdatasync) before the rename or link that puts it in place, the
staging folder too, and OUT's parent folder after it (the order databases and git keep)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHIPPED

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")

SYNCS = ("fsync", "fdatasync")
CALL = re.compile(r"^(\d+) +(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")


def traced(tmp_path: Path, *args: str) -> list[tuple[str, list[str]]]:
    """(call, the paths it names) of every sync, rename and link of `unshard ARGS`, in the order they completed."""
    log = tmp_path / "strace.log"
    cmd = ["strace", "-f", "-y", "-qq", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2,link,linkat"]
    done = subprocess.run(
        [*cmd, "-o", str(log), sys.executable, "-m", "unshard", *args, "--no-progress"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    events, pending = [], {}
    for line in log.read_text().splitlines():
        found = CALL.match(line)
        if not found:
            continue
        pid, resumed, started, rest = found.groups()
        if started and rest.endswith("<unfinished ...>"):  # (another thread's call came between)
            pending[pid] = (started, rest)
            continue
        call, text = (resumed, pending.pop(pid, (resumed, ""))[1] + rest) if resumed else (started, rest)
        if "= -1" not in text:
            events.append((call, re.findall(r'<([^<>]+)>|"([^"]+)"', text)))
    return [(call, [a or b for a, b in paths]) for call, paths in events]


def staging_of(events, out: Path) -> Path:
    """The staging folder the run wrote OUT in (beside it, `.OUT.unshard-partial-...`)."""
    mark = f".{out.name}.unshard-partial-"
    part = next(part for _, paths in events for p in paths for part in Path(p).parts if part.startswith(mark))
    return out.parent / part


def synced_before(events, place: Path, staged: Path) -> tuple[set[str], int]:
    """(what was synced before the call that put `staged` at `place`, that call's index)."""
    moved = next(
        i
        for i, (call, paths) in enumerate(events)
        if call.startswith(("rename", "link")) and str(place) in paths and str(staged) in paths
    )
    return {paths[0] for call, paths in events[:moved] if call in SYNCS}, moved


def test_a_folder_is_on_the_disk_before_it_is_out(tmp_path):
    out = tmp_path / "out"
    events = traced(tmp_path, "convert", str(SHIPPED / "llama-fsdp2" / "global_step_1"), str(out))
    staging = staging_of(events, out)
    synced, moved = synced_before(events, out, staging)
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert {"model.safetensors", "config.json", "README.md"} <= {str(f) for f in files}
    for name in files:
        assert str(staging / name) in synced, f"{name} was not synced before the staging folder became OUT"
    assert str(staging) in synced, "the staging folder was not synced before it became OUT"
    after = [paths[0] for call, paths in events[moved + 1 :] if call in SYNCS]
    assert str(out.parent) in after, "OUT's parent folder was not synced after OUT appeared in it"


def test_a_gguf_file_is_on_the_disk_before_it_is_out(tmp_path):
    pytest.importorskip("gguf")
    out = tmp_path / "model.gguf"
    events = traced(tmp_path, "convert", str(SHIPPED / "llama-fsdp2-spm" / "global_step_1"), str(out))
    staged = staging_of(events, out) / "model.gguf"
    synced, moved = synced_before(events, out, staged)
    assert str(staged) in synced, "the GGUF file was not synced before it was linked as OUT"
    after = [paths[0] for call, paths in events[moved + 1 :] if call in SYNCS]
    assert str(out.parent) in after, "OUT's parent folder was not synced after OUT appeared in it"


def test_overwrite_syncs_the_replacement_and_no_sync_syncs_nothing(tmp_path):
    src = str(SHIPPED / "llama-fsdp2" / "global_step_1")
    out = tmp_path / "out"
    traced(tmp_path, "convert", src, str(out))
    events = traced(tmp_path, "convert", src, str(out), "--overwrite")
    staging = staging_of(events, out)
    synced, moved = synced_before(events, out, staging)
    assert str(staging / "model.safetensors") in synced and str(staging) in synced
    assert str(out.parent) in [paths[0] for call, paths in events[moved + 1 :] if call in SYNCS]

    scratch = tmp_path / "scratch"
    events = traced(tmp_path, "convert", src, str(scratch), "--no-sync")
    assert not [paths for call, paths in events if call in SYNCS and str(tmp_path) in paths[0]]
    assert "written with --no-sync" in (scratch / "README.md").read_text()

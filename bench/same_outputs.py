"""Whether two checkouts of unshard write the same bytes: every unshard command the bench times (run.tools), on
the bench's own checkpoints (run.make_checkpoint), run once with this checkout and once with OTHER, and the sha256
of every file each writes compared. What a refactoring must leave unchanged.

    python bench/same_outputs.py OTHER_CHECKOUT [--sizes 0.1] [--layouts verl,dcp,...] [--work DIR]

Prints one line per command (same, or the files that differ) and exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import run

LAYOUTS = "verl,verl-tp,dcp,zero2,zero3,megatron,megatron-dist,merge,slices,extract-lora,moe,search,quantize,gguf"


def digests(out: Path) -> dict[str, str]:
    """sha256 of every file written in OUT (the bench's GGUF files are OUT/model.gguf)."""
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


def written_by(checkout: Path, cmd: list[str], out: Path) -> dict[str, str]:
    """What `cmd` (run with `checkout`'s unshard first on PYTHONPATH) writes in OUT, as digests; a failed run, the
    end of what it said."""
    shutil.rmtree(out, ignore_errors=True)
    if not (checkout / "src" / "unshard" / "families").is_dir():  # (before the family registry: its tables' home)
        forget = "from unshard.names import dense_families; dense_families.FAMILIES.clear(); "
        cmd = [part.replace("from unshard import families; families.TENSOR_TABLES.clear(); ", forget) for part in cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(checkout / "src")})
    if done.returncode:
        return {"FAILED": done.stderr[-300:]}
    return digests(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("other", type=Path, help="the other checkout (its src/ is put first on PYTHONPATH)")
    ap.add_argument("--sizes", default="0.1")
    ap.add_argument("--layouts", default=LAYOUTS)
    ap.add_argument("--work", type=Path, default=Path("/tmp/unshard-same-outputs"))
    args = ap.parse_args()
    this = run.ROOT
    args.work.mkdir(parents=True, exist_ok=True)
    differ = 0
    for layout in args.layouts.split(","):
        for gb in [float(s) for s in args.sizes.split(",")]:
            folder = run.make_checkpoint(args.work, layout, gb)
            out = args.work / "out"
            commands = run.tools(layout, folder, out, args.work / "unshard-cache")
            for name, cmd in commands.items():
                if not name.startswith("unshard"):
                    continue
                ours, theirs = written_by(this, cmd, out), written_by(args.other.resolve(), cmd, out)
                if ours == theirs and "FAILED" not in ours:
                    print(f"{layout} {gb} GB {name}: same {len(ours)} file(s)", flush=True)
                    continue
                differ += 1
                files = sorted(f for f in set(ours) | set(theirs) if ours.get(f) != theirs.get(f))
                print(f"{layout} {gb} GB {name}: DIFFERS in {files}", flush=True)
    shutil.rmtree(args.work / "out", ignore_errors=True)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()

"""A block-FP8 release (DeepSeek-V3/R1's, Kimi K2's, Qwen3 FP8's layout) to bf16, against copying its bytes.

    python bench/fp8.py [--work /tmp/unshard-bench] [--sizes 1,2] [--repeat 3]

Each size is a Qwen3 of that many GB of FP8 weights (hidden 2048, FFN 8192, 16 layers a GB), saved by transformers
and stored in DeepSeek's block layout with 128 x 128 blocks by tests/fixtures/make_fp8_release.py. DeepSeek's own
fp8_cast_bf16.py dequantizes with a Triton kernel on a GPU, so it does not run here; the floor is `cp -r` of the
release (half the bytes unshard writes, since bf16 is twice FP8). Times, taking turns: `cp -r`, and
`unshard convert RELEASE OUT` (every FP8 weight dequantized as weight_dequant computes it, a band of 128-row blocks
at a time, written in bf16). Prints a markdown table and appends the rows to bench/results/results.jsonl.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import record, short_table, side_by_side  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/unshard-bench")
    ap.add_argument("--sizes", default="1")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(args.work)
    rows = []
    for gb in args.sizes.split(","):
        folder = work / f"fp8-{float(gb)}gb"
        if not (folder / "done").exists():
            shutil.rmtree(folder, ignore_errors=True)
            size = ["--block", "128", "--hidden", "2048", "--ffn", "8192", "--vocab", "32000"]
            size += ["--layers", str(round(16 * float(gb)))]
            script = HERE.parent / "tests" / "fixtures" / "make_fp8_release.py"
            subprocess.run([sys.executable, str(script), str(folder), *size], check=True, stdout=subprocess.DEVNULL)
            shutil.rmtree(folder / "reference")  # (the bf16 model it came from: not needed here)
            (folder / "done").write_text("")
        release, out = folder / "release", work / "out-fp8"
        tools = {
            "cp -r": ["cp", "-r", str(release), str(out)],
            "unshard": [sys.executable, "-m", "unshard", "convert", str(release), str(out), "--no-progress"],
        }
        runs = side_by_side(tools, args.repeat, [out])
        size = sum(p.stat().st_size for p in release.rglob("*") if p.is_file())
        rows += record("fp8-release", size / 1e9, runs)
        shutil.rmtree(out, ignore_errors=True)
    print(short_table(rows))


if __name__ == "__main__":
    main()

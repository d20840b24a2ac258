"""A checkpoint in S3 against the same checkpoint on the local disk, side by side in one run.

    python bench/remote.py [--work /tmp/unshard-bench] [--sizes 1,3] [--repeat 3]

Uses bench/run.py's DCP checkpoints (made by it with `--layouts dcp`, FSDP2 through torch.distributed.checkpoint),
uploads each to a local S3 server on 127.0.0.1 and times, taking turns (no network: what is measured is the S3
protocol and the client's requests, not a WAN's bandwidth). The server is s3rver (npm, kept in
~/.cache/unshard/s3rver), which serves objects from its disk; moto's server, which the tests use, copies the whole
object for every range asked (0.45 s a 16 MB range of a 0.5 GB object), so it would measure moto:
  unshard, local          unshard convert from the local folder
  unshard, s3://          unshard convert s3://bench/dcp-N: the model's chunks fetched in 16 MB ranges, 8 at a time
  download, then unshard  what users do today: the whole prefix downloaded (s3fs `get`, as `aws s3 cp --recursive`),
                          then converted locally
Prints a markdown table (median wall seconds and range, peak RSS of the timed process tree; the server's own
memory is not counted) and appends the rows to bench/results/results.jsonl.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import record, short_table, side_by_side  # noqa: E402


def s3rver(data: Path) -> tuple[subprocess.Popen, str]:
    """s3rver (installed from npm the first time) serving `data` on a free port of 127.0.0.1."""
    home = Path.home() / ".cache" / "unshard" / "s3rver"
    program = home / "node_modules" / ".bin" / "s3rver"
    if not program.exists():
        home.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--silent", "--prefix", str(home), "s3rver@3.7.1"], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    server = subprocess.Popen([str(program), "-d", str(data), "-p", str(port), "--silent"], stdout=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"http://127.0.0.1:{port}"
        time.sleep(0.1)
    sys.exit("s3rver did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/unshard-bench")
    ap.add_argument("--sizes", default="1")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(args.work)

    server, endpoint = s3rver(work / "s3rver-data")
    os.environ.update(
        AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER", AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint, AWS_EC2_METADATA_DISABLED="true",
    )  # fmt: skip
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.mkdir("bench")
    rows = []
    for gb in args.sizes.split(","):
        folder = work / f"dcp-{float(gb)}gb"
        if not (folder / "done").exists():
            sys.exit(f"{folder}: make it first: python bench/run.py --layouts dcp --sizes {gb}")
        src, config = folder / "ckpt", ["--config-from", str(folder / "hf")]
        fs.put(str(src), f"bench/dcp-{gb}", recursive=True)
        out = work / "out-remote"
        download = f"""
import s3fs, subprocess, sys
s3fs.S3FileSystem().get("bench/dcp-{gb}", "{work / "downloaded"}", recursive=True)
sys.exit(subprocess.call([sys.executable, "-m", "unshard", "convert", "{work / "downloaded"}", "{out}",
                          "--no-progress", "--dtype", "float32", *{config!r}]))
"""
        unshard = [sys.executable, "-m", "unshard", "convert"]
        flags = [str(out), "--no-progress", "--dtype", "float32", *config]
        tools = {
            "unshard, local": [*unshard, str(src), *flags],
            "unshard, s3://": [*unshard, f"s3://bench/dcp-{gb}", *flags],
            "download, then unshard": [sys.executable, "-c", download],
        }
        runs = side_by_side(tools, args.repeat, [out, work / "downloaded"])
        size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        rows += record("s3-dcp", size / 1e9, runs)
    server.terminate()
    shutil.rmtree(work / "s3rver-data", ignore_errors=True)
    print(short_table(rows))


if __name__ == "__main__":
    main()

"""Run one command; print its wall time and the peak RSS of its whole process tree as JSON.

    python bench/timed.py -- CMD ARGS...

The time ends when the command exits (a thread waits for it), not at the next sample. Peak RSS is
sampled every 20 ms over the tree (psutil) and also read from the kernel's RUSAGE_CHILDREN (the
largest single process), and the larger is reported.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time

import psutil


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def main() -> None:
    cmd = sys.argv[sys.argv.index("--") + 1 :]
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watched, peak = psutil.Process(child.pid), 0  # (before anything reaps it)
    ended = threading.Event()
    end = start

    def wait() -> None:
        nonlocal end
        child.wait()
        end = time.perf_counter()
        ended.set()

    # (stderr read as it comes, its end kept: a command that logs more than a pipe holds, as llama-quantize does on a
    # 6 GB model, would otherwise wait on its pipe forever)
    tail = bytearray()

    def drain() -> None:
        for chunk in iter(lambda: child.stderr.read1(65536), b""):
            tail.extend(chunk)
            del tail[:-4000]

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    threading.Thread(target=wait, daemon=True).start()
    while not ended.wait(0.02):
        try:
            peak = max(peak, tree_rss(watched))
        except psutil.Error:
            pass
    seconds = end - start
    kernel_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    reader.join()
    err = tail.decode(errors="replace")
    print(
        json.dumps(
            {
                "seconds": seconds,
                "peak_rss": max(peak, kernel_peak),
                "returncode": child.returncode,
                "stderr": err[-2000:] if child.returncode else "",
            }
        )
    )


if __name__ == "__main__":
    main()

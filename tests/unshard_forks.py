"""`python -m unshard ARGS...` for the tests, each run a fork of one process that has imported torch already.

The suite runs unshard's command line some thousand times (the fuzz campaigns, every refusal's one line), and a
fresh interpreter imports torch again for most of them: about 2 s of a core each. A run here is still a process of
its own, as a user's is (its exit code, a death by a signal, a hang cut by the timeout, its standard output and error
apart, nothing it leaves in memory seen by the next), and still runs `unshard/__main__.py` from the start; only
torch's and safetensors' imports are done once. Nothing else is imported beforehand, so whatever reads the
environment at import time (huggingface_hub, transformers) reads each run's own.

Tests that check what a run imports start a plain interpreter instead (conftest.convert_in_subprocess).

    python unshard_forks.py < jobs
    job, one JSON line:   {"argv": [...], "cwd": DIR, "env": {...}, "stdout": FILE, "stderr": FILE, "timeout": S}
    reply, one JSON line: {"returncode": CODE (or -SIGNAL), "timed_out": true or false}
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run_as_main(job: dict) -> int:
    """In the fork: what `python -m unshard` does, then the interpreter's own exit (threads joined, atexit's
    functions run, streams flushed); its exit code."""
    import atexit
    import runpy
    import tempfile

    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    tempfile.tempdir = None  # (found again from this run's TMPDIR)
    streams = {0: (os.devnull, os.O_RDONLY), 1: (job["stdout"], os.O_WRONLY), 2: (job["stderr"], os.O_WRONLY)}
    for fd, (path, flags) in streams.items():
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = list(job["argv"])  # (runpy puts the module's file in place of the first, as -m does)
    sys.path[0] = os.getcwd()  # (as -m puts the working folder first, not this file's)
    code = 0
    try:
        runpy.run_module("unshard", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # (the interpreter prints any other exit value and exits 1)
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code


def serve() -> None:
    import safetensors.torch  # noqa: F401  (the imports each run shares)
    import torch  # noqa: F401

    replies = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os._exit(_run_as_main(job))
        ended = os.pidfd_open(pid)
        finished = select.select([ended], [], [], job["timeout"])[0]
        os.close(ended)
        if not finished:
            os.kill(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
        code = os.waitstatus_to_exitcode(status)
        replies.write(json.dumps({"returncode": code, "timed_out": not finished}) + "\n")
        replies.flush()


class Forks:
    """The tests' side: one server per test process, started by the first run (and again if it died)."""

    def __init__(self) -> None:
        self._server: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def run(self, args, cwd=None, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
        """As subprocess.run([python, "-m", "unshard", *args], capture_output=True, text=True, ...) gives it."""
        import tempfile

        args = [str(a) for a in args]
        with self._lock, tempfile.TemporaryDirectory() as scratch:
            out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
            out.touch(), err.touch()
            job = {
                "argv": ["unshard", *args],
                "cwd": str(cwd or os.getcwd()),
                "env": dict(os.environ if env is None else env),
                "stdout": str(out),
                "stderr": str(err),
                "timeout": timeout,
            }
            if self._server is None or self._server.poll() is not None:
                server = [sys.executable, str(HERE / "unshard_forks.py")]
                self._server = subprocess.Popen(server, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self._server.stdin.write(json.dumps(job) + "\n")
            self._server.stdin.flush()
            reply = json.loads(self._server.stdout.readline())
            command = [sys.executable, "-m", "unshard", *args]
            if reply["timed_out"]:
                raise subprocess.TimeoutExpired(command, timeout, out.read_text(), err.read_text())
            return subprocess.CompletedProcess(command, reply["returncode"], out.read_text(), err.read_text())


_FORKS = Forks()


def run_unshard(*args, cwd=None, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m unshard ARGS...` as subprocess.run runs it (capture_output=True, text=True), forked (Forks)."""
    return _FORKS.run(args, cwd=cwd, env=env, timeout=timeout)


if __name__ == "__main__":
    serve()

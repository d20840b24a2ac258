"""The `unshard` command: arguments in (arguments.py), the command's handler (commands.py), one line out.
Errors are one line unless --debug."""

from __future__ import annotations

import logging
import os
import signal
import sys

from ..errors import PeerFailedError, UnshardError
from ..sinks.safetensors import ROOM_ERRNOS
from .arguments import parser
from .commands import COMMANDS


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for chatty in ("httpx", "httpx2"):  # huggingface_hub's HTTP client logs every request at INFO
        logging.getLogger(chatty).setLevel(logging.WARNING)
    # A job scheduler (or torchrun, when another rank failed) stops us with SIGTERM: unwind like
    # Ctrl-C, so the staging folder is removed and no partial OUT is left.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if repo_id := getattr(args, "push_to_hub", None):
            from ..hub import check_repo_id

            check_repo_id(repo_id)
        return COMMANDS[args.command](args)
    except PeerFailedError:  # rank 0 prints why
        return 1
    except (UnshardError, FileNotFoundError, PermissionError) as e:
        if args.debug:
            raise
        print(f"unshard: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("unshard: interrupted; nothing was written to the output", file=sys.stderr)
        return 130
    except BrokenPipeError:  # (`unshard families | head` read what it wanted)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a bug, not bad input: still one line, the traceback with --debug
        if args.debug:
            raise
        if isinstance(e, OSError) and e.errno in ROOM_ERRNOS:  # (weights' writes say which file themselves)
            print(
                f"unshard: error: {e.filename or 'the output'}: {e.strerror}; nothing was written to the output: "
                "free space on that disk (or raise the file size limit, ulimit -f) and run again",
                file=sys.stderr,
            )
            return 1
        print(f"unshard: internal error: {type(e).__name__}: {e}; rerun with --debug and report it", file=sys.stderr)
        return 2


def run() -> None:
    """The program: `main`, then exit without Python's teardown.

    Everything unshard leaves behind is written and closed when `main` returns; what the teardown
    would do then is unregister torch's operator libraries, a third of a second of every run.
    """
    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # `unshard inspect | head` read what it wanted
            pass
    os._exit(code)


def _interrupt(signum, frame):
    raise KeyboardInterrupt

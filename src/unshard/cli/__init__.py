"""The `unshard` command: arguments in (arguments.py), the command's handler (commands.py), one line out.
Errors are one line unless --debug."""

from __future__ import annotations

import logging
import os
import signal
import sys

from ..errors import PeerFailedError, UnshardError
from ..sinks.safetensors import ROOM_ERRNOS
from ..sources.remote import is_url, remove_mirrors, shown
from .arguments import parser
from .commands import COMMANDS


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    # huggingface_hub's HTTP client logs every request at INFO, botocore where it found credentials
    for chatty in ("httpx", "httpx2", "botocore", "aiobotocore", "s3fs"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    if getattr(args, "progress", None) is False:  # (--no-progress: every bar, also those of libraries, off)
        os.environ["TQDM_DISABLE"] = "1"
    # A job scheduler (or torchrun, when another rank failed) stops us with SIGTERM: unwind like
    # Ctrl-C, so the staging folder is removed and no partial OUT is left.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if is_url(out := getattr(args, "out", None)):
            raise UnshardError(
                f"{out}: unshard writes OUT to a local disk; write it there and upload it (aws s3 cp --recursive, "
                "gcloud storage cp -r), or put it on the Hub with --push-to-hub"
            )
        if repo_id := getattr(args, "push_to_hub", None):
            from ..hub import check_repo_id

            check_repo_id(repo_id)
        return COMMANDS[args.command](args)
    except PeerFailedError:  # rank 0 prints why
        return 1
    except (UnshardError, FileNotFoundError, PermissionError) as e:
        if args.debug:
            raise
        print(f"unshard: error: {shown(str(e))}", file=sys.stderr)
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
    remove_mirrors()  # (a checkpoint read from object storage: its local copy)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # `unshard inspect | head` read what it wanted
            pass
    os._exit(code)


def _interrupt(signum, frame):
    raise KeyboardInterrupt

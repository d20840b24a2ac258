"""Checkpoints in object storage (`s3://`, `gs://`, `az://`, `hf://`, any URL fsspec knows) as sources.

The readers work on local files (memory maps, kernel copies), so a remote checkpoint is mirrored first into a local
folder of the same tree, holding only the bytes a conversion reads: every file whole (configs, tokenizers, `.metadata`,
`latest`, weight files...) but the `.distcp` files of a DCP folder (torchtitan, torchtune,
accelerate, Megatron's torch_dist) only the byte ranges of the model's chunks, so an optimizer saved beside the model
is never downloaded. Files no reader reads (optimizer and scheduler states, RNG states, a trainer's data loader) are
skipped by name. The rest lie as holes of sparse files. The ranges are fetched in parallel, 16 MB at a time, and the
mirror (under TMPDIR) is removed when the process ends.

Credentials, endpoints and regions are the storage library's own (for S3, s3fs and botocore: AWS_ACCESS_KEY_ID,
AWS_PROFILE, AWS_ENDPOINT_URL...); fsspec and the protocol's package (s3fs, gcsfs, adlfs, huggingface_hub) are
imported only for a URL (`pip install 'unshard[remote]'`).
"""

from __future__ import annotations

import atexit
import fnmatch
import json
import os
import re
import shutil
import struct
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import CheckpointError
from ..units import human_bytes

URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
PART = 16 << 20  # bytes a range request asks at most
THREADS = 8
# Files no reader reads, by name: trainers' optimizer, scheduler, RNG and data loader states
NOT_READ = (
    "optim_world_size_*",
    "extra_state_world_size_*",
    "optimizer.pt",
    "optimizer.bin",
    "scheduler.pt",
    "rng_state*.pth",
    "data.pt",
    "training_args.bin",
)
NOT_READ_FOLDERS = ("optimizer", "optimizer_*", "optim")


def is_url(src) -> bool:
    return isinstance(src, str) and bool(URL.match(src))


# mirror folder -> its URL, for what unshard shows (errors, the model card, inspect): the URL, not the mirror
MIRRORS: dict[str, str] = {}


def remove_mirrors() -> None:
    """The mirrors made, removed (at exit; the CLI, which exits without Python's teardown, calls it itself)."""
    for local in list(MIRRORS):
        shutil.rmtree(local, ignore_errors=True)
        del MIRRORS[local]


def shown(text: str) -> str:
    """`text` with each mirror's path said as the URL it mirrors."""
    for local, url in MIRRORS.items():
        text = text.replace(local, url)
    return text


@dataclass
class Fetched:
    """What mirroring read: the bytes and requests, against the remote tree's size; and, of each file read in part
    (a DCP folder's .distcp files), the ranges read."""

    url: str
    local: Path
    read: int
    total: int
    requests: int
    partial: dict[Path, list[tuple[int, int]]]

    def fact(self) -> str:
        return f"{self.url}: read {human_bytes(self.read)} of {human_bytes(self.total)} in {self.requests} request(s)"

    def check_covered(self, checkpoint) -> None:
        """Every piece the checkpoint will read from a file read in part lies in ranges that were read: a hole of a
        sparse file reads as zeros, which must never pass for weights."""
        for tensor in checkpoint.tensors.values():
            for piece in tensor.pieces:
                if piece.file not in self.partial:
                    continue
                start, length = checkpoint.archive_of(piece)
                if (at := checkpoint.file_offset(piece)) is not None:  # (a raw chunk: where the file's header says)
                    start, length = at, piece.block.numel * tensor.dtype.itemsize
                if length is None or not any(a <= start and start + length <= b for a, b in self.partial[piece.file]):
                    raise CheckpointError(
                        f"{shown(str(piece.file))}: the bytes of {tensor.name} were not read from the storage; "
                        "this layout is not read from object storage yet: copy the checkpoint to a local disk"
                    )


def mirrored(url: str) -> Fetched:
    """A local folder (or file) holding what a conversion reads of the checkpoint at `url`."""
    fs, root = _filesystem(url)
    files = _listing(fs, root, url)
    if not MIRRORS:
        atexit.register(remove_mirrors)
    local = Path(tempfile.mkdtemp(prefix="unshard-remote-"))
    single = list(files) == [root]
    ranges: list[tuple[str, Path, int, int]] = []
    for remote, size in files.items():
        relative = PurePosixPath(remote).name if single else PurePosixPath(remote).relative_to(root)
        if _not_read(relative) or remote.endswith(".distcp"):
            continue
        path = local / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(size)
        ranges += [(remote, path, start, min(size, start + PART)) for start in range(0, size, PART)]
    MIRRORS[str(local)] = url.rstrip("/").rsplit("/", 1)[0] if single else url.rstrip("/")
    requests, read = _fetch(fs, ranges, url, "files")
    chunks, probes = _model_chunks(fs, files, root, local)
    more, more_read = _fetch(fs, chunks, url, "model chunks")
    partial: dict[Path, list[tuple[int, int]]] = {}
    for _, path, start, end in chunks:
        partial.setdefault(path, []).append((start, end))
    partial = {path: _joined(spans) for path, spans in partial.items()}
    where = local / PurePosixPath(root).name if single else local
    return Fetched(url, where, read + more_read, sum(files.values()), requests + probes + more, partial)


def _filesystem(url: str):
    try:
        import fsspec
    except ImportError:
        raise CheckpointError(f"{url}: reading object storage needs fsspec: pip install 'unshard[remote]'") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        protocol = url.split("://", 1)[0]
        package = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}.get(protocol, protocol)
        raise CheckpointError(f"{url}: {e}; install the storage's fsspec package (pip install {package})") from None


def _failed(url: str, e: Exception) -> CheckpointError:
    """One line for what the storage said: no such bucket or prefix, credentials missing or refused, no network."""
    name = type(e).__name__
    if isinstance(e, FileNotFoundError) or "NoSuchBucket" in name:
        return CheckpointError(f"{url}: not found ({e}); check the bucket and the path")
    if isinstance(e, PermissionError) or "Credentials" in name or "AccessDenied" in str(e):
        return CheckpointError(
            f"{url}: the storage refused the credentials ({name}: {e}); set them as the storage's library reads them "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE for S3, gcloud auth for GCS)"
        )
    return CheckpointError(f"{url}: reading it failed ({name}: {e}); check the address and the network")


def _listing(fs, root: str, url: str) -> dict[str, int]:
    """Every file under `root` (or `root` itself, a file) with its size."""
    try:  # (a file's find is itself; asking isfile first costs S3 a HEAD retried with backoff for a prefix)
        found = fs.find(root, detail=True)
    except Exception as e:  # (each storage library raises its own kinds)
        raise _failed(url, e) from None
    files = {path: int(info.get("size") or 0) for path, info in found.items() if info.get("type", "file") == "file"}
    if not files:
        raise CheckpointError(f"{url}: nothing here; check the bucket and the path")
    return files


def _not_read(relative: PurePosixPath) -> bool:
    return any(fnmatch.fnmatch(relative.name, p) for p in NOT_READ) or any(
        fnmatch.fnmatch(part, p) for part in relative.parts[:-1] for p in NOT_READ_FOLDERS
    )


def _model_chunks(fs, files: dict[str, int], root: str, local: Path):
    """The byte ranges of the model's chunks in each DCP folder's .distcp files (its .metadata already mirrored), the
    files made as sparse as their size; and how many requests telling the files' formats apart took. A chunk lies
    where .metadata says in a torch.save-format file (the default), and where the file's own header says in a
    safetensors-format one (its header is read, and the model's tensors' ranges taken from it)."""
    from . import dcp

    ranges, probes = [], 0
    for found in local.rglob(".metadata"):
        folder = found.parent
        metadata = dcp.read_metadata(folder)
        chunks, model = dcp.storage_index(metadata), set(dcp.model_names(metadata)[0])
        remote_folder = f"{root}/{folder.relative_to(local).as_posix()}".rstrip("/.")
        spans: dict[str, list[tuple[int, int]]] = {}
        for (fqn, _), info in chunks.items():
            if fqn in model and f"{remote_folder}/{info.relative_path}" in files:
                spans.setdefault(info.relative_path, []).append((info.offset, info.offset + info.length))
        for name in {info.relative_path for info in chunks.values()}:
            remote = f"{remote_folder}/{name}"
            if remote not in files:
                continue  # (the reader says which file is missing)
            with open(folder / name, "wb") as f:
                f.truncate(files[remote])
            header = _safetensors_header(fs, remote, files[remote])
            probes += 1 if header is None else 2
            if header is not None:  # SerializationFormat.SAFETENSORS
                begin, entries = header
                ranges.append((remote, folder / name, 0, begin))
                spans[name] = [
                    (begin + entry["data_offsets"][0], begin + entry["data_offsets"][1])
                    for key, entry in entries.items()
                    if key in model
                ]
        for name, found in spans.items():
            for start, end in _joined(found):  # (chunks one after another: one request, up to PART bytes)
                ranges += [
                    (f"{remote_folder}/{name}", folder / name, s, min(end, s + PART)) for s in range(start, end, PART)
                ]
    return ranges, probes


def _safetensors_header(fs, remote: str, size: int) -> tuple[int, dict] | None:
    """(where the data begins, the header's entries) of a file in safetensors' format; None for another format."""
    try:
        head = fs.cat_file(remote, start=0, end=min(9, size))
        if len(head) < 9 or head[8:9] != b"{":
            return None
        length = struct.unpack("<Q", head[:8])[0]
        if 8 + length > size:
            raise CheckpointError(f"{remote}: its safetensors header runs past the file's end; the file is damaged")
        entries = json.loads(fs.cat_file(remote, start=8, end=8 + length))
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(f"{remote}: its safetensors header does not read ({e}); the file is damaged") from None
    except Exception as e:
        raise _failed(remote, e) from None
    return 8 + length, {key: entry for key, entry in entries.items() if key != "__metadata__"}


def _joined(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Byte ranges with those that touch or overlap made one."""
    joined: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(end, joined[-1][1]))
        else:
            joined.append((start, end))
    return joined


def _fetch(fs, ranges: list[tuple[str, Path, int, int]], url: str, what: str) -> tuple[int, int]:
    """Each range's bytes written where they lie in the local file, THREADS requests at a time: (requests, bytes).
    The progress bar shows on a terminal, unless --no-progress (TQDM_DISABLE)."""
    from tqdm import tqdm

    ranges = sorted(set(ranges), key=lambda r: (str(r[1]), r[2]))

    def one(job) -> int:
        remote, path, start, end = job
        data = fs.cat_file(remote, start=start, end=end)
        if len(data) != end - start:
            raise CheckpointError(f"{url}: {remote} gave {len(data)} bytes at {start}, not {end - start}")
        descriptor = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(descriptor, data, start)
        finally:
            os.close(descriptor)
        return len(data)

    total = sum(end - start for _, _, start, end in ranges)
    with (
        tqdm(total=total, desc=f"reading {what}", unit="B", unit_scale=True, disable=None, leave=False) as bar,
        ThreadPoolExecutor(THREADS) as pool,
    ):
        try:
            for done in pool.map(one, ranges):
                bar.update(done)
        except CheckpointError:
            raise
        except Exception as e:
            raise _failed(url, e) from None
    return len(ranges), total

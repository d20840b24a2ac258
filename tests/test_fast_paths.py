"""The shortcuts that keep fixed costs down give the same answers as the long way round:
transformers' answers remembered across runs (known.py), rank files and DCP chunks read without
importing torch (torch_archives' stand-ins), DCP's .metadata read without importing torch (dcp.py's
stand-ins). A same-dtype conversion then never imports torch: over a second saved on every run."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import SHIPPED, convert_in_subprocess

import unshard


def folder_bytes(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "README.md"}


def test_second_conversion_of_a_model_does_not_import_transformers(tmp_path):
    src = tmp_path / "ckpt"
    shutil.copytree(SHIPPED / "llama-fsdp2" / "global_step_1", src)
    cache = tmp_path / "cache"
    # (Llama's tensors are listed in the families' tensor tables: without it, as for any model not listed.)
    transformers_used, torch_imported = convert_in_subprocess(src, tmp_path / "first", cache, table=False)
    assert transformers_used and torch_imported and sorted(p.name for p in cache.iterdir()) == ["folders", "models"]
    transformers_used, torch_imported = convert_in_subprocess(src, tmp_path / "second", cache, table=False)
    assert not transformers_used and not torch_imported  # bytes copied file to file, planned without torch
    assert folder_bytes(tmp_path / "first") == folder_bytes(tmp_path / "second")

    # Another config is another question: asked again, not answered from the cache.
    config = json.loads((src / "actor" / "huggingface" / "config.json").read_text())
    (src / "actor" / "huggingface" / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    assert convert_in_subprocess(src, tmp_path / "third", cache, table=False)[0]

    # A damaged entry is a miss, not an error.
    for entry in (cache / "models").iterdir():
        entry.write_text("{not json")
    transformers_used, _ = convert_in_subprocess(src, tmp_path / "fourth", cache, table=False)
    assert transformers_used
    assert (tmp_path / "fourth" / "model.safetensors").read_bytes() == (
        tmp_path / "first" / "model.safetensors"
    ).read_bytes()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("case, names_change", [("llama-fsdp2", False), ("mixtral-fsdp2", True)])
def test_first_conversion_writes_while_transformers_answers(tmp_path, monkeypatch, case, names_change, workers):
    """A config transformers has not answered for is asked on a thread while the weights are written
    under the names as saved (with several writer processes, before they are forked). Where transformers
    names them otherwise (transformers >= 5 fuses Mixtral's experts in memory and saves them one by one),
    the folder is written again from the answer. Either way the folder is the one a conversion with the
    answer known from the start writes."""
    from unshard import families
    from unshard.names import hf_names
    from unshard.write import execute

    monkeypatch.setenv("UNSHARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hf_names, "_answers", {})
    monkeypatch.setattr(families, "TENSOR_TABLES", {})  # (Llama's tensors are listed there: ask, as for others)
    src = SHIPPED / case / "global_step_1"
    first = unshard.plan(src, ask_later=True, max_shard_size="60KB")
    assert first.question is not None and len(first.files) > 1  # planned before the answer, which may come any time
    written_as_saved = {o.name for o in first.outputs}
    result = execute.convert(first, tmp_path / "first", progress=False, workers=workers)
    assert result.writers == workers

    second = unshard.plan(src, ask_later=True, max_shard_size="60KB")
    assert second.question is None  # answered from the cache: planned with the answer
    execute.convert(second, tmp_path / "second", progress=False)
    assert folder_bytes(tmp_path / "first") == folder_bytes(tmp_path / "second")
    assert result.tensors == len(second.outputs)
    assert (written_as_saved != {o.name for o in second.outputs}) == names_change
    if names_change:
        assert any("gate_up_proj" in n for n in written_as_saved)


def test_answer_that_the_checkpoint_does_not_fit_stops_the_writing(tmp_path, monkeypatch):
    """When transformers' answer comes in during the writing and the checkpoint does not fit the config,
    no further tensor is started, and nothing is left behind."""
    from unshard.names import hf_names
    from unshard.sinks import safetensors as writer
    from unshard.write import execute

    src = tmp_path / "ckpt"
    shutil.copytree(SHIPPED / "llama-fsdp2" / "global_step_1", src)
    config_path = src / "actor" / "huggingface" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "intermediate_size": 128}))
    monkeypatch.setenv("UNSHARD_CACHE", str(tmp_path / "cache"))  # (another test may have asked about this config)
    monkeypatch.setattr(hf_names, "_answers", {})
    first_written, real_ask = threading.Event(), hf_names._ask
    monkeypatch.setattr(hf_names, "_ask", lambda *args: first_written.wait(60) and real_ask(*args))
    written = []
    real_write = writer.SafetensorsFile.write_parts

    def write_parts(self, name, *args):
        written.append(name)
        real_write(self, name, *args)
        first_written.set()
        while not plan.question.answered():
            time.sleep(0.01)

    monkeypatch.setattr(writer.SafetensorsFile, "write_parts", write_parts)
    plan = unshard.plan(src, ask_later=True)
    with pytest.raises(unshard.ConfigMismatchError, match="does not fit this config"):
        execute.convert(plan, tmp_path / "out", progress=False, threads=1)
    assert len(written) == 1 < len(plan.outputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "ckpt"]


def torch_loader_only(*args, **kwargs):
    """In place of torch_archives.read: every file is left to torch's own loader."""
    from unshard.sources import torch_archives

    raise torch_archives.NotPlain("this test reads with torch's loader")


def test_dtensor_stand_ins_read_as_the_real_classes(tmp_path, monkeypatch):
    """The 2-D mesh fixture (_StridedShard + Shard on dp x tp) opened with torch_archives' stand-ins
    (a fresh process, without torch) and by torch's own loader with its DTensor classes (imported
    first) gives the same pieces."""
    import torch.distributed.tensor  # noqa: F401  (this process reads with the real classes)

    from unshard import open_checkpoint
    from unshard.sources import torch_archives

    monkeypatch.setattr(torch_archives, "read", torch_loader_only)

    src = SHIPPED / "llama-fsdp2-tp" / "global_step_1"
    describe = textwrap.dedent("""
        import sys
        from unshard import open_checkpoint
        ckpt = open_checkpoint(sys.argv[1])
        print(repr(sorted((n, t.shape, str(t.dtype), t.pieces) for n, t in ckpt.tensors.items())))
        print(repr(ckpt.facts["sharding"]))
        print("torch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", describe, str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    pieces, sharding, imported = done.stdout.splitlines()
    assert imported == "False"
    ckpt = open_checkpoint(src)
    assert pieces == repr(sorted((n, t.shape, str(t.dtype), t.pieces) for n, t in ckpt.tensors.items()))
    assert sharding == repr(ckpt.facts["sharding"])
    assert "_S(0, 2)" in sharding  # the strided placement was read, not taken for a whole tensor


def describe_dcp_metadata(metadata) -> list:
    """What unshard reads from a DCP `.metadata`: every tensor's size, dtype and chunks, and where
    each chunk's bytes are."""
    tensors = sorted(
        (
            fqn,
            tuple(md.size),
            str(md.properties.dtype).removeprefix("torch."),
            [(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks],
        )
        for fqn, md in metadata.state_dict_metadata.items()
        if hasattr(md, "chunks")
    )
    places = sorted(
        (
            index.fqn,
            tuple(index.offset or ()),
            info.relative_path,
            info.offset,
            info.length,
            getattr(info, "transform_descriptors", None),
        )
        for index, info in metadata.storage_data.items()
    )
    return [tensors, places, sorted(metadata.state_dict_metadata), metadata.planner_data]


def test_dcp_metadata_stand_ins_read_as_torch_does():
    """Every shipped DCP folder (torch, accelerate, torchtitan, torchtune, megatron-core writers):
    `.metadata` read through unshard's stand-ins says what torch's own reader says."""
    from torch.distributed.checkpoint import FileSystemReader

    from unshard.sources import dcp

    folders = sorted(p.parent for p in SHIPPED.rglob(".metadata"))
    assert len(folders) >= 10
    for folder in folders:
        ours = dcp.read_metadata(folder)
        assert describe_dcp_metadata(ours) == describe_dcp_metadata(FileSystemReader(str(folder)).read_metadata()), (
            folder
        )
        assert all(dcp.is_tensor_entry(md) == hasattr(md, "chunks") for md in ours.state_dict_metadata.values())


@pytest.mark.parametrize(
    "src, config_from, dtype",
    [
        ("llama-fsdp1-dcp/dcp", "llama-fsdp1-dcp/hf", "auto"),  # .metadata and each chunk's archive
        ("deepspeed-zero2/checkpoint-1", None, "auto"),  # ZeRO's optimizer files, their enums and loss scaler
        ("deepspeed-zero3/checkpoint-1", None, "bfloat16"),  # fp32 master weights cast by numpy
        ("llama-fsdp2-tp/global_step_1", None, "auto"),  # tensor-parallel columns, put together as bytes
        ("qwen2-fsdp2-tp-dcp/dcp", "qwen2-fsdp2-tp-dcp/hf", "float16"),
        ("megatron-llama-tp2-pp2-vpp2/torch", None, "auto"),  # Megatron-LM's rank files: args, numpy RNG state
        ("megatron-mixtral-tp2-pp2-ep2/torch_dist", None, "bfloat16"),  # common.pt, chunks of a DCP folder
        ("megatron-qwen2-tp2-pp2/verl-legacy/global_step_10", None, "auto"),  # verl's model.pt: a list of stages
    ],
)
def test_conversion_does_not_import_torch(tmp_path, src, config_from, dtype):
    """Once transformers' answers are remembered (or for a model the families' tables list), a conversion
    that keeps the dtype or makes one of the usual casts needs no torch: the files' metadata is read by
    stand-ins, the bytes are copied file to file or cast by numpy (and, with --verify, read back and
    compared byte for byte)."""
    code = textwrap.dedent("""
        import sys
        from unshard.cli import main
        code = main(["convert", *sys.argv[1:], "--no-progress"])
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.distributed.checkpoint")))
        sys.exit(code)
    """)
    config = (["--config-from", str(SHIPPED / config_from)] if config_from else []) + ["--dtype", dtype]
    imported = []
    for out, verify in (("first", []), ("second", ["--verify"])):
        done = subprocess.run(
            [sys.executable, "-c", code, str(SHIPPED / src), str(tmp_path / out), *config, *verify],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, UNSHARD_CACHE=str(tmp_path / "cache")),
        )
        assert done.returncode == 0, done.stderr
        imported.append(done.stdout.splitlines()[-1])
    # (The first run imports torch where transformers is asked: models that the families' tables do not list.)
    assert imported[1] == "[]"
    assert folder_bytes(tmp_path / "first") == folder_bytes(tmp_path / "second")


@pytest.mark.parametrize(
    "src",
    sorted(str(p.parent.relative_to(SHIPPED)) for p in SHIPPED.glob("deepspeed-*/*/latest"))
    + sorted(str(p.relative_to(SHIPPED)) for p in SHIPPED.glob("megatron-*/torch")),
)
def test_torch_save_files_read_without_torch_as_with_it(monkeypatch, src):
    """ZeRO's model and optimizer files, and Megatron-LM's rank files (args, RNG state as numpy arrays),
    read by torch_archives' stand-ins give the same tensors, pieces and bytes as read by torch's own
    loader."""
    import torch

    from unshard import open_checkpoint
    from unshard.sources import torch_archives

    ours = open_checkpoint(SHIPPED / src)
    assert not ours.maps  # no file needed torch's loader
    monkeypatch.setattr(torch_archives, "read", torch_loader_only)
    theirs = open_checkpoint(SHIPPED / src)
    assert theirs.maps
    assert repr(ours.tensors) == repr(theirs.tensors) and ours.facts == theirs.facts
    for name in ours.tensors:
        assert torch.equal(ours.read(name), theirs.read(name)), name
        pieces = ours.tensors[name].pieces
        assert [ours.file_offset(p) for p in pieces] == [theirs.file_offset(p) for p in pieces], name


@pytest.mark.parametrize(
    "src",
    [
        "llama-fsdp2-tp/global_step_1",  # Shard(1) and _StridedShard on dp x tp
        "qwen2-fsdp2-tp-dcp/dcp",  # DCP chunks of tensor-parallel columns
        "megatron-qwen3-tp2-dp2/torch_dist",  # Megatron row-parallel layers, split along columns
    ],
)
def test_tensors_cut_in_columns_assembled_band_by_band(src, tmp_path, monkeypatch):
    """A tensor whose pieces interleave is assembled a band of rows at a time, holding one band, not
    the tensor; where each piece's rows lie in its file, as bytes without torch. With bands shrunk to a
    few rows, and with torch assembling, the files are byte-identical to assembling whole."""
    from unshard.sources.base import Checkpoint

    src = SHIPPED / src
    config_from = {"config_from": src.parent / "hf"} if (src.parent / "hf").is_dir() else {}
    as_bytes, bands = Checkpoint.read_rows_as_bytes, []

    def read_rows_as_bytes(self, *args):
        bands.append(as_bytes(self, *args))
        return bands[-1]

    monkeypatch.setattr(Checkpoint, "read_rows_as_bytes", read_rows_as_bytes)
    unshard.convert(src, tmp_path / "default", progress=False, **config_from)
    assert any(band is not None for band in bands)
    monkeypatch.setattr(Checkpoint, "read_rows_as_bytes", lambda self, *args: None)
    unshard.convert(src, tmp_path / "torch", progress=False, **config_from)
    monkeypatch.setattr(Checkpoint, "read_rows_as_bytes", as_bytes)
    monkeypatch.setattr(Checkpoint, "BAND_BYTES", 1024)
    plan = unshard.plan(src, **config_from)
    banded = [g for g in plan.groups if g.convert is None and plan.checkpoint.band_rows(g.source.name)]
    assert any(len({p.block.global_offsets[1:] for p in g.source.pieces}) > 1 for g in banded)  # column pieces
    assert all(plan.held(g) <= 2 * 1024 + 2 * g.nbytes // g.source.shape[0] for g in banded)
    unshard.convert(src, tmp_path / "bands", progress=False, verify=True, **config_from)
    written = sorted(p.name for p in (tmp_path / "default").glob("*.safetensors"))
    for other in ("torch", "bands"):
        assert written == sorted(p.name for p in (tmp_path / other).glob("*.safetensors"))
        for name in written:
            assert (tmp_path / other / name).read_bytes() == (tmp_path / "default" / name).read_bytes(), (other, name)


def test_pages_of_each_piece_are_handed_back_before_the_next_is_read(tmp_path, monkeypatch):
    """Mapped pages count in RSS: a streamed tensor read through memory by torch (here: cast to
    bfloat16, with numpy's casts turned off) hands back each piece once it is written, and a banded one
    each band's rows, so mapped memory follows a piece or a band, not the tensor."""
    from unshard import dtypes
    from unshard.sources.base import Checkpoint
    from unshard.sources.fsdp_rank_files import FsdpRankFiles

    monkeypatch.setattr(dtypes, "casts_without_torch", lambda source, target: False)
    events = []
    for method in ("read_piece", "release", "release_rows"):
        real = getattr(FsdpRankFiles, method)
        monkeypatch.setattr(
            FsdpRankFiles,
            method,
            lambda self, piece, *rest, real=real, method=method: (
                events.append((method, piece.key, piece.block.global_offsets)),
                real(self, piece, *rest),
            )[1],
        )
    unshard.convert(
        SHIPPED / "llama-fsdp2" / "global_step_1", tmp_path / "streamed", progress=False, threads=1, dtype="bfloat16"
    )
    reads = [i for i, e in enumerate(events) if e[0] == "read_piece"]
    assert reads and all(events[i + 1] == ("release", *events[i][1:]) for i in reads)

    events.clear()
    monkeypatch.setattr(Checkpoint, "BAND_BYTES", 1024)
    unshard.convert(
        SHIPPED / "llama-fsdp2-tp" / "global_step_1", tmp_path / "banded", progress=False, threads=1, dtype="bfloat16"
    )  # (assembled by torch from the file maps)
    banded = [e for e in events if e[0] == "release_rows" and e[1] == "model.layers.0.self_attn.o_proj.weight"]
    assert len(banded) > len({e[2] for e in banded})  # each piece handed back band by band, not once at the end


@pytest.mark.parametrize(
    "src",
    [
        "llama-fsdp2/global_step_1",
        "llama-fsdp1-dcp/dcp",
        "llama-fsdp1-shardedtensor/global_step_1",
        "megatron-qwen3-tp2-dp2/torch",
        "megatron-qwen3-tp2-dp2/torch_dist",
        "deepspeed-zero3/checkpoint-1",
        "llama-fsdp2-dcp-safetensors/sharded",
        "llama-fsdp2/reference",
    ],
)
def test_pieces_that_lie_in_their_files_are_copied_file_to_file(tmp_path, monkeypatch, src):
    """A same-dtype piece that is one run of bytes in a mapped file (FSDP rows, a DCP chunk) goes file
    to file through copy_file_range, never through memory; where the kernel refuses, through pread. All
    three ways write the same bytes as reading the pieces into memory."""
    from unshard.sinks import safetensors as writer
    from unshard.sources.base import Checkpoint

    src = SHIPPED / src
    config_from = {"config_from": src.parent / "hf"} if (src.parent / "hf").is_dir() else {}
    copied, real_copy = [], writer.SafetensorsFile._copy_at
    monkeypatch.setattr(
        writer.SafetensorsFile, "_copy_at", lambda self, at, part: (copied.append(part), real_copy(self, at, part))[1]
    )
    monkeypatch.setattr(writer, "_KERNEL_COPIES", True)  # restored after the test, whatever a refusal below sets
    unshard.convert(src, tmp_path / "kernel", progress=False, verify=True, **config_from)
    assert copied and all(part.path.is_relative_to(src) for part in copied)
    plan = unshard.plan(src, **config_from)
    streamed = sum(g.nbytes for g in plan.groups if plan.checkpoint.flat_pieces(g.source.name) and g.convert is None)
    assert sum(part.nbytes for part in copied) == streamed  # every streamed tensor, whole

    refusals = []

    def refused(*args):
        refusals.append(args)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(writer.os, "copy_file_range", refused)
    unshard.convert(src, tmp_path / "pread", progress=False, **config_from)
    assert len(refusals) == 1 and writer._KERNEL_COPIES is False  # asked once, then not again

    monkeypatch.setattr(Checkpoint, "file_offset", lambda self, piece: None)
    unshard.convert(src, tmp_path / "memory", progress=False, **config_from)
    for name in (p.name for p in (tmp_path / "memory").glob("*.safetensors")):
        memory = (tmp_path / "memory" / name).read_bytes()
        assert (tmp_path / "kernel" / name).read_bytes() == memory, name
        assert (tmp_path / "pread" / name).read_bytes() == memory, name


@pytest.mark.parametrize("kernel_copies", [True, False])
def test_a_source_file_shorter_than_its_part_is_named(tmp_path, monkeypatch, kernel_copies):
    """A rank file cut short after it was opened (a copy still running) is an error naming it, not a
    short tensor written silently (nor, as through a memory map, a bus error)."""
    from unshard import dtypes
    from unshard.errors import CheckpointError
    from unshard.sinks import safetensors as writer

    monkeypatch.setattr(writer, "_KERNEL_COPIES", kernel_copies)
    short = tmp_path / "model_world_size_2_rank_1.pt"
    short.write_bytes(b"\0" * 10)
    out = writer.SafetensorsFile(tmp_path / "model.safetensors", [("t", dtypes.float32, (4,))])
    with pytest.raises(CheckpointError, match=f"{short}: ends before byte 16"):
        out.write_parts("t", dtypes.float32, (4,), [writer.FileBytes(short, 0, 16)])
    out.close(check=False)


def test_threads_that_map_a_file_at_once_share_one_map(monkeypatch):
    """Chunks are views of their file's one map; a second map made by a thread that asked at the same
    time would hold chunks that file_offset and release_rows do not find, read through memory and
    never handed back (seen: 120 MB more RSS on a 2 GB DCP conversion)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch

    checkpoint = unshard.plan(
        SHIPPED / "llama-fsdp1-dcp" / "dcp", config_from=SHIPPED / "llama-fsdp1-dcp" / "hf"
    ).checkpoint
    file = next(p.file for t in checkpoint.tensors.values() for p in t.pieces)
    checkpoint.maps.clear()
    real = torch.UntypedStorage.from_file
    monkeypatch.setattr(torch.UntypedStorage, "from_file", lambda *a, **k: (time.sleep(0.01), real(*a, **k))[1])
    together = threading.Barrier(4)
    with ThreadPoolExecutor(4) as pool:
        maps = list(pool.map(lambda _: (together.wait(), checkpoint.map_file(file))[1], range(4)))
    assert all(m is maps[0] for m in maps) and checkpoint.maps[file] is maps[0]


def test_a_kernel_copy_that_copies_nothing_is_read_instead(tmp_path, monkeypatch):
    """Some filesystems answer copy_file_range with 0 bytes rather than an error: the part is read
    instead, and the tensor written whole."""
    import torch
    from safetensors.torch import load_file

    from unshard import dtypes
    from unshard.sinks import safetensors as writer

    monkeypatch.setattr(writer, "_KERNEL_COPIES", True)
    monkeypatch.setattr(writer.os, "copy_file_range", lambda *args: 0)
    source = tmp_path / "source.bin"
    values = torch.arange(6, dtype=torch.float32)
    source.write_bytes(b"header" + values.numpy().tobytes())
    out = writer.SafetensorsFile(tmp_path / "model.safetensors", [("t", dtypes.float32, (2, 3))])
    out.write_parts("t", dtypes.float32, (2, 3), [writer.FileBytes(source, 6, 12), writer.FileBytes(source, 18, 12)])
    out.close()
    assert torch.equal(load_file(tmp_path / "model.safetensors")["t"], values.reshape(2, 3))


def test_dcp_chunks_saved_as_safetensors_are_found_by_their_header(tmp_path, monkeypatch):
    """torch.distributed.checkpoint's SerializationFormat.SAFETENSORS writes each .distcp as a
    safetensors file and records offset 0 for every chunk in .metadata: the bytes are where the
    file's header says (read from offset 0, they were the header: wrong weights, silently)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat

    from unshard.sinks import safetensors as writer

    reference = SHIPPED / "llama-fsdp2" / "reference"
    state = load_file(reference / "model.safetensors")
    with pytest.warns(UserWarning):  # no process group: torch saves as a single process
        dcp.save(
            state,
            storage_writer=FileSystemWriter(tmp_path / "dcp", serialization_format=SerializationFormat.SAFETENSORS),
        )
    copied, real_copy = [], writer.SafetensorsFile._copy_at
    monkeypatch.setattr(
        writer.SafetensorsFile, "_copy_at", lambda self, at, part: (copied.append(part), real_copy(self, at, part))[1]
    )
    unshard.convert(tmp_path / "dcp", tmp_path / "out", progress=False, verify=True, config_from=reference)
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert written.keys() == state.keys()
    assert all(written[k].dtype == state[k].dtype and torch.equal(written[k], state[k]) for k in state)
    assert copied  # chunks are views of the file's map, so copied by the kernel


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])  # pieces copied file to file; tensors cast in memory
def test_verify_finds_a_byte_changed_after_writing(tmp_path, monkeypatch, dtype):
    """--verify reads every written byte back: one byte changed between writing and verifying (a bad
    disk, another process) fails the run, names the tensor, and leaves no OUT behind."""
    from unshard.errors import UnshardError
    from unshard.sinks.safetensors import WrittenFile
    from unshard.write import threads

    write = threads._write_weights
    changed = []

    def write_then_flip_a_byte(plan, folder, filenames, writing, bar):
        digests = write(plan, folder, filenames, writing, bar)
        file = WrittenFile(folder / filenames[0])
        name, (_, _, begin, end) = next(iter(file.entries.items()))
        with open(file.path, "r+b") as f:
            at = file.data_start + (begin + end) // 2
            byte = os.pread(f.fileno(), 1, at)[0]
            os.pwrite(f.fileno(), bytes([byte ^ 1]), at)
        changed.append(name)
        return digests

    monkeypatch.setattr(threads, "_write_weights", write_then_flip_a_byte)
    src = SHIPPED / "llama-fsdp2" / "global_step_1" / "actor"
    with pytest.raises(UnshardError) as error:
        unshard.convert(src, tmp_path / "out", dtype=dtype, verify=True, progress=False)
    assert f"model.safetensors: {changed[0]} differs from the checkpoint" in str(error.value)
    assert not list(tmp_path.iterdir())
    unshard.convert(src, tmp_path / "out", dtype=dtype, progress=False)  # without --verify, nothing notices


def test_casts_by_numpy_round_as_torch_does():
    """dtypes.cast gives torch's bits for every pair it takes on: millions of random bit patterns and
    the edge cases (ties, the largest values, subnormals, infinities, NaNs with payloads)."""
    import numpy as np
    import torch

    from unshard import dtypes

    edges = [
        0,
        0x80000000,
        0x7F800000,
        0xFF800000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x00000001,
        0x807FFFFF,
        0x7F800001,
        0xFFC00123,
        0x7FA00000,
        0x3F808000,
        0x3F818000,
        0x3F807FFF,
        0x477FF000,
        0x477FE000,
        0x477FEFFF,
        0x387FC000,
        0x33000000,
        0x33000001,
        0xB3000000,
    ]
    rng = np.random.default_rng(0)
    bits = np.concatenate(
        [
            np.array(edges, np.uint32),
            rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32),
            rng.standard_normal(500_000).astype(np.float32).view(np.uint32),
        ]
    )
    float32 = torch.from_numpy(bits.view(np.float32).copy())
    every_bf16 = np.arange(2**16, dtype=np.uint16)
    cases = [
        (bits, float32, "bfloat16"),
        (bits, float32, "float16"),
        (every_bf16, torch.from_numpy(every_bf16.view(np.int16).copy()).view(torch.bfloat16), "float32"),
    ]
    for raw, tensor, target in cases:
        ours = dtypes.cast(raw.view(np.uint8), dtypes.of(tensor.dtype), dtypes.BY_NAME[target])
        theirs = tensor.to(getattr(torch, target)).view(torch.uint8).numpy()
        assert ours.tobytes() == theirs.tobytes(), target
    assert dtypes.cast(bits.view(np.uint8), dtypes.BY_NAME["float16"], dtypes.BY_NAME["bfloat16"]) is None


@pytest.mark.parametrize(
    "src, config_from",
    [
        ("llama-fsdp2/global_step_1", None),
        ("llama-fsdp2-tp/global_step_1", None),
        ("qwen2-fsdp2-tp-dcp/dcp", "qwen2-fsdp2-tp-dcp/hf"),
        ("deepspeed-zero3/checkpoint-1", None),
    ],
)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_casts_by_numpy_write_what_torch_writes(tmp_path, monkeypatch, src, config_from, dtype):
    """Row shards, column shards, DCP chunks and ZeRO ranges cast by numpy from the files give the
    same files as torch casting them from memory maps."""
    from unshard import dtypes

    config = {"config_from": SHIPPED / config_from} if config_from else {}
    unshard.convert(SHIPPED / src, tmp_path / "numpy", dtype=dtype, progress=False, **config)
    monkeypatch.setattr(dtypes, "casts_without_torch", lambda source, target: False)
    unshard.convert(SHIPPED / src, tmp_path / "torch", dtype=dtype, progress=False, **config)
    assert folder_bytes(tmp_path / "numpy") == folder_bytes(tmp_path / "torch")

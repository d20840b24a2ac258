"""A GGUF file split (--gguf-split-max-size) as llama.cpp's converter splits it (its --split-max-size): the same
files under the same names, each equal to the converter's (test_gguf.py's oracle), which llama.cpp loads from the
first; in llama-quantize's types, the split of the one file unshard writes, which llama.cpp runs as it runs that file.
"""

from __future__ import annotations

import gguf
import pytest
import torch
from conftest import SHIPPED
from test_cli_and_errors import leftovers, run_cli
from test_gguf import (  # noqa: F401  (converter, llama_cpp and ggml_library: the fixtures, used by name)
    assert_same_file,
    contents,
    converter,
    ggml_library,
    llama_cpp,
)

import unshard
from unshard.errors import UnshardError
from unshard.sinks.gguf import kquants

SRC = SHIPPED / "llama-fsdp2-spm" / "global_step_1"
PROMPT = [1, 5, 20, 33, 64, 70, 90, 2]


def split_files(folder, stem: str) -> list:
    return sorted(folder.glob(f"{stem}-*-of-*.gguf"))


@pytest.mark.parametrize("kind, size", [("q8_0", "100K")])
def test_a_split_as_the_converter_splits_it(kind, size, converter, llama_cpp, tmp_path):
    """Each file of unshard's split equals the converter's of the same name (its tensors, and the metadata in the first,
    the split's key-values in each); llama.cpp loads the model from the first file and computes the one file's
    logits, bit for bit."""
    unshard.convert(SRC, tmp_path / "hf", progress=False)
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    options = unshard.OutputOptions(gguf=kind, gguf_split=size)
    result = unshard.convert(SRC, tmp_path / "ours" / "m.gguf", output=options, verify=True, progress=False)
    converter(tmp_path / "hf", kind, tmp_path / "theirs" / "m.gguf", more=("--split-max-size", size))
    ours, theirs = split_files(tmp_path / "ours", "m"), split_files(tmp_path / "theirs", "m")
    assert len(ours) > 2 and [p.name for p in ours] == [p.name for p in theirs] and len(result.files) == len(ours)
    assert not (tmp_path / "ours" / "m.gguf").exists() and not leftovers(tmp_path / "ours")
    for mine, expected in zip(ours, theirs):
        assert_same_file(mine, expected)
    fields = contents(ours[1])[0]
    assert list(fields) == ["split.no", "split.count", "split.tensors.count"] and fields["split.no"] == 1
    unshard.convert(SRC, tmp_path / "one.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
    assert [t for p in ours for t in contents(p)[1]] == contents(tmp_path / "one.gguf")[1]
    whole, _ = llama_cpp(tmp_path / "one.gguf", PROMPT, 0)
    split, _ = llama_cpp(ours[0], PROMPT, 0)
    assert torch.equal(split, whole)


def test_a_k_quant_split_runs_as_its_one_file(llama_cpp, ggml_library, monkeypatch, tmp_path):
    """q4_k_m (llama-quantize's mix, which the converter does not write): the split holds the one file's tensors, in
    its order, cut where the converter's rule cuts them; llama.cpp runs it as it runs the one file."""
    monkeypatch.setenv(kquants.LIBRARY_VARIABLE, ggml_library)
    for out, split in (("one.gguf", None), ("m.gguf", "60K")):
        options = unshard.OutputOptions(gguf="q4_k_m", gguf_split=split)
        unshard.convert(SRC, tmp_path / out, output=options, verify=True, progress=False)
    files = split_files(tmp_path, "m")
    one = contents(tmp_path / "one.gguf")
    assert len(files) > 2 and [t for p in files for t in contents(p)[1]] == one[1]
    fields = contents(files[0])[0]
    assert {k: v for k, v in fields.items() if not k.startswith("split.")} == one[0]
    assert (fields["split.count"], fields["split.tensors.count"]) == (len(files), len(one[1]))
    assert all(sum(len(t[3]) for t in contents(p)[1]) <= 60_000 or len(contents(p)[1]) == 1 for p in files)
    assert torch.equal(llama_cpp(files[0], PROMPT, 0)[0], llama_cpp(tmp_path / "one.gguf", PROMPT, 0)[0])


def test_a_model_within_the_size_is_one_file_and_dry_run_lists_the_split(tmp_path):
    code, _, err = run_cli("convert", SRC, tmp_path / "m.gguf", "--gguf-split-max-size", "1G", "--no-progress")
    assert code == 0 and [p.name for p in tmp_path.iterdir()] == ["m.gguf"], err
    code, out, err = run_cli("convert", SRC, tmp_path / "n.gguf", "--gguf-split-max-size", "200K", "--dry-run")
    assert code == 0 and "files for llama.cpp, OUT-00001-of-" in out and "model-00001-of-" in out, err
    assert not list(tmp_path.glob("n*"))


@pytest.mark.parametrize(
    "args, expected",
    [
        (("--gguf-split-max-size", "2X"), "--gguf-split-max-size 2X: not a size"),
        (("--gguf-split-max-size", "0"), "--gguf-split-max-size 0: not a size"),
    ],
)
def test_a_split_size_that_is_not_one_is_one_line(args, expected, tmp_path):
    code, _, err = run_cli("convert", SRC, tmp_path / "m.gguf", *args, "--no-progress")
    assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


def test_a_split_of_a_folder_is_one_line(tmp_path):
    code, _, err = run_cli("convert", SRC, tmp_path / "folder", "--gguf-split-max-size", "2G", "--no-progress")
    assert code == 1 and "splits a GGUF file: give an OUT ending in .gguf" in err, err
    assert not list(tmp_path.iterdir())


def test_an_existing_file_of_the_split_is_kept_unless_overwrite(tmp_path):
    args = ("--gguf-split-max-size", "200K", "--no-progress")
    code, out, err = run_cli("convert", SRC, tmp_path / "m.gguf", *args)
    first = split_files(tmp_path, "m")[0]
    assert code == 0 and f"to {first} in" in out, out  # (the file llama.cpp loads)
    first.write_bytes(b"mine")
    code, _, err = run_cli("convert", SRC, tmp_path / "m.gguf", *args)
    assert code == 1 and "-of-00011.gguf: already exists" in err and first.read_bytes() == b"mine"
    code, _, err = run_cli("convert", SRC, tmp_path / "m.gguf", *args, "--overwrite")
    assert code == 0 and first.read_bytes()[:4] == b"GGUF" and not leftovers(tmp_path)


def test_verify_reads_the_tensor_infos_as_gguf_py_does_stepping_over_the_arrays(tmp_path):
    """--verify's reader of a GGUF file's tensor infos (sinks/gguf/reading.py) steps over the header's arrays whole
    (gguf-py's reader parses every item: 20 s for a Llama 3 vocabulary): it finds gguf-py's data start and tensors,
    at a header's own alignment too; a header cut short, or holding a value of no known type, is one line."""
    import numpy as np

    from unshard.sinks.gguf.reading import tensor_infos

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_custom_alignment(64)
    writer.add_token_list([f"token{i}" for i in range(3000)])
    writer.add_token_scores([float(i) for i in range(3000)])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_tensor("a", np.arange(64, dtype=np.float32).reshape(2, 32))
    quantized = gguf.quantize(np.ones((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("b", quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(path)
    start, infos = tensor_infos(path)
    assert start == reader.data_offset and start % 64 == 0
    assert [(t.name, t.shape, t.ggml_type, start + t.offset) for t in infos] == [
        (t.name, tuple(t.shape.tolist()), int(t.tensor_type), int(t.data_offset)) for t in reader.tensors
    ]
    whole = path.read_bytes()
    path.write_bytes(whole[: start // 2])
    with pytest.raises(UnshardError, match="its header ends past the end of the file; it was cut short"):
        tensor_infos(path)
    at = whole.index(b"test.nested") + len("test.nested")  # (the value's type, after the key)
    path.write_bytes(whole[:at] + (77).to_bytes(4, "little") + whole[at + 4 :])
    with pytest.raises(UnshardError, match="a value of unknown type 77; the file is damaged"):
        tensor_infos(path)

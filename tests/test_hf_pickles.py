"""Hugging Face folders saved as pickles (`pytorch_model.bin`, sharded `pytorch_model-0000i-of-0000N.bin` with
their index), written by transformers 4's save_pretrained(safe_serialization=False)
(tests/fixtures/make_hf_pickles.py), converted to safetensors and merged, without any pickle code running."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SHIPPED
from safetensors.torch import load_file
from unshard_forks import run_unshard

CASE = SHIPPED / "llama-hf-pickles"


def run(*args, ok=True) -> subprocess.CompletedProcess:
    done = run_unshard(*args, timeout=600)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def case(fixture_case) -> Path:
    """The shipped folders, and ones made now by transformers 4 (the llamacpp peer venv's 4.57.6)."""
    return fixture_case("llama-hf-pickles")


@pytest.mark.parametrize("saved", ["single", "sharded"])
def test_pickled_folder_converts_exactly(saved, case, tmp_path):
    import transformers

    done = run("inspect", case / saved)
    assert "huggingface-pickle" in done.stdout
    run("convert", case / saved, tmp_path / "out", "--verify", "--no-progress")
    mine, reference = (
        load_file(tmp_path / "out" / "model.safetensors"),
        load_file(case / "reference" / "model.safetensors"),
    )
    assert sorted(mine) == sorted(reference)
    for name, tensor in reference.items():
        assert mine[name].dtype == tensor.dtype and torch.equal(mine[name], tensor), name
    assert not list((tmp_path / "out").glob("*.bin")) and (tmp_path / "out" / "tokenizer.json").exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    expected = transformers.AutoModelForCausalLM.from_pretrained(case / "reference")
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    assert torch.equal(model(ids).logits, expected(ids).logits)


def test_pickled_folder_as_a_merge_input(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"merge_method: linear\nmodels:\n  - model: {CASE / 'sharded'}\n    parameters: {{weight: 0.5}}\n"
        f"  - model: {CASE / 'reference'}\n    parameters: {{weight: 0.5}}\n"
    )
    run("merge", recipe, tmp_path / "out", "--no-progress")
    mine, reference = (
        load_file(tmp_path / "out" / "model.safetensors"),
        load_file(CASE / "reference" / "model.safetensors"),
    )
    assert all(torch.equal(mine[name], tensor) for name, tensor in reference.items())


class Payload:
    def __reduce__(self):
        import os

        return os.system, (f"touch {Payload.marker}",)


def one_line_error(done) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr


def test_a_pickle_that_runs_code_is_refused(tmp_path):
    folder = tmp_path / "evil"
    shutil.copytree(CASE / "single", folder)
    Payload.marker = tmp_path / "pwned"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": Payload()}))
    line = one_line_error(run("convert", folder, tmp_path / "out", ok=False))
    assert "pytorch_model.bin" in line
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()


def test_damaged_sharded_folders_are_one_line(tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(CASE / "sharded", folder)
    (folder / "pytorch_model-00002-of-00003.bin").unlink()
    line = one_line_error(run("convert", folder, tmp_path / "out", ok=False))
    assert "pytorch_model-00002-of-00003.bin" in line and not (tmp_path / "out").exists()
    shutil.rmtree(folder)
    shutil.copytree(CASE / "sharded", folder)
    index = json.loads((folder / "pytorch_model.bin.index.json").read_text())
    moved = next(iter(index["weight_map"]))
    index["weight_map"][moved] = (
        "pytorch_model-00003-of-00003.bin"
        if not index["weight_map"][moved].startswith("pytorch_model-00003")
        else "pytorch_model-00001-of-00003.bin"
    )
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    line = one_line_error(run("convert", folder, tmp_path / "out", ok=False))
    assert "index lists" in line and not (tmp_path / "out").exists()

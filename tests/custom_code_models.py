"""What the tests of a custom-code model's fixture share (a model transformers has no class of, trained by FSDP2 and
saved by DCP, beside the folder the run started from, `hf/`, and the trained model its run gathered, `reference/`):
its folder from the checkpoint, the folder the converter reads, and llama.cpp's logits against its own model's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import generate
import numpy as np
import torch
from safetensors.torch import load_file
from test_gguf import llama_cpp_client
from test_gguf_newer_architectures import unshard_with_llama_cpp_gguf_py


def folder_is_the_model_it_trained(fixture: Path, tmp_path: Path, files: tuple[str, ...]) -> str:
    """unshard's folder of the DCP checkpoint (hf/ as --config-from) holds every tensor the run gathered, under the
    names it saved, the run's config and these files of hf/ as they are. Returns the conversion's messages."""
    hf = fixture / "hf"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "unshard",
            "convert",
            str(fixture / "dcp"),
            str(tmp_path / "out"),
            "--config-from",
            str(hf),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    written = load_file(tmp_path / "out" / "model.safetensors")
    reference = load_file(fixture / "reference" / "model.safetensors")
    assert sorted(written) == sorted(reference) and all(torch.equal(written[n], t) for n, t in reference.items())
    for name in files:
        assert (tmp_path / "out" / name).read_bytes() == (hf / name).read_bytes(), name
    config = json.loads((hf / "config.json").read_text())
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == {**config, "dtype": "float32"}
    return done.stderr


def the_trained_folder(fixture: Path, tmp_path: Path) -> Path:
    """The folder the converter reads: the run's gathered model (save_pretrained's) beside its tokenizer's files."""
    folder = tmp_path / "trained"
    shutil.copytree(fixture / "reference", folder)
    for path in (fixture / "hf").iterdir():
        if path.name not in ("config.json", "generation_config.json"):
            shutil.copy(path, folder / path.name)
    return folder


def llama_cpp_logits_apart(fixture: Path, peer: str, oracle: str, prompt: list[int], tmp_path: Path) -> dict:
    """How far apart (relative distance) llama.cpp's logits of the prompt, from unshard's f32 and q8_0 files of the DCP
    checkpoint, are from the model's own, as `oracle` (a script beside this one, run in that peer venv) computes them
    of reference/."""
    for kind in ("f32", "q8_0"):
        done = unshard_with_llama_cpp_gguf_py(
            "convert", fixture / "dcp", tmp_path / f"{kind}.gguf", "--config-from", fixture / "hf", "--gguf-type", kind
        )
        assert done.returncode == 0, done.stderr
    tokens = ",".join(map(str, prompt))
    computed = subprocess.run(
        [str(generate.peer_python(peer)), str(Path(__file__).parent / oracle)]
        + [str(fixture / "reference"), tokens, str(tmp_path / "oracle.npy")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert computed.returncode == 0, computed.stderr[-3000:]
    expected = np.load(tmp_path / "oracle.npy")
    apart = {}
    for kind in ("f32", "q8_0"):
        llama_cpp_client("run", tmp_path / f"{kind}.gguf", tokens, tmp_path / f"{kind}.npz", 2)
        ran = np.load(tmp_path / f"{kind}.npz")["logits"]
        apart[kind] = float(np.linalg.norm(ran - expected) / np.linalg.norm(expected))
    return apart


def refused_with_its_files_changed(fixture: Path, file: str, change: dict, message: str, tmp_path: Path) -> None:
    """The DCP checkpoint converted to GGUF with `change` made to that JSON file of hf/ (made where hf/ has none): one
    line matching `message`, naming the changed folder, nothing written."""
    hf = tmp_path / "hf"
    shutil.copytree(fixture / "hf", hf)
    written = json.loads((hf / file).read_text()) if (hf / file).is_file() else {}
    (hf / file).write_text(json.dumps({**written, **change}))
    done = unshard_with_llama_cpp_gguf_py(
        "convert", fixture / "dcp", tmp_path / "m.gguf", "--config-from", hf, "--no-progress"
    )
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(message, done.stderr) and str(hf) in done.stderr, done.stderr
    assert not (tmp_path / "m.gguf").exists()

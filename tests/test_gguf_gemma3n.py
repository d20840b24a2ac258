"""GGUF of the whole Gemma 3n (`Gemma3nForConditionalGeneration`, as the Hub's E2B and E4B are): its text model's file
and the mmproj file of its towers (MobileNetV5's vision tower, the Conformer audio encoder), as the converter writes
them. transformers builds Gemma 3n's MobileNetV5 vision tower with timm, which takes torchvision, whose PyPI build loads
only beside CUDA's torch: unshard reads the checkpoint in the peer venv of both (generate.py's "torchvision"), as a
user's training environment has them; transformers' text model alone computes the logits here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import generate
import pytest
import torch
from conftest import SHIPPED
from safetensors.torch import load_file
from test_gguf import LLAMA_CPP_TOLERANCE, contents, converter, llama_cpp  # noqa: F401  (fixtures, used by name)
from test_gguf_families import gemma3n_as_the_converter_has_it, gemma3n_cut_as_llama_cpp
from test_gguf_mmproj import assert_same_tensors

import unshard

CASE = "gemma3nvl-fsdp2-spm"
# unshard's commands one after another in one interpreter, to the first that fails
ONE_AFTER_ANOTHER = """
import json, sys
from unshard.cli import main
for argv in json.loads(sys.argv[1]):
    if code := main(argv):
        sys.exit(code)
"""


def unshard_in_the_torchvision_venv(*commands: tuple) -> subprocess.CompletedProcess:
    """unshard's command lines in the torchvision peer venv (timm there builds Gemma 3n's vision tower)."""
    src = Path(__file__).parents[1] / "src"
    return subprocess.run(
        [
            str(generate.peer_python("torchvision")),
            "-c",
            ONE_AFTER_ANOTHER,
            json.dumps([list(map(str, c)) for c in commands]),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(src), os.environ.get("PYTHONPATH"))))),
    )


def test_gemma3n_as_the_converter_writes_it_text_model_and_towers(converter, llama_cpp, monkeypatch, tmp_path):
    """The whole Gemma 3n from FSDP2 rank files: unshard's folder is the model transformers trained, tensor for tensor;
    its f32 file the converter's text model of that folder (but for the shared layers' keys and values,
    which llama.cpp loads and the converter's file lacks: zeros in unshard's, test_gemma3n_as_the_converter_...), and
    llama.cpp computes the text model's logits from it, transformers cutting the sparse layers' activations as
    llama.cpp does (noted). Beside it, in f32 and f16, the converter's mmproj file of the towers (MobileNetV5's blocks
    by their two indices, the Conformer, the types the converter forces), with a note of what mtmd does with it (mtmd
    refuses this model's file: its width check reads the vision tower's width, 2048, against the text's, 32)."""
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig
    from transformers.models.gemma3n import modeling_gemma3n

    src, folder = SHIPPED / CASE / "global_step_1", tmp_path / "hf"
    done = unshard_in_the_torchvision_venv(
        ("convert", src, folder, "--no-progress"),
        ("convert", src, tmp_path / "f32.gguf", "--gguf-type", "f32", "--verify", "--no-progress"),
        ("convert", src, tmp_path / "f16.gguf", "--gguf-type", "f16", "--no-progress"),
    )
    assert done.returncode == 0, done.stderr
    assert "reads images from Gemma 3n's mmproj file and no sound" in done.stderr, done.stderr
    written, reference = (
        load_file(folder / "model.safetensors"),
        load_file(SHIPPED / CASE / "reference" / "model.safetensors"),
    )
    assert sorted(written) == sorted(reference) and all(torch.equal(written[n], t) for n, t in reference.items())
    assert any(name.startswith("model.vision_tower.timm_model.") for name in written)
    oracle = converter(folder, "f32", tmp_path / "oracle-f32.gguf", pre=None)
    assert gemma3n_as_the_converter_has_it(tmp_path / "f32.gguf") == contents(oracle)
    fields, tensors = contents(tmp_path / "f32.gguf")
    assert fields["general.architecture"] == "gemma3n" and not any(
        t[0].startswith(("v.", "a.", "mm.")) for t in tensors
    )
    # (the text model alone, its weights the checkpoint's language model's and its head the embedding, as tied)
    config = json.loads((folder / "config.json").read_text())
    model = Gemma3nForCausalLM(Gemma3nTextConfig(**config["text_config"])).float()
    own = {n.replace("model.language_model.", "model."): t for n, t in reference.items() if ".language_model." in n}
    missing, unexpected = model.load_state_dict({n: t.float() for n, t in own.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    monkeypatch.setattr(modeling_gemma3n.Gemma3nTextMLP, "_gaussian_topk", gemma3n_cut_as_llama_cpp)
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    expected = model(torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0, kv_cache="f32")
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]

    for kind in ("f32", "f16"):
        ours = contents(tmp_path / f"mmproj-{kind}.gguf")
        theirs = contents(converter(folder, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", mmproj=True))
        assert ours[0] == theirs[0] and list(ours[0]) == list(theirs[0])
        assert_same_tensors(ours[1], theirs[1])
    names = {t[0] for t in ours[1]}
    assert "v.blk.0.0.conv_exp.weight" in names and any(name.startswith("a.blk.0.") for name in names), names


def test_without_timm_gemma3n_is_one_line_naming_it(monkeypatch, tmp_path):
    """Where timm is not installed (this suite's own venv: its torchvision would need CUDA's torch), the whole Gemma 3n
    is refused in one line that names the library to install, nothing written; unshard's cache of what transformers
    said of a config is off, as on a machine that never read this model."""
    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed here")
    monkeypatch.setenv("UNSHARD_CACHE", "off")
    with pytest.raises(unshard.ConfigMismatchError) as refused:
        unshard.convert(SHIPPED / CASE / "global_step_1", tmp_path / "m.gguf", progress=False)
    message = str(refused.value)
    assert "not installed here (TimmWrapperModel requires the timm library" in message and "\n" not in message
    assert not list(tmp_path.iterdir())

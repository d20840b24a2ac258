"""A LoRA adapter kept apart (--lora separate) with a GGUF OUT: the model's file, and llama.cpp's adapter file
beside it (OUT-LoRA.gguf), which `llama-cli -m OUT --lora OUT-LoRA.gguf` applies. The oracle is llama.cpp's own
convert_lora_to_gguf.py (test_gguf.py's source package and venv) run on the PEFT folder unshard writes for the same
checkpoint (test_lora.py checks that folder against peft's own save); and llama.cpp itself, which applies the file to
the base as peft's merge of the adapter computes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import generate
import pytest
import torch
from conftest import SHIPPED
from test_cli_and_errors import leftovers, run_cli
from test_gguf import (  # noqa: F401  (llama_cpp: the fixture, used by name)
    LLAMA_CPP_TOLERANCE,
    assert_same_file,
    contents,
    llama_cpp,
)

import unshard

CASE = SHIPPED / "llama-fsdp2-lora"
SRC = CASE / "global_step_1"
ARCHITECTURE = "LlamaForCausalLM"  # (the fixture's config.json names none)
PROMPT = [1, 5, 20, 33, 64, 70, 90, 2]


@pytest.fixture(scope="session")
def lora_converter():
    """Runs llama.cpp's convert_lora_to_gguf.py on a PEFT adapter folder and its base model's folder."""
    root, python = generate.llama_cpp_source(), generate.peer_python("llamacpp")

    def run(base: Path, adapter: Path, outtype: str, out: Path) -> Path:
        script = root / "convert_lora_to_gguf.py"
        args = [
            str(python),
            str(script),
            "--base",
            str(base),
            "--outtype",
            outtype,
            str(adapter),
            "--outfile",
            str(out),
        ]
        offline = dict(os.environ, HF_HUB_OFFLINE="1")
        done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=offline)
        assert done.returncode == 0, done.stderr[-3000:]
        return out

    return run


@pytest.mark.parametrize("kind", ["f16", "q8_0"])  # (f32 and bf16 take f16's path with another type)
def test_the_adapter_file_is_the_converter_s(kind, lora_converter, tmp_path):
    """Every tensor (name, type, shape, bytes, order: q's lora_b rows reordered per head as the weight's) and every
    metadata field but the name equal the converter's file."""
    folder = tmp_path / "folder"
    unshard.convert(SRC, folder, lora="separate", architecture=ARCHITECTURE, progress=False)
    options = unshard.OutputOptions(gguf=kind)
    kwargs = dict(lora="separate", architecture=ARCHITECTURE, progress=False)
    result = unshard.convert(SRC, tmp_path / "m.gguf", output=options, verify=True, **kwargs)
    assert sorted(result.files) == ["lora.gguf", "model.gguf"] and not leftovers(tmp_path)
    theirs = lora_converter(folder, folder / "lora_adapter", kind, tmp_path / "theirs.gguf")
    assert_same_file(tmp_path / "m-LoRA.gguf", theirs)
    fields, tensors = contents(tmp_path / "m-LoRA.gguf")
    assert (fields["general.type"], fields["adapter.type"], fields["adapter.lora.alpha"]) == ("adapter", "lora", 8.0)
    assert len(tensors) == 12 and tensors[0][0] == "blk.0.attn_q.weight.lora_a"


def test_llama_cpp_applies_the_adapter_as_peft_merges_it(llama_cpp, tmp_path):
    """llama.cpp runs the base with the adapter file and computes the logits of peft's own merge of the adapter
    (the fixture's reference model, saved by peft), within f32's tolerance; the base alone is far from them."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(CASE / "reference", dtype=torch.float32)
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    options = unshard.OutputOptions(gguf="f32")
    unshard.convert(SRC, tmp_path / "m.gguf", output=options, lora="separate", architecture=ARCHITECTURE)

    def distance(logits: torch.Tensor) -> float:
        return ((logits - expected).norm() / expected.norm()).item()

    with_adapter = distance(llama_cpp(tmp_path / "m.gguf", PROMPT, 0, lora=tmp_path / "m-LoRA.gguf")[0])
    alone = distance(llama_cpp(tmp_path / "m.gguf", PROMPT, 0)[0])
    assert with_adapter <= LLAMA_CPP_TOLERANCE["f32"] and alone > 20 * max(with_adapter, 1e-6), (with_adapter, alone)


def test_a_llama_quantize_type_writes_the_adapter_in_f16(tmp_path):
    code, _, err = run_cli(
        "convert", SRC, tmp_path / "m.gguf", "--gguf-type", "q4_0", "--lora", "separate",
        "--architecture", ARCHITECTURE, "--no-progress",
    )  # fmt: skip
    assert code == 0 and "the LoRA adapter in f16" in err and "kept apart in llama.cpp's adapter file" in err, err
    assert {t[1] for t in contents(tmp_path / "m-LoRA.gguf")[1]} == {"F16"}


def test_an_adapter_llama_cpp_cannot_hold_is_one_line(tmp_path):
    """rsLoRA scales by alpha / sqrt(r), which llama.cpp's adapter cannot say: refused, nothing written."""
    src = tmp_path / "global_step_1"
    shutil.copytree(SRC, src)
    meta = src / "actor" / "lora_train_meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "use_rslora": True}))
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = run_cli(
        "convert", src, out / "m.gguf", "--lora", "separate", "--architecture", ARCHITECTURE, "--no-progress"
    )
    assert code == 1 and "cannot be a llama.cpp adapter file (rsLoRA" in err and len(err.strip().splitlines()) == 1
    assert not list(out.iterdir())

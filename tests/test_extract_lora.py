"""`unshard extract-lora` writes the adapter mergekit-extract-lora writes for the same pair, from any layout
unshard reads, and peft loads it onto the base.

mergekit runs from PyPI in its own venv (tests/fixtures/generate.py's peer venvs). The pairs: a tiny Llama
and (a) the same model with a peft LoRA merged into it (a task vector of rank 4 on three modules), (b) a
copy moved by full-rank noise (test_merge's models).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import generate
import pytest
import torch
from conftest import SHIPPED
from safetensors.torch import load_file
from test_cli_and_errors import run_cli
from test_merge import lora_adapter, models, perturbed_copy  # noqa: F401  (fixtures)

import unshard

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


@pytest.fixture(scope="session")
def pair(models, lora_adapter) -> dict[str, Path]:
    """test_merge's tiny Llama, a peft LoRA merged into it (rank 4 on q, v and down), and its noisy copy."""
    return {"base": models / "base", "lora-tuned": lora_adapter / "peft-merged", "noise-tuned": models / "ft0"}


def mergekit_extract(tuned: Path, base: Path, out: Path, *flags: str) -> None:
    tool = generate.peer_python("mergekit").parent / "mergekit-extract-lora"
    # (absolute paths: its model card asks the Hub about any path that could be a repository id)
    done = subprocess.run(
        [
            str(tool),
            "--model",
            str(tuned.resolve()),
            "--base-model",
            str(base.resolve()),
            "--out-path",
            str(out),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]


def logits(model, ids=torch.tensor([[1, 5, 9, 17, 33, 65, 100]])) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


CASES = {  # mergekit's flags -> unshard's
    "rank 8": (["--max-rank", "8"], dict(rank=8)),
    "rank 2, S on A": (["--max-rank", "2", "--no-distribute-scale"], dict(rank=2, distribute_scale=False)),
    "embeddings as LoRA, attention left out": (
        ["--max-rank", "6", "--embed-lora", "-e", "self_attn"],
        dict(rank=6, embed_lora=True, exclude=("self_attn",)),
    ),
}


@pytest.mark.parametrize("tuned", ["lora-tuned", "noise-tuned"])
@pytest.mark.parametrize("case", list(CASES))
def test_same_adapter_as_mergekit(case, tuned, pair, tmp_path):
    theirs_flags, ours = CASES[case]
    mergekit_extract(pair[tuned], pair["base"], tmp_path / "mergekit", *theirs_flags)
    unshard.extract_lora(pair[tuned], pair["base"], tmp_path / "unshard", progress=False, verify=True, **ours)
    expected, got = (load_file(tmp_path / x / "adapter_model.safetensors") for x in ("mergekit", "unshard"))
    assert sorted(got) == sorted(expected)
    for key, tensor in expected.items():
        assert got[key].shape == tensor.shape and got[key].dtype == tensor.dtype, key
        if "_A" in key:  # the factors are the SVD's, up to each singular vector's sign: compare B @ A
            b_key = key.replace("_A", "_B")
            product = lambda t: t[b_key] @ t[key] if "embedding" not in key else (t[b_key] @ t[key]).T  # noqa: E731, B023 (used at once)
            torch.testing.assert_close(product(got), product(expected), atol=1e-6, rtol=0, msg=key)
        elif "_B" not in key:  # saved whole
            assert torch.equal(got[key], tensor), key
    config, their_config = (
        json.loads((tmp_path / x / "adapter_config.json").read_text()) for x in ("unshard", "mergekit")
    )
    for key in ("r", "lora_alpha", "rank_pattern", "alpha_pattern", "modules_to_save", "peft_type", "use_rslora"):
        assert config[key] == their_config[key], key
    assert sorted(config["target_modules"]) == sorted(their_config["target_modules"])


def test_peft_loads_it_and_the_errors_are_reported(pair, tmp_path):
    """peft puts the adapter on the base: a rank-4 task vector extracted at rank 4 gives the fine-tune back
    (errors ~1e-7 reported); full-rank noise cut to rank 8 leaves a reported error, and logits further off."""
    base = lambda: transformers.AutoModelForCausalLM.from_pretrained(pair["base"])  # noqa: E731, B023 (used at once)
    distances = {}
    for tuned, rank in (("lora-tuned", 4), ("noise-tuned", 8)):
        out = tmp_path / tuned
        code, _, err = run_cli("extract-lora", pair[tuned], pair["base"], out, "--rank", str(rank))
        assert code == 0, err
        loaded = peft.PeftModel.from_pretrained(base(), out)
        want = logits(transformers.AutoModelForCausalLM.from_pretrained(pair[tuned]))
        distances[tuned] = (logits(loaded) - want).abs().max().item()
        card = (out / "README.md").read_text()
        errors = {m: float(e) for m, e in re.findall(r"^\| (model\.\S+) \| \d+ \| (\S+) \|$", card, re.M)}
        assert len(errors) == 21 and "relative reconstruction error: mean" in err
        if tuned == "lora-tuned":
            assert max(errors.values()) < 1e-5
        else:
            assert min(errors.values()) > 0.3  # noise has no rank-8 structure
        assert card.startswith("---\nlibrary_name: peft\n")
    # measured: 2.5e-7 for the rank-4 pair (the fine-tune itself), 0.64 for the noise cut to rank 8
    print("max |logits - fine-tune's|:", distances)
    assert distances["lora-tuned"] < 1e-4 < distances["noise-tuned"], distances


def test_from_a_sharded_checkpoint(tmp_path):
    """The fine-tune as an FSDP checkpoint gives the adapter its conversion gives, bit for bit."""
    fixture = SHIPPED / "llama-fsdp2"
    unshard.convert(fixture / "global_step_1", tmp_path / "converted", progress=False)
    base = perturbed_copy(fixture / "reference", tmp_path / "base", seed=4)
    for label, tuned in (("sharded", fixture / "global_step_1"), ("converted", tmp_path / "converted")):
        unshard.extract_lora(tuned, base, tmp_path / f"adapter-{label}", rank=4, progress=False)
    a, b = (load_file(tmp_path / f"adapter-{x}" / "adapter_model.safetensors") for x in ("sharded", "converted"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_bad_input_is_one_line(pair, tmp_path):
    def fails(expected, *args, lines=1):
        code, _, err = run_cli("extract-lora", *args)
        assert code == 1 and expected in err.splitlines()[-1] and err.count("\n") == lines, err

    out = tmp_path / "out"
    fails("--rank 0: give a rank of 1 or more", pair["lora-tuned"], pair["base"], out, "--rank", "0")
    fails("no module left to extract", pair["lora-tuned"], pair["base"], out, "-i", "nothing-matches")
    fails("not a regular expression", pair["lora-tuned"], pair["base"], out, "-e", "(")
    fails("no such model folder", tmp_path / "nowhere", pair["base"], out)
    other = tmp_path / "other"
    transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        )
    ).save_pretrained(other)
    fails("only modules of equal shapes are extracted", pair["lora-tuned"], other, out)
    assert not out.exists()
    out.mkdir()
    (out / "keep").write_text("x")
    fails(
        "already exists and is not empty", pair["lora-tuned"], pair["base"], out, "--rank", "2", lines=2
    )  # (after the line saying the dtype, as convert and merge)
    assert [p.name for p in out.iterdir()] == ["keep"]


def test_bias_differences(tmp_path):
    """Qwen2's q/k/v biases: their difference is written as lora_B.bias, as mergekit writes it, and said so;
    peft's merged model has the fine-tune's weights (every rank kept) and, without lora_bias, the base's biases."""
    reference = SHIPPED / "qwen2-fsdp2" / "reference"
    base = perturbed_copy(reference, tmp_path / "base", seed=6)
    code, _, err = run_cli("extract-lora", reference, base, tmp_path / "adapter", "--rank", "10000")
    assert code == 0 and "lora_B.bias, as mergekit writes them" in err, err
    written = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    tuned, original = load_file(reference / "model.safetensors"), load_file(base / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.bias"
    assert torch.equal(
        written[f"base_model.model.{name.removesuffix('.bias')}.lora_B.bias"], tuned[name] - original[name]
    )
    model = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base), tmp_path / "adapter"
    )
    merged = model.merge_and_unload().state_dict()
    for key, tensor in tuned.items():
        torch.testing.assert_close(
            merged[key], original[key] if key.endswith(".bias") else tensor, atol=1e-5, rtol=0, msg=key
        )

"""ColossalAI checkpoints: a step saved by its Booster as Colossal-LLaMA's and ColossalChat's trainers lay it out,
save_model's other ways (safetensors shards, one file), and a LoRA adapter saved by save_lora_as_pretrained, all
made by ColossalAI 0.5.0 itself under torchrun (tests/fixtures/make_colossalai.py, in a peer venv of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_hf_pickles import Payload, one_line_error, run


@pytest.fixture
def case(fixture_case) -> Path:
    """The shipped fixture, and one made now by ColossalAI (the colossalai peer venv)."""
    return fixture_case("colossalai-ddp")


def assert_same_weights(folder: Path, reference: Path) -> None:
    mine, theirs = load_file(folder / "model.safetensors"), load_file(reference / "model.safetensors")
    assert sorted(mine) == sorted(theirs)
    for name, tensor in theirs.items():
        assert mine[name].dtype == tensor.dtype and torch.equal(mine[name], tensor), name


def test_a_trainer_step_converts_exactly(case, tmp_path):
    import transformers

    done = run("inspect", case / "epoch-0_step-1")
    assert "layout       colossalai" in done.stdout and "modeling/, 3 file(s) of pickles" in done.stdout
    assert "step            1" in done.stdout
    out = tmp_path / "out"
    run("convert", case / "epoch-0_step-1", out, "--config-from", case / "hf", "--verify", "--no-progress")
    assert_same_weights(out, case / "reference")
    assert (out / "tokenizer.json").is_file() and not list(out.glob("*.bin"))
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    expected = transformers.AutoModelForCausalLM.from_pretrained(case / "reference")
    assert torch.equal(model(ids).logits, expected(ids).logits)


@pytest.mark.parametrize("saved", ["safetensors", "unsharded/model.pt", "unsharded/model.safetensors"])
def test_each_way_save_model_writes(saved, case, tmp_path):
    out = tmp_path / "out"
    run("convert", case / saved, out, "--config-from", case / "hf", "--verify", "--no-progress")
    assert_same_weights(out, case / "reference")


def test_a_lora_step_says_how_to_fold_it_and_the_fold_is_peft_s(case, tmp_path):
    step = case / "lora" / "epoch-0_step-1"
    line = one_line_error(run("convert", step, tmp_path / "out", ok=False))
    assert "save_lora_as_pretrained" in line and f"BASE+{step / 'modeling'}" in line
    assert not (tmp_path / "out").exists()
    # what the message says to do: the adapter (peft's pickled adapter_model.bin) folded onto its base
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"merge_method: linear\ndtype: float32\nmodels:\n"
        f"  - model: {case / 'lora' / 'base'}+{step / 'modeling'}\n    parameters: {{weight: 1.0}}\n"
    )
    run("merge", recipe, tmp_path / "merged", "--no-progress")
    assert_same_weights(tmp_path / "merged", case / "lora" / "reference")


def test_a_pickled_adapter_that_runs_code_is_refused(case, tmp_path):
    import pickle
    import shutil

    adapter = tmp_path / "modeling"
    shutil.copytree(case / "lora" / "epoch-0_step-1" / "modeling", adapter)
    Payload.marker = tmp_path / "pwned"
    (adapter / "adapter_model.bin").write_bytes(pickle.dumps({"base_model.model.x.lora_A.weight": Payload()}))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"merge_method: linear\nmodels:\n  - model: {case / 'lora' / 'base'}+{adapter}\n"
        "    parameters: {weight: 1.0}\n"
    )
    assert "adapter_model.bin" in one_line_error(run("merge", recipe, tmp_path / "merged", ok=False))
    assert not Payload.marker.exists() and not (tmp_path / "merged").exists()

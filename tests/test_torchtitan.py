"""A torchtitan checkpoint converts to exactly what torchtitan's own to_hf adapter makes, and the
folder's logits match torchtitan's forward pass."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import unshard
from conftest import SHIPPED
from generate import CASES
from test_cli_and_errors import run_cli

transformers = pytest.importorskip("transformers")
CASE = "torchtitan-llama3-fsdp2"


def check(fixture, out):
    case = CASES[CASE]
    result = unshard.convert(fixture / case.src, out, config_from=fixture / case.config_from, progress=False,
                             verify=True)
    expected = load_file(fixture / "reference" / "model.safetensors")
    written = load_file(out / "model.safetensors")
    assert sorted(written) == sorted(expected) and result.tensors == len(expected)
    for name, tensor in expected.items():
        assert torch.equal(written[name], tensor), name
    oracle = torch.load(fixture / "reference" / "logits.pt")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        logits = model.eval()(oracle["tokens"]).logits
    torch.testing.assert_close(logits, oracle["logits"], atol=1e-5, rtol=0)


def test_shipped_checkpoint(tmp_path):
    check(SHIPPED / CASE, tmp_path / "out")


def test_freshly_generated_checkpoint(fresh_fixtures, tmp_path):
    check(fresh_fixtures(CASE), tmp_path / "out")


def test_needs_the_config_for_head_counts(tmp_path):
    code, out, _ = run_cli("inspect", SHIPPED / CASE / "checkpoint" / "step-1")
    assert code == 0 and "tok_embeddings.weight" not in out and "pass --config-from" in out
    code, _, err = run_cli("convert", SHIPPED / CASE / "checkpoint" / "step-1", tmp_path / "out")
    assert code == 1 and "--config-from" in err and not (tmp_path / "out").exists()

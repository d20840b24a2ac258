"""Block-FP8 releases (DeepSeek-V3/R1, Kimi K2, Qwen3 FP8) as sources: each FP8 weight read dequantized as
DeepSeek's weight_dequant computes it, a band of blocks at a time, into the bf16 folder a user would have had
from a bf16 release; bad inputs are one line. The release is tests/fixtures/make_fp8_release.py's (shipped, and
made afresh here): a Qwen3 saved by transformers, its Linear weights stored in DeepSeek's block layout."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import FIXTURES, SHIPPED
from safetensors.torch import load_file, save_file
from test_cli_and_errors import leftovers, run_cli

import unshard
from unshard.sources import dequantized, fp8_blocks

SHIPPED_RELEASE = SHIPPED / "qwen3-fp8-blocks"


@pytest.fixture(scope="module", params=["shipped", "fresh"])
def release(request, tmp_path_factory):
    if request.param == "shipped":
        return SHIPPED_RELEASE
    made = tmp_path_factory.mktemp("fp8") / "qwen3-fp8-blocks"
    done = subprocess.run(
        [sys.executable, str(FIXTURES / "make_fp8_release.py"), str(made)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return made


def dequantized_by_the_formula(values: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """DeepSeek's weight_dequant, block by block: each element times its block's scale in float32, in bfloat16."""
    out = torch.empty(values.shape, dtype=torch.bfloat16)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            rows, cols = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            out[rows, cols] = (values[rows, cols].float() * scales[i, j]).to(torch.bfloat16)
    return out


def test_release_converts_to_the_weights_deepseek_dequant_gives(release, tmp_path):
    transformers = pytest.importorskip("transformers")
    stored = load_file(release / "release" / "model.safetensors")
    block = json.loads((release / "release" / "config.json").read_text())["quantization_config"]["weight_block_size"]
    out = tmp_path / "out"
    unshard.convert(release / "release", out, progress=False, verify=True)
    written = load_file(out / "model.safetensors")
    expected = {
        name: dequantized_by_the_formula(t, stored[name.removesuffix(".weight") + ".weight_scale_inv"], block[0])
        if t.dtype == torch.float8_e4m3fn
        else t
        for name, t in stored.items()
        if not name.endswith("weight_scale_inv")
    }
    assert sorted(written) == sorted(expected)
    assert sum(t.dtype == torch.float8_e4m3fn for t in stored.values()) == 14  # (q, k, v, o, gate, up, down per layer)
    for name, tensor in expected.items():
        assert written[name].dtype == torch.bfloat16 and torch.equal(written[name], tensor), name
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    # transformers loads it as the bf16 model it is; its logits are the original's but for FP8's rounding
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values())
    original = transformers.AutoModelForCausalLM.from_pretrained(release / "reference")
    tokens = torch.arange(1, 17).reshape(1, -1)
    with torch.no_grad():
        ours, theirs = model(tokens).logits.float(), original(tokens).logits.float()
    assert (ours - theirs).abs().max() / theirs.abs().max() < 0.1


def test_bands_of_blocks_give_the_whole_tensor(tmp_path, monkeypatch):
    """Memory follows a band of whole blocks of rows: a band of one block row writes the same bytes."""
    whole = tmp_path / "whole"
    unshard.convert(SHIPPED_RELEASE / "release", whole, progress=False)
    monkeypatch.setattr(dequantized.DequantizedFolder, "BAND_BYTES", 64 * 4)
    plan = unshard.plan(SHIPPED_RELEASE / "release")
    weight = "model.layers.0.mlp.down_proj.weight"
    assert plan.checkpoint.band_rows(weight) == 32 and plan.checkpoint.flat_pieces(weight) is None
    banded = tmp_path / "banded"
    unshard.convert(SHIPPED_RELEASE / "release", banded, progress=False)
    assert (banded / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()


def test_requantized_to_another_scheme(tmp_path):
    """From an FP8 release to compressed-tensors' FP8_DYNAMIC (what vLLM serves), in one pass: the config says the
    new scheme only, and each weight is quantized from the dequantized bf16 one."""
    out = tmp_path / "fp8-dynamic"
    unshard.convert(SHIPPED_RELEASE / "release", out, quantize="FP8_DYNAMIC", progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    assert "model.layers.0.mlp.down_proj.weight_scale" in load_file(out / "model.safetensors")


@pytest.mark.parametrize("damage", ["missing scale", "block size", "scale dtype"])
def test_a_damaged_release_is_one_line(damage, tmp_path):
    src = tmp_path / "release"
    shutil.copytree(SHIPPED_RELEASE / "release", src)
    tensors = load_file(src / "model.safetensors")
    scale = "model.layers.1.self_attn.o_proj.weight_scale_inv"
    if damage == "missing scale":
        del tensors[scale]
        expected = "model.layers.1.self_attn.o_proj.weight is float8_e4m3fn without its"
    elif damage == "scale dtype":
        tensors[scale] = tensors[scale].to(torch.bfloat16)
        expected = f"{scale} is bfloat16 [2, 2], not the float32 [2, 2] that blocks of 32 x 32"
    else:
        config = json.loads((src / "config.json").read_text())
        config["quantization_config"]["weight_block_size"] = [48, 32]
        (src / "config.json").write_text(json.dumps(config))
        rows = math.ceil(64 / 48)
        expected = f"not the float32 [{rows}, 2] that blocks of 48 x 32"
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli("convert", src, tmp_path / "out")
    assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)

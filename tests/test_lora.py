"""LoRA adapters trained under FSDP2 (peft, sharded by torch, saved as verl does): kept as a PEFT folder.

Cases: plain LoRA on linear layers (verl's rank files, and through DCP); DoRA on linear layers and
the embedding, with lm_head in modules_to_save. Folding them in (`--lora merge`) is checked against peft's
merge_and_unload with the other reference cases in test_fsdp_convert.py, bit for bit.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHIPPED
from generate import CASES
from safetensors.torch import load_file

import unshard


@pytest.mark.parametrize("name", ["llama-fsdp2-lora", "llama-fsdp2-dora", "llama-fsdp2-lora-dcp"])
def test_lora_separate_writes_what_peft_saves(name, fixture_case, tmp_path):
    import peft
    import transformers

    case = fixture_case(name)
    out = tmp_path / "out"
    config_from = case / CASES[name].config_from if CASES[name].config_from else None
    unshard.convert(case / CASES[name].src, out, lora="separate", verify=True, progress=False, config_from=config_from)

    # The adapter: peft's own save_pretrained of the same model is the reference, name for name.
    theirs = case / "reference-adapter"
    written, expected = (
        load_file(out / "lora_adapter" / "adapter_model.safetensors"),
        load_file(theirs / "adapter_model.safetensors"),
    )
    assert written.keys() == expected.keys()
    assert all(torch.equal(written[n], t) for n, t in expected.items())
    config, peft_config = (json.loads((f / "adapter_config.json").read_text()) for f in (out / "lora_adapter", theirs))
    for key in ("peft_type", "r", "lora_alpha", "use_rslora", "use_dora", "task_type", "bias", "modules_to_save"):
        assert config[key] == peft_config[key], key
    assert sorted(config["target_modules"]) == sorted(peft_config["target_modules"])

    # The base: weights as trained, no LoRA names; base + adapter through peft = peft's own merge.
    base_weights = load_file(out / "model.safetensors")
    assert not any(part in n for n in base_weights for part in ("lora", "base_layer", "modules_to_save", "original"))
    merged_reference = load_file(case / "reference" / "model.safetensors")
    assert not torch.equal(
        base_weights["model.layers.0.self_attn.q_proj.weight"],
        merged_reference["model.layers.0.self_attn.q_proj.weight"],
    )
    model = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(out), out / "lora_adapter")
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    reference = transformers.AutoModelForCausalLM.from_pretrained(case / "reference")
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-5, rtol=0)
    merged = model.merge_and_unload().state_dict()
    assert all(torch.allclose(merged[n], t, atol=1e-5, rtol=0) for n, t in merged_reference.items())
    assert "kept apart in lora_adapter/" in (out / "README.md").read_text()
    assert not (out / "model.safetensors.index.json").exists()  # the adapter's file is not a model shard


def test_lora_separate_needs_an_adapter(tmp_path):
    with pytest.raises(unshard.CheckpointError, match="holds no LoRA adapter"):
        unshard.plan(SHIPPED / "llama-fsdp2" / "global_step_1", lora="separate")

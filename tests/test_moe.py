"""`unshard merge-moe` assembles the mixture of experts mergekit-moe assembles from the same recipe, reading the
base model in place from a sharded checkpoint, and transformers runs it.

mergekit-moe runs from PyPI in its own venv (tests/fixtures/generate.py's peer venvs) on Hugging Face folders:
the conversion of a shipped FSDP2 checkpoint (a Llama with a SentencePiece tokenizer, a Qwen2 with a BPE one,
a Megatron Qwen3) and two "fine-tunes" of it made by perturbing its weights. mergekit 0.1.5 writes the experts
fused (transformers 5's layout), unshard as the Hub's checkpoints name them: the comparison fuses ours.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import generate
import pytest
import torch
import yaml
from conftest import SHIPPED
from safetensors.torch import load_file
from test_cli_and_errors import leftovers, run_cli
from test_merge import models, perturbed_copy  # noqa: F401  (fixtures)
from test_quantize import as_llm_compressor_names, assert_same_files, oracle  # noqa: F401  (oracle: a fixture)

import unshard

transformers = pytest.importorskip("transformers")

FAMILIES = {  # family -> the checkpoint unshard reads the base from, in place
    "llama": SHIPPED / "llama-fsdp2-spm" / "global_step_1" / "actor",
    "qwen2": SHIPPED / "qwen2-fsdp2" / "global_step_1" / "actor",
    "qwen3": SHIPPED / "megatron-qwen3-tp2-dp2" / "torch_dist",
}
# (a Megatron checkpoint has no config.json: its conversion's, made from Megatron's arguments, holds fields
# the MoE's config keeps that one made again in the merge does not; so both read the conversion there)
IN_PLACE = {"llama", "qwen2"}
PROMPTS = {"ft0": (["the cat sat on the mat", "hello world"], ["1 2 3"]), "ft1": (["1 2 3 4 5", "a b c"], [])}


@pytest.fixture(scope="session")
def dense(tmp_path_factory) -> dict[str, Path]:
    """Per family: its conversion (`base`) and two perturbed copies (`ft0`, `ft1`), in one folder."""
    root = tmp_path_factory.mktemp("dense")
    for family, checkpoint in FAMILIES.items():
        unshard.convert(checkpoint, root / family / "base", progress=False)
        for i in range(2):
            perturbed_copy(root / family / "base", root / family / f"ft{i}", seed=300 + i)
    return root


def moe_recipe(path: Path, base: Path, folder: Path, mode: str, shared: bool = False, **extra) -> Path:
    experts = [
        dict(
            source_model=str(folder / name),
            positive_prompts=positive,
            **({"negative_prompts": negative} if negative else {}),
        )
        for name, (positive, negative) in PROMPTS.items()
    ]
    experts[1]["residual_scale"] = 0.5
    recipe = dict(base_model=str(base), gate_mode=mode, experts=experts, **extra)
    if shared:
        recipe["shared_experts"] = [
            dict(source_model=str(folder / "base"), positive_prompts=["shared"], residual_scale=2.0)
        ]
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def mergekit_moe(recipe: Path, out: Path, seed: int) -> None:
    tool = generate.peer_python("mergekit").parent / "mergekit-moe"
    done = subprocess.run(
        [str(tool), str(recipe), str(out), "--random-seed", str(seed)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]


EXPERT = re.compile(r"^(.*\.layers\.\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight$")
PARTS = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}


def as_mergekit_writes(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our checkpoint-layout tensors in the layout mergekit wrote: transformers 5's fused experts (gate and up
    stacked per expert) where it fused them, the router under `mlp.gate`."""
    if not any(name.endswith("experts.gate_up_proj") for name in reference):
        return tensors
    out, experts = {}, {}
    for name, tensor in tensors.items():
        if found := EXPERT.match(name):
            experts.setdefault(found[1], {})[int(found[2]), PARTS[found[3]]] = tensor
        else:
            out[name.replace("block_sparse_moe.gate.", "mlp.gate.")] = tensor
    for layer, parts in experts.items():
        count = 1 + max(e for e, _ in parts)
        out[f"{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([parts[e, "gate"], parts[e, "up"]]) for e in range(count)]
        )
        out[f"{layer}.mlp.experts.down_proj"] = torch.stack([parts[e, "down"] for e in range(count)])
    return out


def logits(folder: Path) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, experts_implementation="eager"
    )
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 9, 22, 40, 7, 3]])).logits


CASES = {  # name -> (family, gate_mode, shared expert)
    "mixtral-cheap_embed": ("llama", "cheap_embed", False),
    "mixtral-hidden": ("llama", "hidden", False),
    "mixtral-random": ("llama", "random", False),
    "qwen_moe-hidden": ("qwen2", "hidden", True),
    "qwen3_moe-uniform_random": ("qwen3", "uniform_random", False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_moe_as_mergekit(case, dense, tmp_path):
    family, mode, shared = CASES[case]
    folder = dense / family
    ours, theirs = tmp_path / "ours", tmp_path / "mergekit"
    mergekit_moe(moe_recipe(tmp_path / "mergekit.yml", folder / "base", folder, mode, shared), theirs, seed=7)
    base = FAMILIES[family] if family in IN_PLACE else folder / "base"
    recipe = moe_recipe(tmp_path / "ours.yml", base, folder, mode, shared)
    code, out, err = run_cli("merge-moe", recipe, ours, "--seed", 7, "--no-progress")
    assert code == 0, err

    reference = load_file(theirs / "model.safetensors")
    mine = as_mergekit_writes(load_file(ours / "model.safetensors"), reference)
    assert sorted(mine) == sorted(reference)
    different = [name for name in mine if not torch.equal(mine[name], reference[name])]
    assert different == []  # every tensor bit for bit, the routers included (measured: hidden mode too)
    config, expected = (json.loads((f / "config.json").read_text()) for f in (ours, theirs))
    assert {k: v for k, v in config.items() if k != "transformers_version"} == {
        k: v for k, v in expected.items() if k != "transformers_version"
    }
    # (the same weights: only the order of transformers' expert sums may differ between two loads)
    assert float((logits(ours) - logits(theirs)).abs().max()) < 1e-5
    assert (ours / "mergekit_moe_config.yml").read_text() == recipe.read_text()
    card = (ours / "README.md").read_text()
    assert mode in card and "- moe" in card.split("---")[1]


def test_quantized_as_llm_compressor_quantizes_the_merge(dense, oracle, tmp_path):
    """`merge-moe --quantize`: the experts made from the Llama fine-tunes (Linear layers 128 columns wide and more)
    quantized each a band at a time, bit for bit as llm-compressor quantizes the MoE unshard writes without it."""
    from unshard.sinks.compressed_tensors import DEFAULT_IGNORE

    recipe = moe_recipe(tmp_path / "recipe.yml", FAMILIES["llama"], dense / "llama", "cheap_embed")
    code, _, err = run_cli("merge-moe", recipe, tmp_path / "plain", "--seed", 7, "--no-progress")
    assert code == 0, err
    code, _, err = run_cli(
        "merge-moe", recipe, tmp_path / "w4a16", "--seed", 7, "--no-progress", "--quantize", "W4A16", "--verify"
    )
    assert code == 0, err
    oracle(
        "quantize",
        [
            {
                "src": str(tmp_path / "plain"),
                "out": str(tmp_path / "oracle"),
                "scheme": "W4A16",
                "ignore": list(DEFAULT_IGNORE),
            }
        ],
        tmp_path,
    )
    assert_same_files(as_llm_compressor_names(tmp_path / "w4a16"), tmp_path / "oracle")


def test_hidden_gates_a_layer_at_a_time(dense, tmp_path, monkeypatch):
    """A base too large to keep is run with each layer loaded when reached and dropped after: the same gates."""
    from unshard.merging import gates

    folder = dense / "llama"
    recipe = moe_recipe(tmp_path / "moe.yml", folder / "base", folder, "hidden")
    unshard.merge_moe(recipe, tmp_path / "kept", progress=False)
    loads = []
    original = gates._LayerByLayer._load
    monkeypatch.setattr(gates, "KEEP_LAYERS_BYTES", 0)
    monkeypatch.setattr(
        gates._LayerByLayer,
        "_load",
        lambda self, module, prefix: (loads.append(prefix), original(self, module, prefix)),
    )
    unshard.merge_moe(recipe, tmp_path / "dropped", progress=False)
    kept, dropped = (load_file(tmp_path / f / "model.safetensors") for f in ("kept", "dropped"))
    assert all(torch.equal(kept[k], dropped[k]) for k in kept)
    layers = [p for p in loads if ".layers." in p]
    groups = sum(1 + bool(negative) for _, negative in PROMPTS.values())
    assert len(layers) == 2 * groups  # every layer loaded again for each prompt group: none kept


def test_noise_is_seeded(dense, tmp_path):
    folder = dense / "llama"
    recipe = moe_recipe(tmp_path / "moe.yml", folder / "base", folder, "random")
    data = yaml.safe_load(recipe.read_text())
    data["experts"][0]["noise_scale"] = 0.01
    recipe.write_text(yaml.safe_dump(data))
    made = {}
    for label, seed in (("a", 1), ("b", 1), ("c", 2)):
        unshard.merge_moe(recipe, tmp_path / label, seed=seed, progress=False, output=unshard.OutputOptions("float32"))
        made[label] = load_file(tmp_path / label / "model.safetensors")
    name = "model.layers.0.block_sparse_moe.experts.0.w1.weight"
    assert torch.equal(made["a"][name], made["b"][name]) and not torch.equal(made["a"][name], made["c"][name])
    dense_weight = load_file(folder / "ft0" / "model.safetensors")["model.layers.0.mlp.gate_proj.weight"].float()
    noise = made["a"][name] - dense_weight
    assert 0.008 < float(noise.std()) < 0.012  # noise_scale times standard normal draws (bf16 rounding aside)
    untouched = "model.layers.0.block_sparse_moe.experts.1.w1.weight"
    assert torch.equal(made["a"][untouched], made["c"][untouched])


def test_dry_run_and_errors(dense, models, tmp_path):  # noqa: F811
    folder = dense / "llama"
    recipe = moe_recipe(tmp_path / "moe.yml", FAMILIES["llama"], folder, "hidden")
    code, out, err = run_cli("merge-moe", recipe, tmp_path / "out", "--dry-run")
    assert code == 0, err
    assert "Mixtral, 2 experts (2 per token), gate_mode hidden" in out and not (tmp_path / "out").exists()

    good = yaml.safe_load(recipe.read_text())

    def bad(change, expected: str, *flags):
        data = json.loads(json.dumps(good))
        change(data)
        path = tmp_path / "bad.yml"
        path.write_text(yaml.safe_dump(data))
        code, out, err = run_cli("merge-moe", path, tmp_path / "bad-out", *flags)
        assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "bad-out").exists() and not leftovers(tmp_path)

    bad(lambda d: d.update(gate_mode="softmax"), "gate_mode 'softmax': use one of hidden")
    bad(lambda d: d.update(experts_per_token=3), "2 expert(s) for experts_per_token 3")
    bad(lambda d: d.update(modules=[]), "unknown key 'modules'")
    bad(lambda d: d["experts"][1].pop("positive_prompts"), "experts[1] has no positive_prompts")
    bad(
        lambda d: [e.update(positive_prompts=["same"], negative_prompts=[]) for e in d["experts"]],
        "every expert has the same prompts",
    )
    bad(
        lambda d: [e.update(source_model=str(folder / "ft0")) for e in d["experts"]],
        "--i-understand-this-is-not-useful-without-training",
    )
    bad(lambda d: d.update(architecture="deepseek"), "architecture 'deepseek': use one of Mixtral, Qwen MoE")
    bad(
        lambda d: d.update(shared_experts=[dict(source_model=str(folder / "base"), positive_prompts=["x"])] * 2),
        "no MoE architecture takes these models",
    )
    bad(lambda d: d["experts"][0].update(source_model=str(dense / "qwen2" / "ft0")), "no MoE architecture takes")
    bad(
        lambda d: d.update(
            base_model=str(models / "base"),
            experts=[dict(source_model=str(models / f"ft{i}"), positive_prompts=[f"p{i}"]) for i in range(2)],
        ),
        "has no tokenizer",
    )
    bad(lambda d: d["experts"][0].update(residual_scale="half"), "experts[0].residual_scale must be a number")
    # The same experts are allowed when asked for.
    same = json.loads(json.dumps(good))
    for expert in same["experts"]:
        expert["source_model"] = str(folder / "ft0")
    (tmp_path / "same.yml").write_text(yaml.safe_dump(same))
    code, out, err = run_cli(
        "merge-moe",
        tmp_path / "same.yml",
        tmp_path / "same",
        "--no-progress",
        "--i-understand-this-is-not-useful-without-training",
    )
    assert code == 0, err

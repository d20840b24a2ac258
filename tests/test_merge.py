"""`unshard merge` computes what mergekit computes for the same recipe, from any layout unshard reads.

mergekit runs from PyPI in its own virtual environment (made once per session), on Hugging Face
folders written by transformers: a tiny Llama and three fine-tunes made by perturbing it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import generate
import pytest
import torch
import yaml
from conftest import SHIPPED
from safetensors.torch import load_file, save_file
from test_cli_and_errors import run_cli

import unshard

transformers = pytest.importorskip("transformers")


def perturbed_copy(src: Path, dest: Path, seed: int, scale: float = 0.02) -> Path:
    """A 'fine-tune': the same folder with every weight moved by seeded noise."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    for path in src.glob("*.safetensors"):
        tensors = load_file(path)
        save_file(
            {k: (v + torch.randn(v.shape, generator=generator) * scale).to(v.dtype) for k, v in tensors.items()},
            dest / path.name,
            metadata={"format": "pt"},
        )
    return dest


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "base")
    for i in range(3):
        perturbed_copy(root / "base", root / f"ft{i}", seed=100 + i)
    return root


@pytest.fixture(scope="session")
def mergekit() -> Path:
    """mergekit-yaml from PyPI, in a venv of its own (tests/fixtures/generate.py's peer venvs)."""
    return generate.peer_python("mergekit").parent / "mergekit-yaml"


def write_recipe(path: Path, recipe: dict) -> Path:
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def run_mergekit(mergekit: Path, recipe: Path, out: Path) -> dict[str, torch.Tensor]:
    cache = out.parent / "lora-merge-cache"  # where mergekit folds `base+adapter` models first
    done = subprocess.run(
        [str(mergekit), str(recipe), str(out), "--lora-merge-cache", str(cache)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return load_file(out / "model.safetensors")


def recipes(m: Path) -> dict[str, dict]:
    base, ft = str(m / "base"), [str(m / f"ft{i}") for i in range(3)]
    return {
        "linear": dict(
            merge_method="linear",
            models=[
                dict(model=ft[0], parameters=dict(weight=0.5)),
                dict(model=ft[1], parameters=dict(weight=[0.1, 1.0])),
                dict(model=ft[2], parameters=dict(weight=0.3)),
            ],
        ),
        "linear-unnormalized": dict(
            merge_method="linear",
            parameters=dict(normalize=False),
            models=[dict(model=ft[0], parameters=dict(weight=0.5)), dict(model=ft[1], parameters=dict(weight=0.25))],
        ),
        "task_arithmetic": dict(
            merge_method="task_arithmetic",
            base_model=base,
            parameters={"lambda": 0.8},
            models=[dict(model=ft[0], parameters=dict(weight=0.7)), dict(model=ft[1], parameters=dict(weight=-0.2))],
        ),
        "ties": dict(
            merge_method="ties",
            base_model=base,
            parameters=dict(normalize=True),
            models=[
                dict(model=base),
                dict(model=ft[0], parameters=dict(weight=0.6, density=0.5)),
                dict(model=ft[1], parameters=dict(weight=[0.2, 0.8], density=0.7)),
                dict(
                    model=ft[2],
                    parameters=dict(weight=[dict(filter="self_attn", value=0.9), dict(value=0.3)], density=0.4),
                ),
            ],
        ),
        "slerp": dict(
            merge_method="slerp",
            base_model=base,
            models=[dict(model=base), dict(model=ft[0])],
            parameters=dict(t=[dict(filter="mlp", value=[0.0, 0.7]), dict(value=0.35)]),
        ),
        "model_stock": dict(
            merge_method="model_stock",
            base_model=base,
            models=[dict(model=ft[0]), dict(model=ft[1]), dict(model=ft[2])],
        ),
    }


def banded(monkeypatch, rows: int = 5) -> None:
    """Merge every tensor of more than `rows` rows of 64 floats (fewer of wider rows) a band at a time, as
    tensors larger than MergedCheckpoint.BAND_BYTES are: the test models are far smaller."""
    from unshard.merging import MergedCheckpoint

    monkeypatch.setattr(MergedCheckpoint, "BAND_BYTES", rows * 64 * 4)


@pytest.mark.parametrize("name", ["linear", "linear-unnormalized", "task_arithmetic", "ties", "slerp", "model_stock"])
def test_same_result_as_mergekit(name, models, mergekit, tmp_path, monkeypatch):
    recipe = write_recipe(tmp_path / "recipe.yml", {**recipes(models)[name], "dtype": "float32"})
    expected = run_mergekit(mergekit, recipe, tmp_path / "mergekit")
    result = unshard.merge(recipe, tmp_path / "unshard", progress=False, verify=True)
    merged = load_file(tmp_path / "unshard" / "model.safetensors")
    assert sorted(merged) == sorted(expected) and result.tensors == len(expected)
    for key, tensor in expected.items():
        assert merged[key].dtype == tensor.dtype, key
        torch.testing.assert_close(merged[key], tensor, atol=1e-5, rtol=0, msg=key)
    base = load_file(models / "base" / "model.safetensors")
    assert any(not torch.equal(merged[k], base[k]) for k in base)  # the merge did something

    # A band at a time: the same model (bit for bit where nothing is summed over the whole tensor).
    from unshard.merging import plan_merge

    banded(monkeypatch)
    plan = plan_merge(recipe)
    assert all(
        plan.checkpoint.band_rows(n) for n in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight")
    )
    plan.checkpoint.close()
    unshard.merge(recipe, tmp_path / "banded", progress=False, verify=True, threads=2)
    in_bands = load_file(tmp_path / "banded" / "model.safetensors")
    for key, tensor in merged.items():
        if name in ("slerp", "model_stock"):  # angles summed band by band, in another order
            torch.testing.assert_close(in_bands[key], tensor, atol=1e-6, rtol=0, msg=key)
        else:
            assert torch.equal(in_bands[key], tensor), key


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_dare_statistics_and_reproducibility(method, models, mergekit, tmp_path, monkeypatch):
    """DARE drops at random: the kept fraction and the L1 rescale match mergekit's; a seed repeats."""
    density = 0.3
    recipe = write_recipe(
        tmp_path / "recipe.yml",
        dict(
            merge_method=method,
            base_model=str(models / "base"),
            dtype="float32",
            models=[dict(model=str(models / "ft0"), parameters=dict(weight=1.0, density=density))],
        ),
    )
    expected = run_mergekit(mergekit, recipe, tmp_path / "mergekit")
    unshard.merge(recipe, tmp_path / "a", progress=False, seed=7)
    unshard.merge(recipe, tmp_path / "b", progress=False, seed=7)
    unshard.merge(recipe, tmp_path / "c", progress=False, seed=8)
    banded(monkeypatch, rows=7)  # each band draws its own, and the rescale is the whole tensor's
    unshard.merge(recipe, tmp_path / "d", progress=False, seed=7, threads=2)
    unshard.merge(recipe, tmp_path / "e", progress=False, seed=7, verify=True)
    a, b, c, d, e = (load_file(tmp_path / x / "model.safetensors") for x in "abcde")
    base, tuned = load_file(models / "base" / "model.safetensors"), load_file(models / "ft0" / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    assert all(torch.equal(a[k], b[k]) for k in a) and all(torch.equal(d[k], e[k]) for k in d)
    assert not torch.equal(a[name], c[name]) and not torch.equal(a[name], d[name])
    for merged in (a, d, expected):
        delta = merged[name] - base[name]
        kept = (delta != 0).float().mean().item()
        assert abs(kept - density) < 0.03
        l1 = delta.abs().sum() / (tuned[name] - base[name]).abs().sum()
        assert abs(l1.item() - 1) < 1e-4  # rescaled to the task vector's L1 norm


def slice_recipes(m: Path) -> dict[str, dict]:
    """Recipes of layer slices, as mergekit users write them (the test models have 3 layers)."""
    base, ft = str(m / "base"), [str(m / f"ft{i}") for i in range(3)]
    return {
        # a frankenmerge: 5 layers from two models, one layer taken twice
        "passthrough": dict(
            merge_method="passthrough",
            slices=[
                dict(sources=[dict(model=base, layer_range=[0, 2])]),
                dict(
                    sources=[
                        dict(
                            model=ft[0],
                            layer_range=[1, 3],
                            parameters=dict(scale=[dict(filter="o_proj", value=0.5), dict(value=1.0)]),
                        )
                    ]
                ),
                dict(sources=[dict(model=ft[1], layer_range=[2, 3])]),
            ],
        ),
        # mergekit's usual SLERP recipe: whole ranges, t a gradient across the slice's layers
        "slerp": dict(
            merge_method="slerp",
            base_model=base,
            parameters=dict(
                t=[
                    dict(filter="self_attn", value=[0.0, 0.5, 1.0]),
                    dict(filter="mlp", value=[1.0, 0.5, 0.0]),
                    dict(value=0.3),
                ]
            ),
            slices=[dict(sources=[dict(model=base, layer_range=[0, 3]), dict(model=ft[0], layer_range=[0, 3])])],
        ),
        # a method per slice's settings: its own base and parameters, layers of other depths
        "ties": dict(
            merge_method="ties",
            base_model=base,
            parameters=dict(density=0.5, weight=0.5),
            slices=[
                dict(
                    sources=[
                        dict(model=base, layer_range=[0, 2]),
                        dict(model=ft[0], layer_range=[0, 2]),
                        dict(model=ft[1], layer_range=[1, 3], parameters=dict(weight=0.8)),
                    ]
                ),
                dict(
                    base_model=ft[2],
                    parameters=dict(density=[0.3, 0.9]),
                    sources=[
                        dict(model=ft[2], layer_range=[1, 3]),
                        dict(model=ft[0], layer_range=[0, 2]),
                        dict(model=base, layer_range=[1, 3]),
                    ],
                ),
            ],
        ),
        "linear": dict(
            merge_method="linear",
            slices=[
                dict(
                    sources=[
                        dict(model=ft[0], layer_range=[0, 1], parameters=dict(weight=1.0)),
                        dict(model=ft[1], layer_range=[2, 3], parameters=dict(weight=3.0)),
                    ]
                ),
                dict(
                    parameters=dict(weight=0.5),
                    sources=[dict(model=ft[1], layer_range=[0, 3]), dict(model=ft[2], layer_range=[0, 3])],
                ),
            ],
        ),
    }


@pytest.mark.parametrize("name", ["passthrough", "slerp", "ties", "linear"])
def test_slices_as_mergekit(name, models, mergekit, tmp_path, monkeypatch):
    """`slices:` recipes give mergekit's model: layers taken from each slice's sources and renumbered,
    parameters per source, per slice and per recipe, gradients across a slice, the embeddings from the first
    slice's models and the norm and head from the last's; config.json counts the layers; transformers loads it."""
    recipe = write_recipe(tmp_path / "recipe.yml", {**slice_recipes(models)[name], "dtype": "float32"})
    expected = run_mergekit(mergekit, recipe, tmp_path / "mergekit")
    unshard.merge(recipe, tmp_path / "unshard", progress=False, verify=True)
    merged = load_file(tmp_path / "unshard" / "model.safetensors")
    assert sorted(merged) == sorted(expected)
    for key, tensor in expected.items():
        torch.testing.assert_close(merged[key], tensor, atol=1e-5, rtol=0, msg=key)
    layers = {"passthrough": 5, "slerp": 3, "ties": 4, "linear": 4}[name]
    config = json.loads((tmp_path / "unshard" / "config.json").read_text())
    theirs = json.loads((tmp_path / "mergekit" / "config.json").read_text())
    assert config["num_hidden_layers"] == theirs["num_hidden_layers"] == layers
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "unshard")
    assert len(model.model.layers) == layers
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "mergekit")
    ids = torch.tensor([[1, 5, 9, 17, 33, 65]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=1e-4, rtol=0)
    if name == "passthrough":  # nothing computed: the layers are the sources', bit for bit
        source = load_file(models / "ft1" / "model.safetensors")
        assert torch.equal(merged["model.layers.4.mlp.up_proj.weight"], source["model.layers.2.mlp.up_proj.weight"])
        assert torch.equal(merged["lm_head.weight"], source["lm_head.weight"])

    banded(monkeypatch)  # a band at a time: the same model
    unshard.merge(recipe, tmp_path / "banded", progress=False)
    in_bands = load_file(tmp_path / "banded" / "model.safetensors")
    for key, tensor in merged.items():
        torch.testing.assert_close(in_bands[key], tensor, atol=1e-6, rtol=0, msg=key)


def test_slices_from_sharded_checkpoints_and_to_gguf(models, tmp_path):
    """Slices of an FSDP checkpoint merge as slices of its conversion; a GGUF file counts the merged layers."""
    fixture = SHIPPED / "llama-fsdp2-spm"  # (a SentencePiece tokenizer, which the GGUF writer takes)
    unshard.convert(fixture / "global_step_1", tmp_path / "converted", progress=False)
    tuned = perturbed_copy(fixture / "reference", tmp_path / "tuned", seed=9)
    count = json.loads((fixture / "reference" / "config.json").read_text())["num_hidden_layers"]
    results = {}
    for label, source in (("sharded", fixture / "global_step_1"), ("converted", tmp_path / "converted")):
        recipe = write_recipe(
            tmp_path / f"{label}.yml",
            dict(
                merge_method="passthrough",
                dtype="float32",
                slices=[
                    dict(sources=[dict(model=str(source), layer_range=[0, count])]),
                    dict(sources=[dict(model=str(tuned), layer_range=[count - 1, count])]),
                ],
            ),
        )
        unshard.merge(recipe, tmp_path / f"merged-{label}", progress=False)
        results[label] = load_file(tmp_path / f"merged-{label}" / "model.safetensors")
    assert sorted(results["sharded"]) == sorted(results["converted"])
    assert all(torch.equal(results["sharded"][k], results["converted"][k]) for k in results["sharded"])
    assert f"model.layers.{count}.self_attn.q_proj.weight" in results["sharded"]

    gguf = pytest.importorskip("gguf")
    unshard.merge(tmp_path / "sharded.yml", tmp_path / "merged.gguf", progress=False)
    reader = gguf.GGUFReader(tmp_path / "merged.gguf")
    field = reader.get_field("llama.block_count")
    assert field.parts[field.data[0]][0] == count + 1
    assert f"blk.{count}.attn_q.weight" in {t.name for t in reader.tensors}


def test_sharded_checkpoint_merges_like_its_conversion(tmp_path):
    """Merging an FSDP checkpoint directly equals converting it first, then merging."""
    fixture = SHIPPED / "llama-fsdp2"
    converted = tmp_path / "converted"
    unshard.convert(fixture / "global_step_1", converted, progress=False)
    tuned = perturbed_copy(fixture / "reference", tmp_path / "tuned", seed=5)
    results = {}
    for label, base in (("sharded", fixture / "global_step_1"), ("converted", converted)):
        recipe = write_recipe(
            tmp_path / f"{label}.yml",
            dict(
                merge_method="ties",
                base_model=str(base),
                dtype="float32",
                models=[dict(model=str(tuned), parameters=dict(weight=0.5, density=0.5))],
            ),
        )
        unshard.merge(recipe, tmp_path / f"merged-{label}", progress=False)
        results[label] = load_file(tmp_path / f"merged-{label}" / "model.safetensors")
    assert sorted(results["sharded"]) == sorted(results["converted"])
    assert all(torch.equal(results["sharded"][k], results["converted"][k]) for k in results["sharded"])
    out = tmp_path / "merged-sharded"
    assert (out / "tokenizer.json").exists() and (out / "mergekit_config.yml").exists()
    assert "ties" in (out / "README.md").read_text() and str(tuned) in (out / "README.md").read_text()
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


@pytest.mark.parametrize("command", ["merge", "merge-moe", "merge-search"])
def test_a_recipe_file_that_cannot_be_read_is_one_line(command, tmp_path):
    """Missing, a folder, not UTF-8 text (a damaged copy), not YAML: the same line for every command's file."""
    extra = ["--eval", str(tmp_path / "eval.txt")] if command == "merge-search" else []
    (tmp_path / "eval.txt").write_text("hello\n")
    (tmp_path / "folder.yml").mkdir()
    (tmp_path / "binary.yml").write_bytes(b"merge_method: \xf7linear\n")
    (tmp_path / "broken.yml").write_text("merge_method: [linear\n")
    for name, expected in (
        ("missing.yml", "file"),
        ("folder.yml", "cannot be read as text"),
        ("binary.yml", "cannot be read as text"),
        ("broken.yml", "not valid YAML"),
    ):
        code, _, err = run_cli(command, tmp_path / name, tmp_path / "out", *extra)
        assert code == 1 and f"{tmp_path / name}: " in err and expected in err and err.count("\n") == 1, err
        assert not (tmp_path / "out").exists()


def test_recipe_errors(models, tmp_path):
    def fails(recipe, expected):
        path = write_recipe(tmp_path / "r.yml", recipe)
        code, _, err = run_cli("merge", path, tmp_path / "out")
        assert code == 1 and expected in err, err
        assert err.count("\n") == 1 and not (tmp_path / "out").exists()

    base, ft0 = str(models / "base"), str(models / "ft0")
    fails(dict(merge_method="frankenmerge", models=[ft0]), "use one of linear, task_arithmetic")
    fails(dict(merge_method="linear", modules={}, models=[ft0]), "unknown key 'modules'")
    fails(dict(merge_method="linear", slices=[], models=[ft0]), "either `models` (whole models) or `slices`")
    fails(
        dict(merge_method="passthrough", slices=[dict(sources=[dict(model=ft0, layer_range=[2, 1])])]),
        "slices[0].sources[0].layer_range must be [start, stop]",
    )
    fails(
        dict(
            merge_method="linear",
            slices=[dict(sources=[dict(model=ft0, layer_range=[0, 2]), dict(model=base, layer_range=[0, 3])])],
        ),
        "every source of a slice spans the same number of layers (got 2, 3)",
    )
    fails(
        dict(merge_method="passthrough", slices=[dict(sources=[dict(model=ft0, layer_range=[1, 4])])]),
        "slices[0].sources[0]: layer_range [1, 4] goes past",
    )
    fails(
        dict(
            merge_method="slerp",
            base_model=base,
            parameters=dict(t=0.5),
            slices=[dict(sources=[dict(model=ft0, layer_range=[0, 3])])],
        ),
        "needs the base model",
    )
    fails(
        dict(
            merge_method="ties",
            base_model=base,
            slices=[dict(sources=[dict(model=base, layer_range=[0, 3]), dict(model=ft0, layer_range=[0, 3])])],
        ),
        "model " + ft0 + " needs parameters.weight for ties",
    )
    fails(
        dict(
            merge_method="passthrough",
            slices=[dict(sources=[dict(model=ft0, layer_range=[0, 1]), dict(model=base, layer_range=[1, 2])])],
        ),
        "passthrough takes exactly 1 model(s) besides the base, got 2",
    )
    fails(dict(merge_method="ties", base_model=base, models=[dict(model=ft0)]), "needs parameters.weight")
    fails(dict(merge_method="slerp", base_model=base, models=[dict(model=ft0)]), "slerp needs parameters.t")
    fails(dict(merge_method="task_arithmetic", models=[dict(model=ft0, parameters=dict(weight=1))]), "needs base_model")
    fails(
        dict(merge_method="linear", models=[dict(model=str(tmp_path / "nowhere"), parameters=dict(weight=1))]),
        "no such model folder",
    )
    other = tmp_path / "other"
    shutil.copytree(models / "ft1", other)
    tensors = load_file(other / "model.safetensors")
    tensors["model.embed_tokens.weight"], tensors["lm_head.weight"] = torch.zeros(130, 64), torch.zeros(130, 64)
    save_file(tensors, other / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": 130}))
    fails(
        dict(
            merge_method="linear",
            models=[dict(model=ft0, parameters=dict(weight=1)), dict(model=str(other), parameters=dict(weight=1))],
        ),
        "unshard merges equal shapes only",
    )


@pytest.fixture(scope="session")
def lora_adapter(models, tmp_path_factory) -> Path:
    """A LoRA adapter on the base, made and saved by peft (B filled so it changes something)."""
    peft = pytest.importorskip("peft")
    model = transformers.AutoModelForCausalLM.from_pretrained(models / "base")
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], alpha_pattern={"down_proj": 2}
    )
    wrapped = peft.get_peft_model(model, config)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    folder = tmp_path_factory.mktemp("adapter")
    wrapped.save_pretrained(folder)
    merged = wrapped.merge_and_unload()
    merged.save_pretrained(folder / "peft-merged")
    return folder


def test_lora_adapter_on_a_base(models, lora_adapter, mergekit, tmp_path):
    """`base+adapter` folds the adapter as peft's merge_and_unload does, and merges as mergekit does."""
    alone = write_recipe(
        tmp_path / "alone.yml",
        dict(merge_method="passthrough", dtype="float32", models=[dict(model=f"{models / 'base'}+{lora_adapter}")]),
    )
    unshard.merge(alone, tmp_path / "alone", progress=False)
    folded = load_file(tmp_path / "alone" / "model.safetensors")
    expected = load_file(lora_adapter / "peft-merged" / "model.safetensors")
    assert sorted(folded) == sorted(expected)
    for key, tensor in expected.items():
        torch.testing.assert_close(folded[key], tensor, atol=1e-6, rtol=0, msg=key)
    assert not torch.equal(
        folded["model.layers.0.self_attn.q_proj.weight"],
        load_file(models / "base" / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"],
    )

    recipe = write_recipe(
        tmp_path / "recipe.yml",
        dict(
            merge_method="linear",
            dtype="float32",
            models=[
                dict(model=f"{models / 'base'}+{lora_adapter}", parameters=dict(weight=0.5)),
                dict(model=str(models / "ft0"), parameters=dict(weight=0.5)),
            ],
        ),
    )
    theirs = run_mergekit(mergekit, recipe, tmp_path / "mergekit")
    unshard.merge(recipe, tmp_path / "unshard", progress=False)
    ours = load_file(tmp_path / "unshard" / "model.safetensors")
    for key, tensor in theirs.items():
        torch.testing.assert_close(ours[key], tensor, atol=1e-5, rtol=0, msg=key)


def test_dora_adapter_with_embedding_and_saved_modules(models, tmp_path):
    """A DoRA adapter on linear layers and the embedding, lm_head in modules_to_save, made and saved by
    peft: `base+adapter` folds it as peft's merge_and_unload does."""
    peft = pytest.importorskip("peft")
    model = transformers.AutoModelForCausalLM.from_pretrained(models / "base")
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "down_proj", "embed_tokens"],
        use_dora=True,
        modules_to_save=["lm_head"],
        init_lora_weights=False,
    )
    wrapped = peft.get_peft_model(model, config)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # as after training: magnitudes and the saved head moved
        for name, p in wrapped.named_parameters():
            if "lora_magnitude_vector" in name or "modules_to_save" in name:
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=generator))
    adapter = tmp_path / "adapter"
    wrapped.save_pretrained(adapter)
    expected = wrapped.merge_and_unload().state_dict()
    recipe = write_recipe(
        tmp_path / "alone.yml",
        dict(merge_method="passthrough", dtype="float32", models=[dict(model=f"{models / 'base'}+{adapter}")]),
    )
    unshard.merge(recipe, tmp_path / "merged", progress=False)
    folded = load_file(tmp_path / "merged" / "model.safetensors")
    assert sorted(folded) == sorted(expected)
    for key, tensor in expected.items():
        assert torch.equal(folded[key], tensor), key
    base = load_file(models / "base" / "model.safetensors")
    for key in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight"):
        assert not torch.equal(folded[key], base[key]), key


def test_megatron_checkpoints_merge_in_place(tmp_path):
    """Megatron inputs (legacy and torch_dist, the same weights) merge like their conversion."""
    fixture = SHIPPED / "megatron-llama-tp2-pp2-vpp2"
    recipe = write_recipe(
        tmp_path / "recipe.yml",
        dict(
            merge_method="linear",
            dtype="float32",
            models=[
                dict(model=str(fixture / "torch"), parameters=dict(weight=0.25)),
                dict(model=str(fixture / "torch_dist"), parameters=dict(weight=0.75)),
            ],
        ),
    )
    unshard.merge(recipe, tmp_path / "merged", progress=False)
    unshard.convert(fixture / "torch", tmp_path / "converted", progress=False)
    merged, converted = (load_file(tmp_path / x / "model.safetensors") for x in ("merged", "converted"))
    assert sorted(merged) == sorted(converted)
    for key, tensor in converted.items():
        torch.testing.assert_close(merged[key], tensor, atol=1e-6, rtol=0, msg=key)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_kth_largest_is_kthvalue(dtype):
    """The bucketed selection, over a tensor seen a band at a time, finds what kthvalue over the whole
    finds, bit for bit: ties, zeros, infinities, NaN, every rank from the top."""
    from unshard.merging.methods.task_arithmetic import TopK

    def kth_largest(values, k):
        top, bands = TopK(), values.tensor_split(3)  # uneven bands
        for band in bands:
            top.count(band)
        top.settle(k)
        for band in bands:
            top.keep(band)
        return top.value(values.dtype)

    g = torch.Generator().manual_seed(0)
    cases = {
        "normal": torch.randn(3_000_000, generator=g).abs(),
        "small": torch.randn(1000, generator=g).abs(),
        "zeros": torch.zeros(1_200_000),
        "few values": torch.randint(0, 5, (2_000_000,), generator=g).float(),
        "inf and nan": torch.cat(
            [torch.full((600_000,), float("inf")), torch.rand(600_000, generator=g), torch.full((3,), float("nan"))]
        ),
    }
    for case, values in cases.items():
        values = values.to(dtype)
        n = values.numel()
        for k in (1, 2, n // 3, n // 2, n - 1, n):
            want = values.kthvalue(n - k + 1).values
            got = kth_largest(values, k)
            assert got.dtype == dtype and (torch.equal(got, want) or (want.isnan() and got.isnan())), (case, k)


def test_ties_sign_election_matches_the_masked_formula():
    """TIES works in the elected sign's frame; the result is, bit for bit, the textbook masks' (entries
    agreeing with the sign of the sum kept, divided by the weight that agreed)."""
    from unshard.merging import METHODS

    g = torch.Generator().manual_seed(1)
    base = torch.randn(50_000, generator=g)
    others = [base + torch.randn(50_000, generator=g) for _ in range(3)]
    others[0][::7] = base[::7]  # zero task-vector entries
    params = [{"weight": w, "density": 1.0} for w in (0.5, 0.3, 0.2)]
    shared = {"normalize": True, "lambda": 1.0, "rescale": False}
    deltas = [(o - base) * p["weight"] for o, p in zip(others, params)]
    positive = sum(deltas) >= 0
    agree = [torch.where(positive, d > 0, d < 0) for d in deltas]
    divisor = sum(a * p["weight"] for a, p in zip(agree, params))
    want = sum(d * a for d, a in zip(deltas, agree)) / torch.where(divisor == 0, 1.0, divisor) + base
    got = METHODS["ties"].combine(base.clone(), [o.clone() for o in others], params, shared, [{}] * 3, None)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_threads_keep_to_the_memory_estimate(models, tmp_path, monkeypatch):
    """The estimate `--dry-run` prints is a bound the writer keeps: with the largest groups queued
    first, two threads still never hold the two largest together, yet smaller groups run side by side."""
    import threading
    import time

    from unshard.merging import plan_merge
    from unshard.write import execute, threads

    recipe = write_recipe(tmp_path / "recipe.yml", {**recipes(models)["ties"], "dtype": "float32"})
    plan = plan_merge(recipe)
    (filename,) = plan.files
    plan.files[filename].sort(key=plan.held, reverse=True)
    budget, lock = plan.peak_memory_estimate(threads=2), threading.Lock()
    held, most, groups, most_groups = 0, 0, 0, 0
    real = threads.ready_to_write

    def tracked(plan, group):
        nonlocal held, most, groups, most_groups
        with lock:
            held, groups = held + plan.held(group), groups + 1
            most, most_groups = max(most, held), max(most_groups, groups)
        try:
            time.sleep(0.01)  # long enough for the other thread to start whatever it may
            yield from real(plan, group)
        finally:
            with lock:
                held, groups = held - plan.held(group), groups - 1

    monkeypatch.setattr(threads, "ready_to_write", tracked)
    try:
        execute.convert(plan, tmp_path / "out", threads=2, progress=False)
    finally:
        plan.checkpoint.close()
    largest = plan.held(plan.files[filename][0])
    assert budget < 2 * largest and most <= budget and most_groups == 2
    assert len(load_file(tmp_path / "out" / filename)) == len(plan.outputs)


def test_bf16_inputs_merge_alike_in_bands(models, tmp_path, monkeypatch):
    """Inputs stored in bf16 are widened to the working dtype a band at a time as they are whole:
    the same model, bit for bit."""
    for name in ("base", "ft0", "ft1"):
        shutil.copytree(models / name, tmp_path / name, ignore=shutil.ignore_patterns("*.safetensors"))
        save_file(
            {k: v.to(torch.bfloat16) for k, v in load_file(models / name / "model.safetensors").items()},
            tmp_path / name / "model.safetensors",
            metadata={"format": "pt"},
        )
    recipe = write_recipe(
        tmp_path / "recipe.yml",
        dict(
            merge_method="ties",
            base_model=str(tmp_path / "base"),
            dtype="float32",
            out_dtype="bfloat16",
            models=[dict(model=str(tmp_path / f"ft{i}"), parameters=dict(weight=0.5, density=0.6)) for i in range(2)],
        ),
    )
    unshard.merge(recipe, tmp_path / "whole", progress=False)
    banded(monkeypatch)
    unshard.merge(recipe, tmp_path / "banded", progress=False, verify=True)
    whole, in_bands = (load_file(tmp_path / label / "model.safetensors") for label in ("whole", "banded"))
    assert whole["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert all(torch.equal(whole[k], in_bands[k]) for k in whole)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak from /proc")
def test_merge_memory_follows_the_band_not_the_tensor(tmp_path):
    """A tensor larger than a band is merged a band of rows at a time: three inputs with a 64 MB
    embedding each, merged by TIES, peak hundreds of MB lower in 1 MB bands than whole (which holds
    each input's tensor, the task vectors and the sums: seven copies or more), to the same model."""
    config = transformers.LlamaConfig(
        vocab_size=16384,
        hidden_size=1024,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "base")
    for i in range(2):
        perturbed_copy(tmp_path / "base", tmp_path / f"ft{i}", seed=200 + i)
    recipe = write_recipe(
        tmp_path / "recipe.yml",
        dict(
            merge_method="ties",
            base_model=str(tmp_path / "base"),
            dtype="float32",
            models=[dict(model=str(tmp_path / f"ft{i}"), parameters=dict(weight=0.5, density=0.5)) for i in range(2)],
        ),
    )
    # The peak as /proc tells it: getrusage's would start at what this process held when it forked the child.
    script = (
        "import re, sys, unshard\n"
        "from unshard.merging import MergedCheckpoint\n"
        "MergedCheckpoint.BAND_BYTES = int(sys.argv[3])\n"
        "unshard.merge(sys.argv[1], sys.argv[2], progress=False, threads=1)\n"
        "print(int(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())[1]) * 1024)\n"
    )
    peaks = {}
    for label, band in (("whole", 1 << 40), ("banded", 1 << 20)):
        done = subprocess.run(
            [sys.executable, "-c", script, str(recipe), str(tmp_path / label), str(band)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        peaks[label] = int(done.stdout.split()[-1])
    assert peaks["whole"] - peaks["banded"] > 300e6, peaks
    whole, in_bands = (load_file(tmp_path / label / "model.safetensors") for label in ("whole", "banded"))
    assert all(torch.equal(whole[k], in_bands[k]) for k in whole)

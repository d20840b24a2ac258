"""`unshard verl merge|test` against verl's own merger (verl 0.9.1 from PyPI in a peer venv), the model
card's front matter as huggingface_hub reads it, and `--push-to-hub` through huggingface_hub's real
client talking to a local stand-in of the Hub's upload API (tests/hub_standin.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, SHIPPED
from generate import peer_python
from hub_standin import TOKEN, Hub, validate_card
from safetensors.torch import load_file, save_file
from unshard_forks import run_unshard

EXAMPLE = ROOT / "examples" / "tiny-llama-verl-fsdp2" / "global_step_1"


def run(*args, env=None, ok=True) -> subprocess.CompletedProcess:
    done = run_unshard(*args, env=env, timeout=600)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("unshard: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    return errors[0]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    found = {}
    for path in sorted(folder.glob("*.safetensors")):
        found.update(load_file(path))
    return found


# ---- the model card ----


def card(folder: Path):
    from huggingface_hub import ModelCard

    text = (folder / "README.md").read_text()
    assert validate_card(text) == []  # what the Hub checks before it takes a README
    return ModelCard(text).data


def test_card_front_matter_is_what_the_hub_reads(tmp_path):
    run("convert", EXAMPLE, tmp_path / "out", "--no-progress")
    data = card(tmp_path / "out")
    assert data.library_name == "transformers" and data.pipeline_tag == "text-generation"
    assert "unshard" in data.tags and data.base_model is None  # no Hub id recorded anywhere

    # A config saved by transformers 4 records the Hub id it came from: that is the base model.
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src)
    config_path = src / "actor" / "huggingface" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "_name_or_path": "meta-llama/Llama-3.2-1B"}))
    run(
        "convert",
        src,
        tmp_path / "with-base",
        "--no-progress",
        "--quantize",
        "W8A16",
        "--quantize-ignore",
        "re:.*",
        "--no-check",
    )
    data = card(tmp_path / "with-base")
    assert data.base_model == "meta-llama/Llama-3.2-1B" and {"compressed-tensors", "w8a16"} <= set(data.tags)

    # A local path is no Hub id: left out, or the Hub would refuse the card.
    config_path.write_text(json.dumps({**config, "_name_or_path": "/data/models/llama"}))
    run("convert", src, tmp_path / "local", "--no-progress")
    assert card(tmp_path / "local").base_model is None


def test_critic_card_says_token_classification(tmp_path):
    run("convert", SHIPPED / "qwen2-fsdp2-critic" / "global_step_1", tmp_path / "out", "--no-progress")
    assert card(tmp_path / "out").pipeline_tag == "token-classification"


def test_merge_card_names_hub_inputs_as_mergekit_does(tmp_path):
    llama = SHIPPED / "llama-fsdp2" / "reference"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"merge_method: linear\nmodels:\n  - model: {llama}\n    parameters: {{weight: 0.5}}\n"
        f"  - model: {SHIPPED / 'llama-fsdp2' / 'global_step_1'}\n    parameters: {{weight: 0.5}}\n"
    )
    run("merge", recipe, tmp_path / "out", "--no-progress")
    data = card(tmp_path / "out")
    assert {"merge", "mergekit", "unshard"} <= set(data.tags) and data.base_model is None  # local inputs only
    from unshard.hub import hub_ids

    assert hub_ids(["Qwen/Qwen2.5-0.5B", "/abs/path", "./rel", "a/b/c", "base+adapter/x", "org/m", "org/m"]) == [
        "Qwen/Qwen2.5-0.5B",
        "org/m",
    ]


# ---- --push-to-hub ----


def hub_env(hub: Hub, tmp_path: Path, token: str | None = TOKEN) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
    )  # the stand-in speaks LFS, not Xet
    if token:
        env["HF_TOKEN"] = token
    return env


def assert_arrived(folder: Path, files: dict[str, bytes]) -> None:
    local = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert sorted(files) == sorted(local)
    for name, data in local.items():
        assert hashlib.sha256(files[name]).hexdigest() == hashlib.sha256(data).hexdigest(), name


def test_push_to_hub_sends_every_file(tmp_path):
    with Hub() as hub:
        env = hub_env(hub, tmp_path)
        out = tmp_path / "out"
        done = run(
            "convert",
            EXAMPLE,
            out,
            "--no-progress",
            "--push-to-hub",
            "me/tiny-llama",
            "--private",
            "--revision",
            "step-1",
            "--commit-message",
            "first step",
            env=env,
        )
        assert "pushed" in done.stdout and "me/tiny-llama" in done.stdout
        assert hub.repos["me/tiny-llama"]["private"] is True
        assert_arrived(out, hub.files("me/tiny-llama", "step-1"))
        assert hub.files("me/tiny-llama", "main") == {}
        assert hub.commits[-1]["message"] == "first step"

        # A merge, to an existing repository's main branch; and one GGUF file.
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(f"merge_method: linear\nmodels:\n  - model: {EXAMPLE}\n    parameters: {{weight: 1.0}}\n")
        run("merge", recipe, tmp_path / "merged", "--no-progress", "--push-to-hub", "me/tiny-llama", env=env)
        assert_arrived(tmp_path / "merged", hub.files("me/tiny-llama"))
        spm = SHIPPED / "llama-fsdp2-spm" / "global_step_1"
        run("convert", spm, tmp_path / "model.gguf", "--no-progress", "--push-to-hub", "me/tiny-gguf", env=env)
        assert hub.files("me/tiny-gguf") == {"model.gguf": (tmp_path / "model.gguf").read_bytes()}
        # A split GGUF file: each of its files, in one commit.
        split = ("--gguf-split-max-size", "300K")
        run("convert", spm, tmp_path / "s.gguf", "--no-progress", *split, "--push-to-hub", "me/split-gguf", env=env)
        files = sorted(tmp_path.glob("s-*-of-*.gguf"))
        assert len(files) > 1 and hub.files("me/split-gguf") == {p.name: p.read_bytes() for p in files}


@pytest.mark.parametrize("failure", ["no token", "refused token", "no network"])
def test_a_failed_push_is_one_line_and_keeps_out(failure, tmp_path):
    def push():
        return run("convert", EXAMPLE, tmp_path / "out", "--no-progress", "--push-to-hub", "me/x", env=env, ok=False)

    with Hub() as hub:
        env = hub_env(hub, tmp_path, token={"no token": None, "refused token": "hf_wrong"}.get(failure, TOKEN))
        if failure != "no network":
            done = push()
    if failure == "no network":  # the stand-in is gone: nothing listens at HF_ENDPOINT any more
        done = push()
    line = one_line_error(done)
    assert {"no token": "no Hugging Face token", "refused token": "401", "no network": "cannot be reached"}[
        failure
    ] in line
    assert "complete on disk and stays" in line
    assert "wrote 21 tensors" in done.stdout  # the conversion itself finished
    reference = weights(tmp_path / "out")
    assert len(reference) == 21 and (tmp_path / "out" / "config.json").exists()


# ---- unshard verl merge / test, against verl's merger ----


def verl_merge(local: Path, target: Path) -> subprocess.CompletedProcess:
    python = peer_python("verl")
    return subprocess.run(
        [
            str(python),
            "-m",
            "verl.model_merger",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(local),
            "--target_dir",
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def without_version(path: Path) -> dict:
    data = json.loads(path.read_text())
    data.pop("transformers_version", None)
    return data


@pytest.mark.parametrize("case", ["qwen2-fsdp2", "llama-fsdp2", "llama-hsdp"])
def test_verl_merge_writes_what_verls_merger_writes(case, tmp_path):
    local = SHIPPED / case / "global_step_1" / "actor"
    theirs = verl_merge(local, tmp_path / "verl")
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    run(
        "verl",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        local,
        "--target_dir",
        tmp_path / "unshard",
        "--no-progress",
    )
    ours, verl = tmp_path / "unshard", tmp_path / "verl"

    def names(folder):
        return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}

    assert names(ours) - {"README.md"} == names(verl)  # the same files, and a model card
    mine, expected = weights(ours), weights(verl)
    assert sorted(mine) == sorted(expected)
    for name, tensor in expected.items():
        assert mine[name].dtype == tensor.dtype == torch.bfloat16 and torch.equal(mine[name], tensor), name
    assert without_version(ours / "config.json") == without_version(verl / "config.json")
    assert without_version(ours / "generation_config.json") == without_version(verl / "generation_config.json")
    # verl has transformers save the tokenizer again (its tokenizer.json is rewritten); unshard copies the
    # trainer's files: both load to the same tokens.
    from transformers import AutoTokenizer

    text = "merged weights, the same tokens: 12345 héllo"
    assert AutoTokenizer.from_pretrained(ours)(text).input_ids == AutoTokenizer.from_pretrained(verl)(text).input_ids


@pytest.mark.parametrize("case", ["llama-fsdp2-tp", "llama-fsdp1-shardedtensor"])
def test_verl_merge_where_verls_merger_fails(case, tmp_path):
    """verl's merger refuses FSDP2 over TP and cannot load ShardedTensors without a process group; unshard
    writes what it would have written: the training model's weights in bfloat16."""
    local = SHIPPED / case / "global_step_1" / "actor"
    assert verl_merge(local, tmp_path / "verl").returncode != 0
    run("verl", "merge", "--backend", "fsdp", "--local_dir", local, "--target_dir", tmp_path / "out", "--no-progress")
    mine, reference = weights(tmp_path / "out"), weights(SHIPPED / case / "reference")
    assert sorted(mine) == sorted(reference)
    for name, tensor in reference.items():
        assert mine[name].dtype == torch.bfloat16 and torch.equal(mine[name], tensor.to(torch.bfloat16)), name
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"


def test_verl_merge_of_a_lora_run(tmp_path):
    """verl keeps a LoRA adapter apart from the base (TARGET/lora_adapter/, alpha from lora_train_meta.json).
    Its merger fails on this peft-made checkpoint (the saved config names no architectures); unshard writes
    the base and the adapter peft saved, in bfloat16."""
    case = SHIPPED / "llama-fsdp2-lora"
    local = case / "global_step_1" / "actor"
    assert verl_merge(local, tmp_path / "verl").returncode != 0
    run("verl", "merge", "--backend", "fsdp", "--local_dir", local, "--target_dir", tmp_path / "out", "--no-progress")
    adapter = load_file(tmp_path / "out" / "lora_adapter" / "adapter_model.safetensors")
    expected = load_file(case / "reference-adapter" / "adapter_model.safetensors")
    assert sorted(adapter) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(adapter[name], tensor.to(torch.bfloat16)), name
    config = json.loads((tmp_path / "out" / "lora_adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8, "LORA")
    base = weights(tmp_path / "out")
    assert base and all(t.dtype == torch.bfloat16 for t in base.values()) and not any("lora" in n for n in base)


def test_verl_test_compares_as_verl_does(tmp_path):
    local = SHIPPED / "qwen2-fsdp2" / "global_step_1" / "actor"
    reference = SHIPPED / "qwen2-fsdp2" / "reference"
    done = run(
        "verl",
        "test",
        "--backend",
        "fsdp",
        "--local_dir",
        local,
        "--test_hf_dir",
        reference,
        "--use_cpu_initialization",
        "--trust-remote-code",
        "--no-progress",
    )
    assert "26 tensors" in done.stdout and "match" in done.stdout
    assert "--use_cpu_initialization" in done.stderr and "--trust-remote-code" in done.stderr

    # One value changed in the reference: the test fails, naming the tensor.
    changed = tmp_path / "changed"
    shutil.copytree(reference, changed)
    tensors = load_file(changed / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].clone()
    tensors["model.norm.weight"][3] += 0.5
    save_file(tensors, changed / "model.safetensors", metadata={"format": "pt"})
    line = one_line_error(
        run(
            "verl",
            "test",
            "--backend",
            "fsdp",
            "--local_dir",
            local,
            "--test_hf_dir",
            changed,
            "--no-progress",
            ok=False,
        )
    )
    assert "model.norm.weight" in line and "1 tensor" in line

    # Another model altogether: the tensors missing and extra are named.
    line = one_line_error(
        run(
            "verl",
            "test",
            "--backend",
            "fsdp",
            "--local_dir",
            SHIPPED / "llama-fsdp2" / "global_step_1" / "actor",
            "--test_hf_dir",
            reference,
            ok=False,
        )
    )
    assert "missing" in line and "q_proj.bias" in line


def test_verl_flags_that_do_not_fit_the_checkpoint(tmp_path):
    local = SHIPPED / "qwen2-fsdp2" / "global_step_1" / "actor"  # Qwen2 with tied embeddings
    untied = SHIPPED / "llama-fsdp2" / "global_step_1" / "actor"
    run(
        "verl",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        local,
        "--target_dir",
        tmp_path / "tied",
        "--tie-word-embedding",
        "--no-progress",
    )
    line = one_line_error(
        run(
            "verl",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            untied,
            "--target_dir",
            tmp_path / "a",
            "--tie-word-embedding",
            ok=False,
        )
    )
    assert "tie_word_embeddings" in line and not (tmp_path / "a").exists()
    line = one_line_error(
        run(
            "verl",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            untied,
            "--target_dir",
            tmp_path / "b",
            "--is-value-model",
            ok=False,
        )
    )
    assert "value head" in line and not (tmp_path / "b").exists()
    critic = SHIPPED / "qwen2-fsdp2-critic" / "global_step_1" / "critic"
    run(
        "verl",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        critic,
        "--target_dir",
        tmp_path / "critic",
        "--is-value-model",
        "--no-progress",
    )
    line = one_line_error(
        run(
            "verl",
            "merge",
            "--backend",
            "megatron",
            "--local_dir",
            SHIPPED / "megatron-qwen2-tp2-pp2" / "verl" / "global_step_10" / "actor",
            "--target_dir",
            tmp_path / "c",
            "--is-value-model",
            ok=False,
        )
    )
    assert "--is-value-model, but" in line and "ends in no value head" in line
    # verl's Megatron critic: its value head becomes the score head of a ...ForTokenClassification folder
    run(
        "verl",
        "merge",
        "--backend",
        "megatron",
        "--local_dir",
        SHIPPED / "megatron-qwen2-critic-tp2-pp2" / "verl" / "global_step_10" / "critic",
        "--target_dir",
        tmp_path / "megatron-critic",
        "--is-value-model",
        "--no-progress",
    )
    made = json.loads((tmp_path / "megatron-critic" / "config.json").read_text())
    assert made["architectures"] == ["Qwen2ForTokenClassification"]
    # The megatron backend reads verl's Megatron layout (verl's own Megatron merger wants a GPU: it is not run
    # here): the weights a bf16 conversion writes. A backend naming another layout is a note.
    megatron = SHIPPED / "megatron-qwen2-tp2-pp2" / "verl" / "global_step_10" / "actor"
    done = run(
        "verl",
        "merge",
        "--backend",
        "megatron",
        "--local_dir",
        megatron,
        "--target_dir",
        tmp_path / "m",
        "--no-progress",
    )
    assert "--backend" not in done.stderr
    run("convert", megatron, tmp_path / "m-bf16", "--dtype", "bfloat16", "--no-progress")
    mine, expected = weights(tmp_path / "m"), weights(tmp_path / "m-bf16")
    assert sorted(mine) == sorted(expected) and all(torch.equal(mine[n], t) for n, t in expected.items())
    assert all(t.dtype == torch.bfloat16 for t in mine.values())
    done = run(
        "verl", "merge", "--backend", "fsdp", "--local_dir", megatron, "--target_dir", tmp_path / "m2", "--no-progress"
    )
    assert "--backend fsdp" in done.stderr and (tmp_path / "m2" / "model.safetensors").exists()
    # verl writes over target_dir; unshard asks first.
    line = one_line_error(
        run("verl", "merge", "--backend", "fsdp", "--local_dir", local, "--target_dir", tmp_path / "tied", ok=False)
    )
    assert "--overwrite" in line
    line = one_line_error(run("verl", "merge", "--backend", "fsdp", "--target_dir", tmp_path / "d", ok=False))
    assert "--local_dir" in line


def test_verl_hf_upload_path_pushes(tmp_path):
    with Hub() as hub:
        local = SHIPPED / "qwen2-fsdp2" / "global_step_1" / "actor"
        run(
            "verl",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            local,
            "--target_dir",
            tmp_path / "out",
            "--hf_upload_path",
            "me/qwen-rl",
            "--private",
            "--no-progress",
            env=hub_env(hub, tmp_path),
        )
        assert hub.repos["me/qwen-rl"]["private"] is True
        assert_arrived(tmp_path / "out", hub.files("me/qwen-rl"))


def test_a_repository_id_the_hub_refuses_is_one_line_before_writing(tmp_path):
    line = one_line_error(run("convert", EXAMPLE, tmp_path / "out", "--push-to-hub", "not/a/valid id", ok=False))
    assert "not a Hub repository id" in line and not (tmp_path / "out").exists()


def test_push_to_hub_from_python(tmp_path):
    run("convert", EXAMPLE, tmp_path / "out", "--no-progress")
    with Hub() as hub:
        code = "import sys, unshard; print(unshard.push_to_hub(sys.argv[1], 'me/api', revision='r1', progress=False))"
        done = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=300,
            env=hub_env(hub, tmp_path),
        )
        assert done.returncode == 0, done.stderr
        assert "/me/api/commit/" in done.stdout
        assert_arrived(tmp_path / "out", hub.files("me/api", "r1"))


# ---- Hub ids as merge inputs and as --config-from ----


def hub_repo(hub: Hub, repo: str, folder: Path) -> None:
    """A model repository on the stand-in holding FOLDER's files, as an upload would leave it."""
    hub.repos[repo] = {
        "private": False,
        "branches": {"main": {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}},
    }


def test_hub_ids_as_config_from_and_merge_inputs(tmp_path):
    dcp = SHIPPED / "llama-fsdp1-dcp"
    with Hub() as hub:
        hub_repo(hub, "org/llama-hf", dcp / "hf")
        hub_repo(hub, "org/llama", SHIPPED / "llama-fsdp2" / "reference")
        hub_repo(hub, "org/llama-pickled", SHIPPED / "llama-hf-pickles" / "sharded")
        env = hub_env(hub, tmp_path)
        run("convert", dcp / "dcp", tmp_path / "from-id", "--config-from", "org/llama-hf", "--no-progress", env=env)
        run("convert", dcp / "dcp", tmp_path / "from-folder", "--config-from", dcp / "hf", "--no-progress")
        assert weights(tmp_path / "from-id").keys() == weights(tmp_path / "from-folder").keys()
        assert (tmp_path / "from-id" / "tokenizer.json").read_bytes() == (dcp / "hf" / "tokenizer.json").read_bytes()
        assert card(tmp_path / "from-id").base_model == "org/llama-hf"

        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(
            "merge_method: linear\nmodels:\n  - model: org/llama\n    parameters: {weight: 0.5}\n"
            f"  - model: {SHIPPED / 'llama-fsdp2' / 'reference'}\n    parameters: {{weight: 0.5}}\n"
        )
        run("merge", recipe, tmp_path / "merged", "--no-progress", env=env)
        merged, reference = weights(tmp_path / "merged"), weights(SHIPPED / "llama-fsdp2" / "reference")
        assert all(torch.equal(merged[n], t) for n, t in reference.items())  # the same model twice
        assert card(tmp_path / "merged").base_model == ["org/llama"]
        # An older model on the Hub, in pickles only: fetched and read without running them.
        recipe.write_text(
            "merge_method: linear\nmodels:\n  - model: org/llama-pickled\n    parameters: {weight: 1.0}\n"
        )
        run("merge", recipe, tmp_path / "merged-pickled", "--no-progress", env=env)
        expected = weights(SHIPPED / "llama-hf-pickles" / "reference")
        assert all(torch.equal(weights(tmp_path / "merged-pickled")[n], t) for n, t in expected.items())

        # An id the Hub does not have, and no Hub at all: one line naming the id, nothing written.
        recipe.write_text("merge_method: linear\nmodels:\n  - model: org/missing\n    parameters: {weight: 1.0}\n")
        line = one_line_error(run("merge", recipe, tmp_path / "m1", env=env, ok=False))
        assert "org/missing" in line and not (tmp_path / "m1").exists()
    line = one_line_error(run("convert", dcp / "dcp", tmp_path / "c1", "--config-from", "org/other", env=env, ok=False))
    assert "org/other" in line and "hf download" in line and not (tmp_path / "c1").exists()
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    line = one_line_error(run("merge", recipe, tmp_path / "m2", env=offline, ok=False))
    assert "org/missing" in line and not (tmp_path / "m2").exists()
    # Offline, what was fetched before is still there (huggingface_hub's cache).
    run("convert", dcp / "dcp", tmp_path / "c2", "--config-from", "org/llama-hf", "--no-progress", env=offline)


# ---- every step of a run ----


def test_every_step_of_a_run_to_its_own_folder_and_branch(tmp_path):
    """`--all-steps`: each global_step_N of a verl run into OUT/step_N, as converting it alone writes it; a run
    stopped half-way resumes (the steps already in OUT are skipped); `--steps` picks some (`last`); with
    --push-to-hub each step goes to its own branch, step-N."""
    run_folder = tmp_path / "run"
    for step in (1, 2, 10):
        shutil.copytree(EXAMPLE, run_folder / f"global_step_{step}")
    alone = tmp_path / "alone"
    run("convert", run_folder / "global_step_2", alone, "--no-progress")
    out = tmp_path / "steps"
    with Hub() as hub:
        env = hub_env(hub, tmp_path)
        run("convert", run_folder, out, "--all-steps", "--no-progress", "--push-to-hub", "me/run", env=env)
        assert sorted(p.name for p in out.iterdir()) == ["step_1", "step_10", "step_2"]
        for name in ("model.safetensors", "config.json"):
            assert (out / "step_2" / name).read_bytes() == (alone / name).read_bytes()
        for step in (1, 2, 10):
            assert_arrived(out / f"step_{step}", hub.files("me/run", f"step-{step}"))

    shutil.rmtree(out / "step_10")
    before = (out / "step_1" / "model.safetensors").stat().st_mtime_ns
    done = run("convert", run_folder, out, "--all-steps", "--no-progress")
    assert "2 step(s) already in" in done.stderr and (out / "step_10" / "model.safetensors").is_file()
    assert (out / "step_1" / "model.safetensors").stat().st_mtime_ns == before  # (not written again)

    picked = tmp_path / "picked"
    run("convert", run_folder, picked, "--steps", "1,last", "--no-progress")
    assert sorted(p.name for p in picked.iterdir()) == ["step_1", "step_10"]
    error = one_line_error(run("convert", run_folder, tmp_path / "bad", "--steps", "5", ok=False))
    assert "--steps 5: '5' is not a step saved here (saved: 1, 2, 10; or `last`)" in error
    error = one_line_error(run("convert", EXAMPLE, tmp_path / "none", "--all-steps", ok=False))
    assert "no step folders here" in error and not (tmp_path / "none").exists()

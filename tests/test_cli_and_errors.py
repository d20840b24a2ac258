"""The command line, and bad input: one clear line, a non-zero exit, no OUT left behind."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import SHIPPED
from unshard_forks import run_unshard

import unshard
from unshard.write import threads

LLAMA = SHIPPED / "llama-fsdp2"


def run_cli(*args, cwd=None):
    done = run_unshard(*args, cwd=cwd)
    return done.returncode, done.stdout, done.stderr


def copy_actor(tmp_path, case="llama-fsdp2"):
    dest = tmp_path / "ckpt"
    shutil.copytree(SHIPPED / case / "global_step_1" / "actor", dest)
    return dest


def leftovers(folder):
    return [p.name for p in folder.iterdir() if ".unshard-" in p.name]


def test_convert_cli_prints_summary(tmp_path):
    code, out, err = run_cli("convert", LLAMA / "global_step_1", tmp_path / "hf", "--verify")
    assert code == 0, err
    assert "wrote 21 tensors" in out and "verified" in out and "peak memory" in out
    assert "output dtype float32 (declared by config.json)" in err
    assert (tmp_path / "hf" / "model.safetensors").exists()


def test_inspect_reports_layout_mesh_and_plan():
    code, out, err = run_cli("inspect", SHIPPED / "llama-fsdp2-tp" / "global_step_1", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["layout"] == "fsdp-rank-files" and info["world_size"] == 4 and info["fsdp_version"] == 2
    assert info["sharding"]["DTensor {'dp': 2, 'tp': 2} ('_S(0, 2)', 'S(0)')"] == 10
    assert info["tensors"] == 21 and info["output"]["tensors"] == 21
    assert info["output"]["files"] == {"model.safetensors": info["bytes"]}
    assert 0 < info["peak_memory_estimate"] < info["bytes"]

    code, out, _ = run_cli("inspect", SHIPPED / "llama-ws1-bf16-noconfig" / "global_step_1")
    assert code == 0 and "world size taken from the file names" in out and "bfloat16" in out


def test_dry_run_writes_nothing(tmp_path):
    code, out, _ = run_cli("convert", LLAMA / "global_step_1", tmp_path / "hf", "--dry-run")
    assert code == 0 and "will write   21 tensors" in out
    assert not (tmp_path / "hf").exists() and not leftovers(tmp_path)


def test_existing_output_is_refused_then_overwritten(tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli("convert", LLAMA / "global_step_1", out)
    assert code == 1 and "already exists" in err and "--overwrite" in err and "Traceback" not in err
    assert (out / "keep.txt").read_text() == "mine"
    code, _, err = run_cli("convert", LLAMA / "global_step_1", out, "--overwrite")
    assert code == 0, err
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    assert not leftovers(tmp_path)


def test_missing_rank_file(tmp_path):
    ckpt = copy_actor(tmp_path)
    (ckpt / "model_world_size_4_rank_2.pt").unlink()
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 1 and "missing 1 of 4 rank files (model_world_size_4_rank_2.pt)" in err
    assert err.count("\n") == 1 and not (tmp_path / "hf").exists()


def test_mixed_world_sizes(tmp_path):
    ckpt = copy_actor(tmp_path)
    shutil.copy(ckpt / "model_world_size_4_rank_0.pt", ckpt / "model_world_size_2_rank_0.pt")
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 1 and "several world sizes (2, 4)" in err


def test_truncated_rank_file(tmp_path):
    ckpt = copy_actor(tmp_path)
    rank1 = ckpt / "model_world_size_4_rank_1.pt"
    rank1.write_bytes(rank1.read_bytes()[:5000])
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 1 and str(rank1) in err and "truncated or corrupt" in err
    assert not (tmp_path / "hf").exists() and not leftovers(tmp_path)


def test_rank_file_from_another_model(tmp_path):
    ckpt = copy_actor(tmp_path, "llama-fsdp2")
    shutil.copy(
        SHIPPED / "llama-fsdp1-shardedtensor/global_step_1/actor/model_world_size_4_rank_3.pt",
        ckpt / "model_world_size_4_rank_3.pt",
    )
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 1 and "model_world_size_4_rank_3.pt" in err


class RunsShellCommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_runs_code_is_refused(tmp_path):
    ckpt = copy_actor(tmp_path)
    marker = tmp_path / "pwned"
    state = {"model.embed_tokens.weight": torch.zeros(2), "payload": RunsShellCommand(marker)}
    torch.save(state, ckpt / "model_world_size_4_rank_0.pt")
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 1, err
    assert "refused to load" in err and "system" in err and "never runs code" in err
    assert not marker.exists() and not (tmp_path / "hf").exists()


def test_megatron_file_that_runs_code_is_refused(tmp_path):
    """Megatron-LM's rank files are read by unshard's own unpickler (args, RNG state): a payload
    hidden among the args is refused there and by torch's loader after it."""
    src = tmp_path / "megatron"
    shutil.copytree(SHIPPED / "megatron-qwen2-tp2-pp2" / "torch", src)
    rank_file = src / "iter_0000010" / "mp_rank_01_001" / "model_optim_rng.pt"
    marker = tmp_path / "pwned"
    # Tampered with in a process of its own: unpickling the file whole imports megatron.core, which
    # adds its classes to torch's allow-list for the rest of the process.
    tamper = textwrap.dedent("""
        import os, sys, torch
        class RunsShellCommand:
            def __reduce__(self):
                return (os.system, (f"touch {sys.argv[2]}",))
        saved = torch.load(sys.argv[1], weights_only=False)  # (the repository's own fixture)
        saved["args"].tokenizer_type = RunsShellCommand()
        torch.save(saved, sys.argv[1])
    """)
    subprocess.run([sys.executable, "-c", tamper, str(rank_file), str(marker)], check=True, capture_output=True)
    code, _, err = run_cli("convert", src, tmp_path / "hf")
    assert code == 1, err
    assert "refused to load" in err and "system" in err and str(rank_file) in err
    assert not marker.exists() and not (tmp_path / "hf").exists()


def test_loads_in_several_threads_keep_their_allow_list():
    """torch's allow-list is one per process: a load finishing in one thread must not take it from a
    load still unpickling DTensors in another, and none of it outlives unshard's loads; what the process allowed
    itself before (as megatron-core does when imported: argparse.Namespace among others) stays allowed."""
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    from unshard.sources import safe_pickle, safe_torch_load

    files = sorted((SHIPPED / "llama-fsdp2" / "global_step_1" / "actor").glob("model_world_size_4_rank_*.pt"))
    with torch.serialization.safe_globals([argparse.Namespace]):
        before = set(torch.serialization.get_safe_globals())  # torch keeps a set: its list order is arbitrary
        with ThreadPoolExecutor(4) as pool:
            states = list(pool.map(lambda path: safe_torch_load.load(path), files * 10))
        assert len(states) == 40 and all(safe_pickle.is_dtensor(s["model.embed_tokens.weight"]) for s in states)
        assert set(torch.serialization.get_safe_globals()) == before


def test_unknown_layout(tmp_path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "weights.txt").write_text("hello")
    code, _, err = run_cli("inspect", tmp_path / "stuff")
    assert code == 1 and "not a checkpoint layout unshard knows" in err


def test_config_that_does_not_fit(tmp_path):
    ckpt = copy_actor(tmp_path)
    config = json.loads((ckpt / "huggingface/config.json").read_text())
    config["intermediate_size"] = 128
    (ckpt / "huggingface/config.json").write_text(json.dumps(config))
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 1 and "does not fit this config" in err and "--config-from" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no OUT, no staging folder
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf", "--no-check")
    assert code == 0, err


def test_missing_config_needs_config_from(tmp_path):
    ckpt = copy_actor(tmp_path)
    shutil.move(ckpt / "huggingface", tmp_path / "hfdir")
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 1 and "--config-from" in err and not (tmp_path / "hf").exists()
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf", "--config-from", tmp_path / "hfdir")
    assert code == 0, err
    assert (tmp_path / "hf" / "tokenizer.json").exists()


def test_failure_mid_write_leaves_no_output(tmp_path, monkeypatch):
    real, calls = threads.ready_to_write, []

    def fail_on_third(plan, group):
        calls.append(group)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(plan, group)

    monkeypatch.setattr(threads, "ready_to_write", fail_on_third)
    with pytest.raises(OSError, match="disk full"):
        unshard.convert(LLAMA / "global_step_1", tmp_path / "hf", progress=False, max_shard_size="60KB")
    assert not (tmp_path / "hf").exists() and not leftovers(tmp_path)


def test_src_may_be_step_or_actor_folder():
    a = unshard.open_checkpoint(LLAMA / "global_step_1")
    b = unshard.open_checkpoint(LLAMA / "global_step_1" / "actor")
    assert a.path == b.path and list(a.tensors) == list(b.tensors)


def copy_dcp(tmp_path):
    dest = tmp_path / "dcp"
    shutil.copytree(SHIPPED / "llama-fsdp1-dcp" / "dcp", dest)
    shutil.copy(SHIPPED / "llama-fsdp1-dcp" / "train_params.yaml", tmp_path / "train_params.yaml")
    return dest


def test_dcp_without_config_names_the_base_model(tmp_path):
    dcp = copy_dcp(tmp_path)
    code, _, err = run_cli("convert", dcp, tmp_path / "hf")
    assert code == 1 and "--config-from" in err and "tiny/base-model" in err
    assert err.strip().count("\n") == 0 and not (tmp_path / "hf").exists()


def test_dcp_missing_distcp_file(tmp_path):
    dcp = copy_dcp(tmp_path)
    (dcp / "__2_0.distcp").unlink()
    code, _, err = run_cli("convert", dcp, tmp_path / "hf", "--config-from", SHIPPED / "llama-fsdp1-dcp" / "hf")
    assert code == 1 and "__2_0.distcp: missing" in err and "copy every .distcp file" in err


def test_dcp_truncated_distcp_file(tmp_path):
    dcp = copy_dcp(tmp_path)
    data = (dcp / "__3_0.distcp").read_bytes()
    (dcp / "__3_0.distcp").write_bytes(data[: len(data) // 2])
    code, _, err = run_cli("convert", dcp, tmp_path / "hf", "--config-from", SHIPPED / "llama-fsdp1-dcp" / "hf")
    assert code == 1 and "__3_0.distcp" in err and "truncated" in err
    assert not (tmp_path / "hf").exists() and not leftovers(tmp_path)


def test_dcp_metadata_that_runs_code_is_refused(tmp_path):
    import pickle

    dcp = copy_dcp(tmp_path)
    marker = tmp_path / "pwned"
    (dcp / ".metadata").write_bytes(pickle.dumps(RunsShellCommand(marker)))
    code, _, err = run_cli("inspect", dcp)
    assert code == 1 and "refused to load" in err and "system" in err
    assert not marker.exists()


@pytest.mark.parametrize("frame_length", [2**63 - 1, 2**64 - 1])  # (past what the system can hold: OverflowError)
def test_dcp_metadata_with_a_damaged_frame_length(frame_length, tmp_path):
    dcp = copy_dcp(tmp_path)
    data = (dcp / ".metadata").read_bytes()
    assert data[:3] == b"\x80\x04\x95"  # protocol 4, then a FRAME and its 8-byte length
    (dcp / ".metadata").write_bytes(data[:3] + frame_length.to_bytes(8, "little") + data[11:])
    code, _, err = run_cli("inspect", dcp)
    assert code == 1 and "cannot be read" in err and "truncated or corrupt" in err and len(err.splitlines()) == 1, err


def test_dcp_safetensors_missing_rank(tmp_path):
    sharded = tmp_path / "sharded"
    shutil.copytree(SHIPPED / "llama-fsdp2-dcp-safetensors" / "sharded", sharded)
    for path in sharded.glob("shard-00002-*"):
        path.unlink()
    code, _, err = run_cli("inspect", sharded)
    assert code == 1 and "no files from rank(s) [2]" in err


def test_config_from_hub_id_offline_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dcp = copy_dcp(tmp_path)
    code, _, err = run_cli("convert", dcp, tmp_path / "hf", "--config-from", "no-such-org/no-such-model")
    assert code == 1 and "could not be fetched" in err and "hf download no-such-org/no-such-model" in err
    code, _, err = run_cli("convert", dcp, tmp_path / "hf", "--config-from", tmp_path / "nothing-here")
    assert code == 1 and "needs a folder with config.json, or a Hub model id" in err


def test_custom_code_is_copied_but_never_run(tmp_path):
    ckpt = copy_actor(tmp_path)
    config = json.loads((ckpt / "huggingface/config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    (ckpt / "huggingface/config.json").write_text(json.dumps(config))
    marker = tmp_path / "ran"
    (ckpt / "huggingface/modeling_custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 0, err
    assert "not checked against the config" in err
    assert (tmp_path / "hf" / "modeling_custom.py").exists() and not marker.exists()


def test_strip_wrappers_only_removes_whole_wrapper_components():
    from unshard.names.hf_names import strip_wrappers

    assert (
        strip_wrappers("module.model._fsdp_wrapped_module.layers.0._checkpoint_wrapped_module.mlp.weight")
        == "model.layers.0.mlp.weight"
    )
    assert strip_wrappers("_orig_mod.model.norm.weight") == "model.norm.weight"
    assert strip_wrappers("model.submodule.weight") == "model.submodule.weight"


def test_bad_shard_size_and_broken_config(tmp_path):
    code, _, err = run_cli("convert", LLAMA / "global_step_1", tmp_path / "hf", "--max-shard-size", "lots")
    assert code == 1 and "give a size such as 5GB" in err
    ckpt = copy_actor(tmp_path)
    (ckpt / "huggingface/config.json").write_text("{not json")
    code, _, err = run_cli("inspect", ckpt)
    assert code == 1 and "config.json: not valid JSON" in err


def test_lora_alpha_must_be_known(tmp_path):
    ckpt = copy_actor(tmp_path, "llama-fsdp2-lora")
    (ckpt / "lora_train_meta.json").unlink()
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 1 and "no lora_alpha" in err and "--lora-alpha" in err and not (tmp_path / "hf").exists()
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf", "--lora-alpha", "8")
    assert code == 0 and "alpha 8 from --lora-alpha" in err
    from safetensors.torch import load_file

    written = load_file(tmp_path / "hf" / "model.safetensors")
    merged = load_file(SHIPPED / "llama-fsdp2-lora" / "reference" / "model.safetensors")  # peft's own merge
    assert all(torch.allclose(written[n], t, atol=1e-5, rtol=0) for n, t in merged.items())
    assert not any("lora" in n for n in written)


def test_model_card_checksums_and_folder_warnings(tmp_path):
    import hashlib

    out = tmp_path / "out"
    code, _, err = run_cli("convert", SHIPPED / "llama-fsdp2" / "global_step_1", out, "--checksums")
    assert code == 0 and "warning:" not in err  # tokenizer, chat template and generation config all there
    card = (out / "README.md").read_text()
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    assert "| model.safetensors | " in card and digest in card and "world size: 4" in card
    code, _, err = run_cli("convert", SHIPPED / "llama-fsdp2" / "global_step_1", tmp_path / "plain")
    card = (tmp_path / "plain" / "README.md").read_text()
    assert code == 0 and "| model.safetensors | " in card and "sha256" not in card  # hashing is asked for
    assert (tmp_path / "plain" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    (out / "generation_config.json").unlink()
    code, _, err = run_cli("convert", out, tmp_path / "again")  # a Hugging Face folder is a layout too
    assert code == 0 and "warning: no generation_config.json" in err


def test_architecture_override(tmp_path):
    critic = SHIPPED / "qwen2-fsdp2-critic" / "global_step_1"
    code, _, err = run_cli("convert", critic, tmp_path / "out", "--architecture", "Qwen2ForTokenClassification")
    assert code == 0, err
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForTokenClassification"]
    # A sequence-classification head has no bias: the check says so instead of writing a broken folder.
    code, _, err = run_cli("convert", critic, tmp_path / "seq", "--architecture", "Qwen2ForSequenceClassification")
    assert code == 1 and "unexpected 1 (e.g. score.bias)" in err and not (tmp_path / "seq").exists()
    code, _, err = run_cli("convert", critic, tmp_path / "bad", "--architecture", "Qwen2ForNothing")
    assert code == 1 and "transformers has no such model class" in err and not (tmp_path / "bad").exists()


def test_the_plan_notes_a_new_head_and_a_missing_tokenizer(tmp_path):
    critic = SHIPPED / "qwen2-fsdp2-critic" / "global_step_1"
    code, out, err = run_cli("convert", critic, tmp_path / "out", "--dry-run")
    assert code == 0 and "the weights end in a `score` head: config.json says Qwen2ForTokenClassification" in out
    code, out, err = run_cli(
        "convert", critic, tmp_path / "out", "--dry-run", "--architecture", "Qwen2ForTokenClassification"
    )
    assert code == 0 and "`score` head" not in out  # what the user chose is not news
    ckpt = copy_actor(tmp_path)
    code, out, err = run_cli("convert", ckpt, tmp_path / "out", "--dry-run")
    assert code == 0 and "no tokenizer" not in out
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (ckpt / "huggingface" / name).unlink()
    code, out, err = run_cli("convert", ckpt, tmp_path / "out", "--dry-run")
    assert code == 0 and "no tokenizer beside the checkpoint: pass --config-from DIR" in out


KILLED_WHILE_WRITING = """
import os, signal, sys
from unshard.write import threads

def write_then_die(*args, **kwargs):  # the OOM killer, or a scheduler, stopping the run mid-write
    os.kill(os.getpid(), signal.SIGKILL)

threads._write_weights = write_then_die
from unshard.cli import main
main(["convert", sys.argv[1], sys.argv[2], "--no-progress"])
"""


def test_a_killed_run_s_staging_folder_is_removed_by_the_next(tmp_path):
    """SIGKILL leaves the staging folder; the next run into the same folder removes it and says so, but
    leaves a live process's and another host's alone."""
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_WRITING, str(LLAMA / "global_step_1"), str(tmp_path / "a")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -9
    (stale,) = leftovers(tmp_path)
    alive = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / f".b.unshard-partial-{socket.gethostname()}-{alive.pid}-k2_x9abc").mkdir()
        (tmp_path / ".c.unshard-partial-another-host-999991-a1b2c3d4").mkdir()
        code, _, err = run_cli("convert", LLAMA / "global_step_1", tmp_path / "d")
    finally:
        alive.kill()
    assert code == 0, err
    assert f"note: removed {tmp_path / stale}, left by process" in err and "no longer running" in err
    assert sorted(leftovers(tmp_path)) == sorted(
        [
            f".b.unshard-partial-{socket.gethostname()}-{alive.pid}-k2_x9abc",
            ".c.unshard-partial-another-host-999991-a1b2c3d4",
        ]
    )


def test_model_file_that_does_not_parse(tmp_path):
    """A tokenizer_config.json emptied or cut short is an error naming it, before anything is written;
    --no-check copies it as it is, with a warning."""
    ckpt = copy_actor(tmp_path)
    (ckpt / "huggingface" / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTok')
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "tokenizer_config.json: not valid JSON" in err and "--no-check" in err
    assert not (tmp_path / "hf").exists() and not leftovers(tmp_path)
    code, _, err = run_cli("convert", ckpt, tmp_path / "hf", "--no-check")
    assert code == 0 and "warning: tokenizer_config.json: not valid JSON" in err
    tokenizer = ckpt / "huggingface" / "tokenizer.json"  # JSON, but no tokenizer the tokenizers library knows
    tokenizer.write_text(tokenizer.read_text().replace('"type": "BPE"', '"type": "NoSuchModel"', 1))
    code, _, err = run_cli("convert", ckpt, tmp_path / "again")
    assert code == 1 and "tokenizer.json: the tokenizers library cannot read it" in err
    (ckpt / "huggingface" / "tokenizer.json").unlink()
    (ckpt / "huggingface" / "chat_template.jinja").write_bytes(b"{{ \xff }}")  # (transformers reads it as UTF-8)
    code, _, err = run_cli("convert", ckpt, tmp_path / "again")
    assert code == 1 and "chat_template.jinja: not UTF-8 text" in err and "--no-check" in err


def test_two_runs_into_one_output_never_mix(tmp_path, monkeypatch):
    """A run that finishes second finds OUT written by the first: it keeps the first's folder whole and fails."""
    from unshard.sinks import hf_folder
    from unshard.write import execute

    out = tmp_path / "hf"
    finish = hf_folder.finish_folder

    def another_run_finishes_first(plan, folder, *args):
        monkeypatch.setattr(hf_folder, "finish_folder", finish)  # (the other run finishes as usual)
        unshard.convert(LLAMA / "global_step_1", out, progress=False)
        return finish(plan, folder, *args)

    monkeypatch.setattr(hf_folder, "finish_folder", another_run_finishes_first)
    plan = unshard.plan(SHIPPED / "qwen2-fsdp2" / "global_step_1")
    with pytest.raises(unshard.OutputExistsError, match="another run wrote it while this one was running"):
        execute.convert(plan, out, progress=False)
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert not leftovers(tmp_path)


def test_no_room_to_write_is_one_line_and_leaves_nothing(tmp_path):
    """The file size limit (RLIMIT_FSIZE: writes fail with EFBIG, as on a full disk with ENOSPC) stops the
    run with one line naming the file, and nothing is left behind."""
    import resource

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))  # the weights are 290 KB

    done = subprocess.run(
        [sys.executable, "-m", "unshard", "convert", str(LLAMA / "global_step_1"), str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_file_size,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("unshard:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert "model.safetensors: File too large; nothing was written to the output" in errors[0]
    assert not (tmp_path / "hf").exists() and not leftovers(tmp_path)


def test_output_parent_that_cannot_hold_it(tmp_path):
    """OUT inside a file (or a folder this user cannot write: the same error) is one line, nothing written."""
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    code, _, err = run_cli("convert", LLAMA / "global_step_1", tmp_path / "notes.txt" / "hf")
    errors = [line for line in err.splitlines() if line.startswith("unshard:")]
    assert code == 1 and len(errors) == 1, err
    assert "notes.txt: cannot hold the output (a file is where a folder must be)" in errors[0]

"""DeepSpeed ZeRO checkpoints: equal, bit for bit, to what DeepSpeed's own zero_to_fp32 returns."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import SHIPPED
from generate import CASES
from safetensors.torch import load_file
from test_cli_and_errors import RunsShellCommand, leftovers, run_cli

import unshard

STAGES = [
    "deepspeed-zero2",
    "deepspeed-zero3",
    "deepspeed-zero2-bf16",
    "deepspeed-zero3-bf16",
    "deepspeed-zero1-bf16",
    "deepspeed-zero2-fp16",
]


@pytest.mark.parametrize("case", [*STAGES, "deepspeed-zero2-universal"])
def test_fp32_master_weights_equal_deepspeeds_own(case, fixture_case, tmp_path):
    fixture = fixture_case(case)
    unshard.convert(fixture / CASES[case].src, tmp_path / "out", dtype="float32", progress=False)
    written = load_file(tmp_path / "out" / "model.safetensors")
    oracle = load_file(fixture / "reference-fp32.safetensors")  # get_fp32_state_dict_from_zero_checkpoint
    before = load_file(fixture / "before.safetensors")
    assert sorted(written) == sorted(oracle)
    for name, expected in oracle.items():
        assert written[name].dtype == torch.float32 and torch.equal(written[name], expected), name
    assert any(not torch.equal(written[n], before[n]) for n in before)  # the step really happened


def test_oracle_recomputed_by_installed_deepspeed(tmp_path):
    """The shipped oracle files are DeepSpeed's answer; ask the installed DeepSpeed again."""
    zero_to_fp32 = pytest.importorskip("deepspeed.utils.zero_to_fp32")
    for case in ("deepspeed-zero2", "deepspeed-zero3"):
        checkpoint = SHIPPED / case / "checkpoint-1"
        expected = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
        ckpt = unshard.open_checkpoint(checkpoint)
        for name, tensor in expected.items():
            assert torch.equal(ckpt.read(name), tensor), name


def test_module_weights_are_the_16bit_copy(tmp_path):
    checkpoint = SHIPPED / "deepspeed-zero2-bf16" / "checkpoint-1"
    info = unshard.inspect(checkpoint, weights="module")
    assert info["weights"] == "module" and info["dtypes"] == {"bfloat16": 21}
    unshard.convert(checkpoint, tmp_path / "out", weights="module", progress=False)
    written = load_file(tmp_path / "out" / "model.safetensors")
    masters = load_file(SHIPPED / "deepspeed-zero2-bf16" / "reference-fp32.safetensors")
    for name, master in masters.items():
        assert written[name].dtype == torch.bfloat16
        assert torch.equal(written[name], master.to(torch.bfloat16)), name
    with pytest.raises(unshard.CheckpointError, match="ZeRO-3 keeps no whole weights"):
        unshard.open_checkpoint(SHIPPED / "deepspeed-zero3" / "checkpoint-1", weights="module")


def test_source_options_stand_for_the_keywords():
    """`source=SourceOptions(...)` (what the CLI passes) plans what the keyword arguments plan."""
    checkpoint = SHIPPED / "deepspeed-zero2-bf16" / "checkpoint-1"
    grouped = unshard.inspect(checkpoint, source=unshard.SourceOptions(weights="module", check=False))
    assert grouped == unshard.inspect(checkpoint, weights="module", check=False)
    assert grouped["weights"] == "module" and grouped["dtypes"] == {"bfloat16": 21}
    assert unshard.inspect(checkpoint, source=unshard.SourceOptions())["dtypes"] != grouped["dtypes"]


def test_inspect_says_stage_and_weights():
    code, out, err = run_cli("inspect", SHIPPED / "deepspeed-zero3-bf16" / "checkpoint-1")
    assert code == 0, err
    assert "deepspeed-zero" in out and "zero stage      3" in out and "weights         master" in out
    assert "optimizer files bf16" in out and "world size      3" in out


def test_trainer_files_are_not_copied(tmp_path):
    checkpoint = tmp_path / "checkpoint-1"
    shutil.copytree(SHIPPED / "deepspeed-zero2" / "checkpoint-1", checkpoint)
    (checkpoint / "zero_to_fp32.py").write_text("# a trainer's script, not model code\n")
    (checkpoint / "trainer_state.json").write_text("{}")
    unshard.convert(checkpoint, tmp_path / "out", progress=False)
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"config.json", "tokenizer.json", "chat_template.jinja", "generation_config.json"} <= names
    assert not names & {"latest", "zero_to_fp32.py", "trainer_state.json", "global_step1"}


def test_missing_optimizer_partition(tmp_path):
    checkpoint = tmp_path / "checkpoint-1"
    shutil.copytree(SHIPPED / "deepspeed-zero3" / "checkpoint-1", checkpoint)
    (checkpoint / "global_step1" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    code, _, err = run_cli("convert", checkpoint, tmp_path / "out")
    assert code == 1 and "rank(s) [1] are missing" in err and not (tmp_path / "out").exists()
    assert not leftovers(tmp_path)


def test_optimizer_file_that_runs_code_is_refused(tmp_path):
    checkpoint = tmp_path / "checkpoint-1"
    shutil.copytree(SHIPPED / "deepspeed-zero2" / "checkpoint-1", checkpoint)
    marker = tmp_path / "pwned"
    torch.save(
        {"optimizer_state_dict": RunsShellCommand(marker)},
        checkpoint / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
    )
    code, _, err = run_cli("inspect", checkpoint)
    assert code == 1 and "refused to load" in err and not marker.exists()


def test_universal_folder_is_found_from_latest_universal(tmp_path):
    checkpoint = SHIPPED / "deepspeed-zero2-universal" / "checkpoint-1"
    # `latest` (the original ZeRO files) wins when both are there; the universal folder is read directly.
    assert unshard.open_checkpoint(checkpoint).layout == "deepspeed-zero"
    assert unshard.open_checkpoint(checkpoint / "global_step1_universal").layout == "deepspeed-universal"


def test_tag_picks_another_save(tmp_path):
    checkpoint = tmp_path / "checkpoint-1"
    shutil.copytree(SHIPPED / "deepspeed-zero2" / "checkpoint-1", checkpoint)
    (checkpoint / "global_step1").rename(checkpoint / "global_step7")
    code, _, err = run_cli("inspect", checkpoint)  # `latest` still names global_step1
    assert code == 1 and "names 'global_step1', which is not here; tags here: global_step7; pass --tag" in err
    code, out, err = run_cli("inspect", checkpoint, "--tag", "global_step7")
    assert code == 0 and "global_step7" in out, err
    code, _, err = run_cli("inspect", checkpoint, "--tag", "global_step9")
    assert code == 1 and "no tag folder 'global_step9'; tags here: global_step7" in err


def test_frozen_parameter_comes_from_the_model_states():
    for case in ("deepspeed-zero2", "deepspeed-zero3"):
        ckpt = unshard.open_checkpoint(SHIPPED / case / "checkpoint-1")
        oracle = load_file(SHIPPED / case / "reference-fp32.safetensors")
        assert torch.equal(ckpt.read("model.norm.weight"), oracle["model.norm.weight"])
        assert all(p.key.startswith("frozen/") for p in ckpt.tensors["model.norm.weight"].pieces)


@pytest.mark.parametrize("weights", ["master", "module"])
def test_deepspeed_moe_experts_from_every_expert_parallel_rank(weights, fixture_case):
    """DeepSpeed's MoE layers (4 experts, ep_size 2, 4 ranks): the experts' fp32 partitions sit in a
    group of their own, split over the expert-data-parallel ranks under local numbers; the whole
    state dict, experts under global numbers, is what every rank's module held (gathered by the
    fixture with DeepSpeed's own expert-parallel rank)."""
    fixture = fixture_case("deepspeed-moe-ep2-zero2")
    checkpoint = unshard.open_checkpoint(fixture / "checkpoint", weights=weights)
    reference, before = (load_file(fixture / f) for f in ("reference.safetensors", "before.safetensors"))
    assert sorted(checkpoint.tensors) == sorted(reference)
    assert sum(".deepspeed_experts." in n for n in reference) == 2 * 4 * 4  # 2 layers, 4 experts, 4 tensors
    for name, expected in reference.items():
        assert torch.equal(checkpoint.read(name), expected), name
        assert not torch.equal(expected, before[name]), name  # the step moved every weight
    assert checkpoint.facts["experts"] == [4, 4]


def test_shared_params_tied_embeddings(fixture_case, tmp_path):
    """lm_head tied to the embedding: DeepSpeed optimises one parameter and records the other in
    `shared_params`. Both names read as DeepSpeed's own answer; the folder holds the weight once."""
    fixture = fixture_case("deepspeed-zero3-tied")
    oracle = load_file(fixture / "reference-fp32.safetensors")  # get_fp32_state_dict_from_zero_checkpoint
    checkpoint = unshard.open_checkpoint(fixture / "checkpoint-1")
    assert "lm_head.weight" in oracle and sorted(checkpoint.tensors) == sorted(oracle)
    for name, expected in oracle.items():
        assert torch.equal(checkpoint.read(name), expected), name
    unshard.convert(fixture / "checkpoint-1", tmp_path / "out", progress=False)
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert "lm_head.weight" not in written
    assert torch.equal(written["model.embed_tokens.weight"], oracle["lm_head.weight"])


def test_tensors_transformers_joins_on_saving_from_zero3_s_flat_partitions(fixture_case, tmp_path):
    """HRM-Text under ZeRO-3, each of its tensors cut into flat ranges over three ranks: unshard's folder joins its
    gate, q, k and v into the one gqkv_proj (and gate and up into gate_up_proj) that save_pretrained writes, from those
    ranges as they lie: the tensors of DeepSpeed's own state dict saved by transformers, bit for bit."""
    fixture = fixture_case("deepspeed-zero3-hrmtext")
    unshard.convert(fixture / "checkpoint-1", tmp_path / "out", dtype="float32", progress=False)
    written = load_file(tmp_path / "out" / "model.safetensors")
    reference = load_file(fixture / "reference" / "model.safetensors")  # (save_pretrained of zero_to_fp32's)
    assert "model.L_module.layers.0.attn.gqkv_proj.weight" in reference and sorted(written) == sorted(reference)
    for name, expected in reference.items():
        assert torch.equal(written[name], expected), name

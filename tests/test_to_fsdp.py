"""The way back into verl's FSDP training: `--to fsdp --world-size N` writes the rank files a run of N ranks resumes
from. verl's own checkpoint manager loads them into a model its `apply_fsdp2` wraps (at a world size other than the
one trained at) with the source's logits; each file holds what verl's own save of the model holds; converted back,
they give the source's safetensors bytes."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import zipfile

import pytest
import torch
from conftest import FIXTURES, SHIPPED, tied_qwen2
from generate import free_port, peer_python
from test_cli_and_errors import run_cli

import unshard
from unshard.types import OutputOptions

transformers = pytest.importorskip("transformers")
LLAMA = SHIPPED / "llama-fsdp2" / "global_step_1" / "actor"  # verl's FSDP2 files of 4 ranks (cpu mesh)
TOKENS = torch.randint(0, 103, (2, 12), generator=torch.Generator().manual_seed(3))


def to_fsdp(src, out, world: int, device: str = "cpu", fsdp_size: int = 0, **options):
    output = OutputOptions(to="fsdp", world_size=world, mesh_device=device, fsdp_size=fsdp_size)
    return unshard.convert(src, out, output=output, progress=False, **options)


def rank_files(out, world: int, role: str = "actor"):
    return [out / role / f"model_world_size_{world}_rank_{rank}.pt" for rank in range(world)]


def records(path) -> dict[str, bytes]:
    """A torch.save archive's records but its serialization id (torch draws a new one each save)."""
    archive = zipfile.ZipFile(path)
    assert archive.testzip() is None  # (every record's CRC-32 is right)
    return {i.filename: archive.read(i) for i in archive.infolist() if not i.filename.endswith("serialization_id")}


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "llama"
    unshard.convert(LLAMA, out, progress=False)
    return out


@pytest.mark.parametrize("world", [3, 40])
def test_round_trip_gives_the_source_bytes(world, hf_model, tmp_path):
    """At 40 ranks, the last eight hold none of a norm's 64 rows, as FSDP2 cuts them."""
    result = to_fsdp(hf_model, tmp_path / "out", world, verify=True, threads=2)
    assert result.files == [f"actor/model_world_size_{world}_rank_{rank}.pt" for rank in range(world)]
    assert json.loads((tmp_path / "out" / "actor" / "fsdp_config.json").read_text()) == {
        "FSDP_version": 2,
        "world_size": world,
    }
    assert (tmp_path / "out" / "actor" / "huggingface" / "tokenizer.json").is_file()
    for path in rank_files(tmp_path / "out", world):
        records(path)
    last = torch.load(rank_files(tmp_path / "out", world)[-1], weights_only=False)
    norm = last["model.norm.weight"]
    assert tuple(norm.shape) == (64,) and tuple(norm._local_tensor.shape) == ((0,) if world == 40 else (20,))
    unshard.convert(tmp_path / "out", tmp_path / "back", progress=False)
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (hf_model / "model.safetensors").read_bytes()


def test_each_file_holds_what_verls_save_holds(tmp_path):
    """Written from verl's own files at their world size: every rank's DTensors are the ones verl saved (the same
    shards, placements and device mesh). The fixture keeps its final norm a plain tensor on every rank: written as
    FSDP2 shards it, rank r's quarter of its rows."""
    to_fsdp(LLAMA, tmp_path / "out", 4)
    for rank, (theirs, ours) in enumerate(zip(rank_files(LLAMA.parent, 4), rank_files(tmp_path / "out", 4))):
        saved, written = torch.load(theirs, weights_only=False), torch.load(ours, weights_only=False)
        assert list(written) == list(saved)
        for key, value in saved.items():
            mine = written[key]
            assert mine.shape == value.shape and mine.placements == (torch.distributed.tensor.Shard(0),), key
            if not hasattr(value, "placements"):  # (the plain norm)
                rows = -(-value.shape[0] // 4)
                assert torch.equal(mine._local_tensor, value[rank * rows : (rank + 1) * rows]), key
                continue
            assert mine.placements == value.placements and mine.device_mesh == value.device_mesh, key
            assert torch.equal(mine._local_tensor, value._local_tensor), key


def test_hsdp_files_hold_what_fsdp2s_save_holds(tmp_path):
    """--fsdp-size 2 of 4 ranks, from FSDP2's own save of an HSDP run (ddp 2 x fsdp 2): every rank's DTensors are the
    ones it saved, each half of the rows on the two ranks of its shard, on the same mesh (its process groups too)."""
    hsdp = SHIPPED / "llama-hsdp" / "global_step_1" / "actor"
    to_fsdp(hsdp, tmp_path / "out", 4, fsdp_size=2, verify=True)
    for theirs, ours in zip(rank_files(hsdp.parent, 4), rank_files(tmp_path / "out", 4)):
        saved, written = torch.load(theirs, weights_only=False), torch.load(ours, weights_only=False)
        assert list(written) == list(saved)
        for key, value in saved.items():
            mine = written[key]
            assert (mine.shape, mine.placements, mine.device_mesh) == (value.shape, value.placements, value.device_mesh)
            assert mine.device_mesh._dim_group_names == value.device_mesh._dim_group_names, key
            assert torch.equal(mine._local_tensor, value._local_tensor), key


@pytest.mark.parametrize("fsdp, world, fsdp_size", [(2, 3, 0), (1, 3, 0), (2, 4, 2)])
def test_verl_resumes_from_it_at_a_new_world_size(fsdp, world, fsdp_size, hf_model, tmp_path):
    """Trained at 4 ranks, written for 3: verl's FSDPCheckpointManager loads each rank's file into the model its
    apply_fsdp2 wraps (or FSDP1, as verl's strategy fsdp wraps it: the same files), which starts from other random
    weights, and the forward pass gives the source's logits. And for 4 ranks in HSDP (fsdp_size 2), as verl wraps the
    model on its ("ddp", "fsdp") mesh."""
    to_fsdp(LLAMA, tmp_path / "out", world, fsdp_size=fsdp_size)
    torch.save(TOKENS, tmp_path / "tokens.pt")
    with tempfile.TemporaryDirectory(prefix="unshard-torchrun-") as scratch:
        done = subprocess.run(
            [
                str(peer_python("verl")),
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                str(world),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(free_port()),
                str(FIXTURES / "verl_fsdp_loader.py"),
                "--actor",
                str(tmp_path / "out" / "actor"),
                "--tokens",
                str(tmp_path / "tokens.pt"),
                "--out",
                str(tmp_path / "logits.pt"),
                "--fsdp",
                str(fsdp),
                "--fsdp-size",
                str(fsdp_size),
            ],
            capture_output=True,
            text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=scratch, HF_HUB_OFFLINE="1"),
            timeout=600,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_model, dtype=torch.float32)
    with torch.no_grad():
        expected = model.eval()(TOKENS).logits
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected, atol=1e-5, rtol=0)


def test_a_tied_head_is_the_embeddings_dtensor(tmp_path):
    """The state dict FSDP2 loads names a tied head too: the same DTensor as the embedding, saved once."""
    model = tied_qwen2(tmp_path / "tied")
    to_fsdp(tmp_path / "tied", tmp_path / "out", 2, verify=True)
    state = torch.load(rank_files(tmp_path / "out", 2)[1], weights_only=False)
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    assert set(state) == set(model.state_dict())
    unshard.convert(tmp_path / "out", tmp_path / "back", progress=False)
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (
        tmp_path / "tied" / "model.safetensors"
    ).read_bytes()


def test_a_value_model_goes_to_critic_and_the_mesh_is_cudas_by_default(tmp_path):
    critic = SHIPPED / "qwen2-fsdp2-critic" / "global_step_1"
    code, out, err = run_cli("convert", critic, tmp_path / "out", "--to", "fsdp", "--world-size", "2", "--no-progress")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["critic"]
    state = torch.load(rank_files(tmp_path / "out", 2, "critic")[0], weights_only=False)
    assert {value.device_mesh.device_type for value in state.values()} == {"cuda"}
    assert "score.weight" in state


def test_workers_write_the_same_records(hf_model, tmp_path):
    """Each worker writes its ranks' files (reading every tensor, writing its ranks' rows)."""
    to_fsdp(hf_model, tmp_path / "one", 3)
    result = to_fsdp(hf_model, tmp_path / "three", 3, workers=3, verify=True)
    assert result.writers == 3
    for one, three in zip(rank_files(tmp_path / "one", 3), rank_files(tmp_path / "three", 3)):
        assert records(one) == records(three)


def test_refusals_are_one_line_and_write_nothing(hf_model, tmp_path):
    for extra, said in (
        ([], "--to fsdp needs --world-size N"),
        (["--world-size", "2", "--quantize", "W4A16"], "--to fsdp writes the weights as they are"),
        (["--world-size", "4", "--fsdp-size", "3"], "--fsdp-size 3: give a divisor of --world-size 4"),
    ):
        code, _, err = run_cli("convert", hf_model, tmp_path / "out", "--to", "fsdp", *extra)
        assert code == 1 and said in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out").exists()


def test_dry_run_says_the_files(hf_model):
    code, out, err = run_cli("convert", hf_model, "nowhere", "--to", "fsdp", "--world-size", "2", "--dry-run")
    assert code == 0, err
    assert "verl FSDP rank files (actor/), 2 ranks, a cuda device mesh" in out
    assert "actor/model_world_size_2_rank_1.pt" in out

"""Write a large FSDP2 checkpoint cheaply, for benchmarks: meta-device init, then random weights.

    torchrun --nproc_per_node 2 bench/make_checkpoint.py --gb 2 --writer verl|verl-tp|dcp --out DIR

DIR/ckpt holds the checkpoint (verl rank files in actor/, or a DCP folder with {"model": ...}),
DIR/hf the model's config.json for --config-from. verl-tp is tensor parallelism instead of FSDP:
projections cut in rows or columns as Megatron-style TP does, the embedding in columns. For verl
rank files the ranks hold their shards one after the other, so a checkpoint may be as large as the
machine's memory times the number of ranks; DCP's save is collective and needs all of it at once.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

HIDDEN, FFN, VOCAB = 2048, 5632, 32000
# A real tokenizer and chat template (the test fixtures'), as a trainer saves beside the weights;
# verl's merger refuses a folder without one.
TOKENIZER = (
    Path(__file__).resolve().parent.parent / "tests/fixtures/checkpoints/llama-fsdp2/global_step_1/actor/huggingface"
)


def save_hf_files(config, folder: Path) -> None:
    config.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copyfile(TOKENIZER / name, folder / name)


def layers_for(gb: float) -> int:
    per_layer = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * HIDDEN // 4 + 3 * HIDDEN * FFN + 2 * HIDDEN
    fixed = 2 * VOCAB * HIDDEN + HIDDEN
    return max(1, round((gb * 1e9 / 4 - fixed) / per_layer))


def random_weights(model, rank: int):
    """The model's shards of this rank, made real and filled (the weights' values do not matter)."""
    model.to_empty(device="cpu")
    torch.manual_seed(rank)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, required=True, help="approximate fp32 size")
    ap.add_argument("--writer", choices=("verl", "verl-tp", "dcp"), default="verl")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, LlamaConfig

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=layers_for(args.gb),
        num_attention_heads=16,
        num_key_value_heads=4,
        dtype=torch.float32,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if args.writer == "verl-tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        cols, rows = ColwiseParallel(), RowwiseParallel()
        plan = {"model.embed_tokens": cols, "lm_head": cols}  # an embedding's columns: Shard(1)
        for i in range(config.num_hidden_layers):
            plan.update({f"model.layers.{i}.self_attn.{n}": cols for n in ("q_proj", "k_proj", "v_proj")})
            plan.update({f"model.layers.{i}.mlp.{n}": cols for n in ("gate_proj", "up_proj")})
            plan.update({f"model.layers.{i}.self_attn.o_proj": rows, f"model.layers.{i}.mlp.down_proj": rows})
        parallelize_module(model, mesh, plan)
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    out = Path(args.out)
    if rank == 0:
        save_hf_files(config, out / "hf")
    if args.writer.startswith("verl"):
        actor = out / "ckpt" / "actor"
        actor.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            save_hf_files(config, actor / "huggingface")
            (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
        # The ranks take turns to hold their shard, so that a checkpoint larger than this machine's
        # memory can be made (rank files need no collective to be written).
        for turn in range(world):
            dist.barrier()
            if turn == rank:
                torch.save(random_weights(model, rank).state_dict(), actor / f"model_world_size_{world}_rank_{rank}.pt")
                for param in model.parameters():  # freed here: FSDP's and DTensor's objects keep them otherwise
                    (param.to_local() if hasattr(param, "to_local") else param).untyped_storage().resize_(0)
    else:
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": random_weights(model, rank).state_dict()}, checkpoint_id=out / "ckpt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

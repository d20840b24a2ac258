"""`unshard verl merge|test`: verl's own `python -m verl.model_merger` command line, taken as it is.

Every flag of verl 0.9.1's merger is accepted with verl's meaning, so switching is changing the prefix:
- merge writes what verl's merger writes where it works: the weights in bfloat16 (verl casts every shard
  to bf16), tied weights once, a LoRA adapter beside the base in `TARGET/lora_adapter/`, the trainer's
  config, generation config, tokenizer and processor files; and the same where verl's merger fails
  (FSDP2 over TP, FSDP1 ShardedTensors, DCP, DeepSpeed, any layout unshard reads).
- test compares the checkpoint, as merge would write it, with `--test_hf_dir`'s weights in bfloat16, as
  verl does (names, shapes, dtypes, values within 1e-6), and fails when they differ.
Flags that steer how verl builds a model on a GPU mean nothing here: they are accepted, and said so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .errors import UnshardError

VERL_DTYPE = "bfloat16"  # verl's FSDP merger casts every shard with .bfloat16(), its Megatron one builds bf16
VERL_SHARD_SIZE = "50GB"  # what transformers' save_pretrained cuts files at, as verl calls it
TOLERANCE = 1e-6  # verl's test: torch.testing.assert_close(atol=1e-6, rtol=1e-6)


class VerlTestFailed(UnshardError, AssertionError):
    pass


def add_parser(sub) -> None:
    verl = sub.add_parser("verl", help="verl's model merger command line (python -m verl.model_merger ...), as it is")
    operations = verl.add_subparsers(dest="operation", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", required=True, choices=["fsdp", "megatron"], help="the trainer's backend")
    common.add_argument("--local_dir", help="the checkpoint: global_step_N/actor (any layout unshard reads)")
    common.add_argument(
        "--tie-word-embedding",
        action="store_true",
        help="the model ties lm_head to the embeddings (checked against config.json)",
    )
    common.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="accepted; unshard copies a model's custom code and never runs it",
    )
    common.add_argument("--is-value-model", action="store_true", help="the checkpoint is a critic / value model")
    common.add_argument("--use_cpu_initialization", action="store_true", help="accepted; unshard builds no model")
    common.add_argument("--threads", type=int, default=2, help="(unshard) tensors assembled in parallel")
    common.add_argument("--no-progress", dest="progress", action="store_false", default=None)

    merge = operations.add_parser("merge", parents=[common], help="write the Hugging Face model")
    merge.add_argument("--target_dir", default="tmp", help="output folder (default tmp, as verl's)")
    merge.add_argument(
        "--hf_upload_path",
        dest="push_to_hub",
        metavar="REPO_ID",
        help="push the folder to this Hub repository (unshard's --push-to-hub)",
    )
    merge.add_argument("--private", action="store_true", help="a new Hub repository is private")
    merge.add_argument(
        "--overwrite",
        action="store_true",
        help="(unshard) replace a non-empty target_dir; verl writes over it, unshard asks first",
    )
    merge.add_argument("--verify", action="store_true", help="(unshard) read every written byte back and compare")

    merge.set_defaults(revision=None, commit_message=None, distributed=False)  # (verl's merger: one process)
    test = operations.add_parser("test", parents=[common], help="compare with a Hugging Face model folder")
    test.add_argument("--test_hf_dir", required=True, help="the reference Hugging Face model folder")


def plan(args, ask_later: bool = False):
    """The conversion verl's flags ask for, and what to tell the user about the flags."""
    from .plan import build_plan, lora
    from .sources import SourceOptions, open_checkpoint
    from .types import OutputOptions

    if not args.local_dir:
        raise UnshardError("--local_dir is required: the checkpoint folder (global_step_N/actor)")
    local = Path(args.local_dir)
    if not local.exists():
        raise FileNotFoundError(f"{local}: no such checkpoint folder; pass --local_dir global_step_N/actor")
    notes = []
    if args.use_cpu_initialization:
        notes.append("--use_cpu_initialization: unshard builds no model, on any device; nothing to do")
    if args.trust_remote_code:
        notes.append("--trust-remote-code: unshard copies custom code named by auto_map and never runs it")
    checkpoint = open_checkpoint(local)
    try:
        # verl writes a LoRA adapter apart from the base it was trained on (TARGET/lora_adapter/)
        with_adapter = any(lora.ADAPTER.match(name) for name in checkpoint.tensors)
        the_plan = build_plan(
            checkpoint,
            OutputOptions(VERL_DTYPE, VERL_SHARD_SIZE),
            SourceOptions(lora="separate" if with_adapter else "merge"),
            ask_later=ask_later,
        )
        return the_plan, notes + _flag_notes(args, the_plan)
    except BaseException:
        checkpoint.close()
        raise


def _flag_notes(args, plan) -> list[str]:
    """The flags whose meaning depends on what the checkpoint turned out to be."""
    from .names.hf_names import read_config

    layout = plan.checkpoint.layout
    megatron = layout.startswith("megatron")
    notes = []
    if (args.backend == "megatron") != megatron:
        notes.append(f"--backend {args.backend}, but {plan.checkpoint.path} holds a {layout} checkpoint: read as that")
    config = {**(read_config(plan.config_folder) or {}), **plan.config_updates}
    if args.tie_word_embedding and not config.get("tie_word_embeddings", False):
        raise UnshardError(
            f"--tie-word-embedding, but {plan.config_folder}/config.json has tie_word_embeddings "
            "false: the model's lm_head is its own; drop the flag (verl would leave lm_head out)"
        )
    if args.is_value_model:
        if "architectures" not in plan.config_updates:
            raise UnshardError(
                f"--is-value-model, but {plan.checkpoint.path} ends in no value head (score.weight): "
                "is this the actor? point --local_dir at global_step_N/critic"
            )
    return notes


def compare(plan, reference: Path, progress: bool | None) -> int:
    """verl's `test`: every tensor merge would write equals the reference's in bfloat16 (1e-6); the count."""
    import torch
    from tqdm import tqdm

    from .plan.lora import ADAPTER_FILE
    from .sources import open_checkpoint
    from .write.assemble import materialise

    adapter = {id(group) for group in plan.files.get(ADAPTER_FILE, [])}  # written apart, as verl does
    groups = [group for group in plan.groups if id(group) not in adapter]
    ref = open_checkpoint(reference)
    try:
        mine = {o.name: o for group in groups for o in group.outputs}
        missing, extra = sorted(set(ref.tensors) - set(mine)), sorted(set(mine) - set(ref.tensors))
        if missing or extra:
            raise VerlTestFailed(
                f"{plan.checkpoint.path} and {reference} hold different tensors: "
                + "; ".join(
                    f"{what} {len(names)} ({', '.join(names[:3])}...)"
                    for what, names in (("missing", missing), ("extra", extra))
                    if names
                )
            )
        differ = []
        with tqdm(
            total=len(groups), desc="comparing", unit="tensor", disable=None if progress is None else not progress
        ) as bar:
            for group in groups:
                for name, tensor in materialise(plan, group):
                    expected = ref.read(name).to(torch.bfloat16)
                    if tensor.shape != expected.shape:
                        differ.append(f"{name}: shape {tuple(tensor.shape)}, reference {tuple(expected.shape)}")
                    elif not torch.allclose(tensor.float(), expected.float(), atol=TOLERANCE, rtol=TOLERANCE):
                        gap = (tensor.float() - expected.float()).abs().max().item()
                        differ.append(f"{name}: differs by up to {gap:.3g}")
                bar.update(1)
        if differ:
            raise VerlTestFailed(
                f"{plan.checkpoint.path} differs from {reference} in {len(differ)} tensor(s) "
                f"(bfloat16, atol/rtol {TOLERANCE}): " + "; ".join(differ[:3])
            )
        return len(mine)
    finally:
        ref.close()

"""Sources: one reader module per checkpoint layout; `open_checkpoint` picks the one that fits SRC.

base.py is what every reader gives (a Checkpoint of whole tensors, each a list of pieces in files);
placements.py puts shards back into whole tensors; torch_archives.py, safe_pickle.py and
safe_torch_load.py read torch.save files without letting them run code.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError
from . import (
    colossalai,
    dcp,
    dcp_safetensors,
    deepspeed,
    deepspeed_universal,
    fsdp_rank_files,
    hf_pickles,
    hf_safetensors,
    megatron,
    megatron_dist,
    remote,
)
from .base import Checkpoint, Piece, SourceTensor

# Each entry: (does SRC look like this layout, given the options?, open it). Tried in order.
READERS = [
    (lambda src, opts: deepspeed_universal.find_folder(src) is not None, deepspeed_universal.open_folder),
    (
        lambda src, opts: deepspeed.find_folder(src, opts.get("tag")) is not None or (src / "latest").is_file(),
        deepspeed.open_folder,
    ),
    (lambda src, opts: megatron.find_folder(src, opts.get("iteration")) is not None, megatron.open_folder),
    (lambda src, opts: megatron_dist.find_folder(src, opts.get("iteration")) is not None, megatron_dist.open_folder),
    (lambda src, opts: dcp.find_folder(src) is not None, dcp.open_folder),
    (lambda src, opts: dcp_safetensors.find_folder(src) is not None, dcp_safetensors.open_folder),
    (lambda src, opts: colossalai.find_folder(src) is not None, colossalai.open_folder),
    (lambda src, opts: hf_safetensors.find_folder(src) is not None, hf_safetensors.open_folder),
    (lambda src, opts: hf_pickles.find_folder(src) is not None, hf_pickles.open_folder),
    (lambda src, opts: fsdp_rank_files.find_files(src) is not None, fsdp_rank_files.open_folder),
]


@dataclass(frozen=True)
class SourceOptions:
    """What describes the source beyond its path, as a user tells it (the output: sinks.OutputOptions)."""

    config_from: str | Path | None = None  # the Hugging Face folder or Hub id whose config and tokenizer go with it
    weights: str = "master"  # DeepSpeed: the fp32 optimizer copy ("master") or the 16-bit model states ("module")
    tag: str | None = None  # DeepSpeed: the tag folder to read instead of the one `latest` names
    iteration: int | None = None  # Megatron: the iteration to read instead of the one the tracker file names
    lora_alpha: float | None = None  # a LoRA adapter's alpha, where nothing beside the checkpoint records it
    lora: str = "merge"  # a LoRA adapter folded into its base ("merge"), or written as a PEFT folder ("separate")
    architecture: str | None = None  # the transformers class config.json names (by default the one the weights fit)
    check: bool = True  # the weights checked against the config, and the config's files against their formats

    def reader_options(self) -> dict:
        """The options a layout's reader takes (an error from `open_checkpoint` where it takes none)."""
        return {
            k: v
            for k, v in (("weights", self.weights), ("tag", self.tag), ("iteration", self.iteration))
            if v not in ("master", None)
        }


def open_checkpoint(src: str | Path, **options) -> Checkpoint:
    """Recognise the layout of SRC and open it (metadata only). SRC may be a URL (`s3://bucket/run/step`): see
    remote.py.

    `options` are layout-specific (`weights="module"` for DeepSpeed); one the layout does not take
    is an error rather than silently ignored.
    """
    if remote.is_url(src):  # object storage: read from a local mirror of what a conversion reads
        fetched = remote.mirrored(str(src))
        try:
            checkpoint = open_checkpoint(fetched.local, **options)
        except CheckpointError as e:
            raise CheckpointError(remote.shown(str(e))) from None
        fetched.check_covered(checkpoint)
        checkpoint.facts.update(remote=fetched.fact(), url=remote.shown(str(checkpoint.path)))
        return checkpoint
    src = Path(src)
    if not src.exists():
        raise CheckpointError(f"{src}: no such file or folder")
    for matches, open_ in READERS:
        if matches(src, options):
            accepted = inspect.signature(open_).parameters
            unknown = [name for name in options if name not in accepted]
            if unknown:
                raise CheckpointError(f"{src}: --{unknown[0]} does not apply to this checkpoint's layout; drop it")
            return open_(src, **options)
    raise CheckpointError(
        f"{src}: not a checkpoint layout unshard knows; point at the folder holding model_world_size_*_rank_*.pt "
        "(verl: global_step_N/actor), a DCP folder (.metadata), DCP-written shard-*-model-*.safetensors, "
        "a DeepSpeed folder with `latest`, a Megatron checkpoint (mp_rank_* or torch_dist), a Hugging Face "
        "folder (safetensors, or pytorch_model*.bin), a ColossalAI step folder (modeling/), or a whole state-dict "
        ".pt/.bin/.safetensors file"
    )


__all__ = ["Checkpoint", "Piece", "SourceTensor", "open_checkpoint"]

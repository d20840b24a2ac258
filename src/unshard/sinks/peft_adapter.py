"""A PEFT adapter folder (adapter_model.safetensors, adapter_config.json, README.md) as an output format:
what `unshard extract-lora` writes, loaded with peft's `PeftModel.from_pretrained(base, OUT)`."""

from __future__ import annotations

from pathlib import Path

from ..types import Group, Plan
from .hf_folder import HFFolder

ADAPTER_WEIGHTS = "adapter_model.safetensors"


class PeftAdapterFolder(HFFolder):
    """Staged, written and checked as a model folder is; one weights file (peft reads no index), and
    beside it the adapter's config and card, which the plan's `extra_files` and `card` give."""

    def __init__(self, card):
        self.card = card  # (plan, checksums) -> README.md, once every tensor is written

    def lay_out(self, groups: dict[str, Group], max_shard_size: int | str) -> dict[str, list[Group]]:
        return {ADAPTER_WEIGHTS: list(groups.values())}

    def finish(self, plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None):
        files = {**plan.extra_files, **(extra_files or {}), "README.md": self.card(plan, digests)}
        for name, text in files.items():
            (folder / name).write_text(text)
        return list(files), []

"""Every step of a run: the checkpoint folders a trainer saved under one root, by their step numbers.

verl saves `global_step_N/`, Megatron-LM `iter_000000N/`, torchtitan `step-N/`, torchtune `epoch_N/`, the Hugging
Face Trainer (and accelerate, DeepSpeed's through it) `checkpoint-N/`, DeepSpeed's own engine `global_stepN/`
tags beside a `latest` file, and vLLM's speculators its epochs as `N/` (save_pretrained's folders). Each step is
converted as SRC on its own (a DeepSpeed tag through its root and --tag).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import CheckpointError

STEP_FOLDERS = re.compile(r"^(?:global_step_|iter_|step-|epoch_|checkpoint-)(\d+)$")
DEEPSPEED_TAG = re.compile(r"^global_step(\d+)$")
EPOCH_NUMBER = re.compile(r"^(\d+)$")  # (speculators': a model folder named by its epoch alone)


def find_steps(run: Path) -> dict[int, tuple[Path, dict]]:
    """step -> (the folder to convert, the reader's options) of every step saved under `run`."""
    if not run.is_dir():
        raise CheckpointError(f"{run}: not a folder; --all-steps and --steps take the folder a run saves its steps in")
    steps: dict[int, tuple[Path, dict]] = {}
    for folder in sorted(run.iterdir()):
        if not folder.is_dir():
            continue
        if found := STEP_FOLDERS.match(folder.name):
            steps[int(found[1])] = (folder, {})
        elif (found := DEEPSPEED_TAG.match(folder.name)) and (run / "latest").is_file():
            steps[int(found[1])] = (run, {"tag": folder.name})
        elif (found := EPOCH_NUMBER.match(folder.name)) and (folder / "config.json").is_file():
            steps[int(found[1])] = (folder, {})
    if not steps:
        raise CheckpointError(
            f"{run}: no step folders here (global_step_N, iter_N, step-N, epoch_N, checkpoint-N, N); point at the "
            "folder that holds them, or convert one step without --all-steps / --steps"
        )
    return dict(sorted(steps.items()))


def chosen(steps: dict[int, tuple[Path, dict]], asked: str | None, where: Path) -> list[int]:
    """The steps `--steps 100,200,last` names (every one where it is None), in order."""
    if asked is None:
        return list(steps)
    wanted = []
    for word in (w.strip() for w in asked.split(",") if w.strip()):
        step = max(steps) if word == "last" else int(word) if word.isdigit() else None
        if step is None or step not in steps:
            raise CheckpointError(
                f"{where}: --steps {asked}: {word!r} is not a step saved here (saved: "
                f"{', '.join(map(str, steps))}; or `last`)"
            )
        if step not in wanted:
            wanted.append(step)
    return sorted(wanted)

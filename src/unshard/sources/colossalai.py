"""A training step saved by ColossalAI's Booster, as its trainers lay it out (Colossal-LLaMA's and
ColossalChat's `save_checkpoint`): `epoch-E_step-S/` holding `modeling/`, `optimizer/`, `lr_scheduler`
and `running_states.json`.

`modeling/` is what `Booster.save_model(shard=True)` writes with every plugin (TorchDDP, Gemini,
LowLevelZero, HybridParallel, MoE): the model gathered whole on the first rank, in shards named by an
index (`pytorch_model-0000i.bin` with `pytorch_model.bin.index.json`, or safetensors with
`use_safetensors=True`; pipeline stages add `-stage-0000s-shard` to the names, the index lists them all),
with `config.json` and `generation_config.json`. So it is read as the Hugging Face folder it nearly is.
`save_model(shard=False)` writes one file, read as a whole state dict (`model.pt`) or safetensors file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..errors import CheckpointError
from . import hf_pickles, hf_safetensors
from .base import Checkpoint

LAYOUT = "colossalai"
MODEL_FOLDER = "modeling"


def find_folder(src: Path) -> Path | None:
    """SRC's modeling/ folder, where SRC is a step folder ColossalAI's trainers wrote."""
    model = src / MODEL_FOLDER
    if src.is_dir() and model.is_dir() and ((src / "running_states.json").is_file() or (src / "optimizer").is_dir()):
        return model
    return None


def open_folder(src: Path) -> Checkpoint:
    model = find_folder(src)
    if model is None:
        raise CheckpointError(f"{src}: no modeling/ folder with running_states.json or optimizer/ beside it")
    if hf_safetensors.find_folder(model) is not None:
        found, stored = hf_safetensors.open_folder(model), "safetensors"
    elif hf_pickles.find_folder(model) is not None:
        found, stored = hf_pickles.open_folder(model), "pickles"
    elif (model / "adapter_config.json").is_file():
        raise CheckpointError(
            f"{model}: a LoRA adapter (Booster.save_lora_as_pretrained), not a model; fold it into "
            f"its base with `unshard merge`, naming the model `BASE+{model}` in the recipe"
        )
    else:
        raise CheckpointError(
            f"{model}: no config.json with model weights (pytorch_model*.bin or *.safetensors); "
            "copy the folder Booster.save_model wrote whole"
        )
    facts = {"weights": f"{MODEL_FOLDER}/, {found.facts.get('files', 1)} file(s) of {stored} (Booster.save_model)"}
    states = src / "running_states.json"
    if states.is_file():
        try:
            running = json.loads(states.read_text())
            facts.update({key: running[key] for key in ("epoch", "step") if key in running})
        except (OSError, ValueError, TypeError):
            pass  # the trainer's own bookkeeping: the weights do not depend on it
    return dataclasses.replace(found, layout=LAYOUT, path=src, facts=facts)

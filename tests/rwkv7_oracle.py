"""What rwkv7-hf's RWKV7ForCausalLM computes of a prompt (run in the `rwkv7` peer venv):

    python rwkv7_oracle.py FOLDER 5,20,33 OUT.npy

loads the model from FOLDER (save_pretrained's: config.json, model.safetensors) with rwkv7-hf's own class, in float32,
and saves the logits at each position of the prompt (run whole, from an empty state)."""

import sys

import numpy as np
import torch
from rwkv7_hf.configuration_rwkv7 import RWKV7Config
from rwkv7_hf.modeling_rwkv7 import RWKV7ForCausalLM


def logits(folder: str, prompt: list[int], out: str) -> None:
    model = RWKV7ForCausalLM.from_pretrained(folder, config=RWKV7Config.from_pretrained(folder), dtype=torch.float32)
    with torch.no_grad():
        np.save(out, model.eval()(torch.tensor([prompt])).logits[0].numpy())


if __name__ == "__main__":
    logits(sys.argv[1], [int(i) for i in sys.argv[2].split(",")], sys.argv[3])

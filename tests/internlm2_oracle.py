"""What InternLM2's own InternLM2ForCausalLM (xtuner's copy of the Hub's code) computes of a prompt (run in the
`internlm2` peer venv):

    python internlm2_oracle.py FOLDER 5,20,33 OUT.npy

loads the model from FOLDER (save_pretrained's: config.json, model.safetensors) in float32, and saves the logits at
each position of the prompt."""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from make_internlm2 import internlm2  # noqa: E402


def logits(folder: str, prompt: list[int], out: str) -> None:
    code = internlm2()
    config = code.InternLM2Config.from_pretrained(folder)
    model = code.InternLM2ForCausalLM.from_pretrained(folder, config=config, torch_dtype=torch.float32)
    with torch.no_grad():
        np.save(out, model.eval()(torch.tensor([prompt]), use_cache=False).logits[0].numpy())


if __name__ == "__main__":
    logits(sys.argv[1], [int(i) for i in sys.argv[2].split(",")], sys.argv[3])

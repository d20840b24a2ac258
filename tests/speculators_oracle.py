"""What vLLM's speculators computes of an EAGLE-3 drafter's first drafting step (run in the `drafters` peer venv):

    python speculators_oracle.py FOLDER FEATURES.npy 5,20,33 OUT.npz

builds speculators' Eagle3DraftModel from the folder its DistributedCheckpointer saved (config.json, model.safetensors),
in float32 with eager attention, and runs its modules as its forward's first step does: FEATURES.npy's rows (each
token's three target hidden states) through fc, each token's embedding beside its row's projection through the first
layer at positions 0, 1, ... (causal), then the norm and the head. OUT.npz gets `g` (fc's projections) and `logits`
(the draft vocabulary's) and `target_ids` (d2t's offsets made target ids)."""

import sys

import numpy as np
import torch
from safetensors.torch import load_file
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig


def first_step(folder: str, features: str, tokens: list[int], out: str) -> None:
    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel(config)
    missing, unexpected = model.load_state_dict(load_file(f"{folder}/model.safetensors"), strict=False)
    assert not unexpected and set(missing) <= set(model._keys_to_ignore_on_save), (missing, unexpected)
    model = model.float().eval()
    rows = torch.from_numpy(np.load(features)).float()[None]
    ids, n = torch.tensor([tokens]), len(tokens)
    with torch.no_grad():
        g = model.fc(model.input_norm(rows) if model.input_norm is not None else rows)
        hidden = torch.cat([model.embed_tokens(ids), g], dim=-1)
        positions = torch.arange(n)[None]
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
        hidden = model.layers[0](
            hidden,
            attention_mask=causal,
            position_ids=positions,
            position_embeddings=model.rotary_emb(hidden, positions),
        )
        logits = model.lm_head(model.norm(hidden))
    target_ids = model.d2t + torch.arange(model.d2t.numel())
    np.savez(out, g=g[0].numpy(), logits=logits[0].numpy(), target_ids=target_ids.numpy())


if __name__ == "__main__":
    first_step(sys.argv[1], sys.argv[2], [int(i) for i in sys.argv[3].split(",")], sys.argv[4])

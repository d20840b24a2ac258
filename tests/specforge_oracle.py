"""What SGLang's SpecForge computes of an EAGLE-3 drafter's first drafting step (run in the `drafters` peer venv):

    python specforge_oracle.py FOLDER FEATURES.npy 5,20,33 OUT.npz

builds SpecForge's LlamaForCausalLMEagle3 from the folder its export_to_hf wrote (config.json, model.safetensors), in
float32 with its sdpa attention, and runs its own methods as its trainer's first step does: FEATURES.npy's rows (each
token's three target hidden states) through project_hidden_states (fc), each token's embedding beside its row's
projection through backbone (its layer, causal, at positions 0, 1, ...), then compute_logits (the norm and the head).
OUT.npz gets `g` (fc's projections), `logits` (the draft vocabulary's) and `target_ids` (d2t's offsets made target
ids)."""

import sys

import numpy as np
import torch
from safetensors.torch import load_file
from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3, prepare_decoder_attention_mask
from transformers import LlamaConfig


def first_step(folder: str, features: str, tokens: list[int], out: str) -> None:
    model = LlamaForCausalLMEagle3(LlamaConfig.from_pretrained(folder), attention_backend="sdpa")
    missing, unexpected = model.load_state_dict(load_file(f"{folder}/model.safetensors"), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model = model.float().eval()
    rows = torch.from_numpy(np.load(features)).float()[None]
    ids, n = torch.tensor([tokens]), len(tokens)
    with torch.no_grad():
        g = model.project_hidden_states(rows)
        embedded = model.embed_input_ids(ids)
        causal = prepare_decoder_attention_mask(torch.ones(1, n, dtype=torch.bool), (1, n), g, 0)
        hidden = model.backbone(
            embedded, g, cache_hidden=None, attention_mask=causal, position_ids=torch.arange(n)[None], use_cache=False
        )
        logits = model.compute_logits(hidden)
    target_ids = model.d2t + torch.arange(model.d2t.numel())
    np.savez(out, g=g[0].numpy(), logits=logits[0].numpy(), target_ids=target_ids.numpy())


if __name__ == "__main__":
    first_step(sys.argv[1], sys.argv[2], [int(i) for i in sys.argv[3].split(",")], sys.argv[4])

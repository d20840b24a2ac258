"""What vLLM's speculators computes of a DFlash2 drafter's block (run in the `drafters` peer venv):

    python dflash_oracle.py FOLDER TARGET FEATURES.npy 5,127,127,127 OUT.npz

builds speculators' DFlash2DraftModel from the folder its DistributedCheckpointer saved (config.json,
model.safetensors), its embedding and head the target's (TARGET's model.safetensors, as speculators loads its
verifier's), in float32 with eager attention, and runs its modules as its _backbone_forward does for one anchor:
FEATURES.npy's rows (the context's target hidden states) through fc and its norm, the block's tokens (the anchor, then
mask tokens) at the positions after them through the layers (each attending to the context and to its whole block),
the norm and the head; then its candidate selector as llama.cpp walks it: each position's top-k candidates, scored
after the anchor (the first drafted position) or after each of the previous position's candidates. OUT.npz gets
`logits` (one row per block position), `candidates` (top-k ids per position) and `scores` (per drafted position: the
scores by predecessor and candidate)."""

import sys

import numpy as np
import torch
from safetensors.torch import load_file
from speculators.models.dflash2 import DFlash2DraftModel, DFlash2SpeculatorConfig


def block(folder: str, target: str, features: str, tokens: list[int], out: str) -> None:
    config = DFlash2SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"
    model = DFlash2DraftModel(config)
    weights = load_file(f"{folder}/model.safetensors")
    verifier = load_file(f"{target}/model.safetensors")
    weights["embed_tokens.weight"] = verifier["model.embed_tokens.weight"]
    weights["lm_head.weight"] = verifier["lm_head.weight"]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= set(model._keys_to_ignore_on_save), (missing, unexpected)
    model = model.float().eval()
    rows = torch.from_numpy(np.load(features)).float()[None]
    context = rows.shape[1]
    positions = torch.arange(context + len(tokens))[None]
    selector = model.candidate_selector
    with torch.no_grad():
        target_hidden = model.hidden_norm(model.fc(rows))
        hidden = model.embed_tokens(torch.tensor([tokens]))
        rotary = model.rotary_emb(hidden, positions)
        for layer in model.layers:
            hidden = layer(
                hidden_states=hidden,
                target_hidden=target_hidden,
                attention_mask=None,  # (the anchor's block attends to the context before it and to itself, whole)
                position_ids=positions,
                position_embeddings=rotary,
            )
        hidden = model.norm(hidden)[0]
        logits = model.lm_head(hidden)
        candidates = logits.topk(selector.top_k, dim=-1).indices
        scores = []
        for i in range(1, len(tokens)):
            predecessors = torch.tensor([tokens[0]]) if i == 1 else candidates[i - 1]
            n = predecessors.numel()
            scores.append(
                selector.score_candidates(
                    logits[i].expand(n, -1), hidden[i].expand(n, -1), predecessors, candidates[i].expand(n, -1)
                ).numpy()
            )
    np.savez(out, logits=logits.numpy(), candidates=candidates.numpy(), scores=np.array(scores[1:]), first=scores[0])


if __name__ == "__main__":
    block(sys.argv[1], sys.argv[2], sys.argv[3], [int(i) for i in sys.argv[4].split(",")], sys.argv[5])

"""What a DFlash drafter's trainer computes of a drafted block (run in the `drafters` peer venv):

    python dflash_oracle.py FOLDER TARGET FEATURES.npy 5,127,127,127 OUT.npz

builds the drafter from its folder with its trainer's own classes, in float32 with eager attention: vLLM's speculators'
DFlash2DraftModel (the folder its DistributedCheckpointer saved: speculators' config) or SGLang's SpecForge's
DFlashDraftModel (its export_to_hf's folder), its embedding and head the target's (TARGET's model.safetensors, as both
load their verifier's). It runs the drafter as its trainer's forward does for one anchor: FEATURES.npy's rows (the
context's target hidden states) through fc and its norm, the block's tokens (the anchor, then mask tokens) at the
positions after them through the layers (each attending to the context and to its whole block), the norm and the
target's head. For DFlash2, then its candidate selector as llama.cpp walks it: each position's top-k candidates,
scored after the anchor (the first drafted position) or after each of the previous position's candidates.

OUT.npz gets `logits` (one row per block position); for DFlash2 also `candidates` (top-k ids per position), `first`
(the first drafted position's scores after the anchor) and `scores` (the later positions': by predecessor and
candidate)."""

import json
import sys

import numpy as np
import torch
from safetensors.torch import load_file


def speculators_dflash2(folder: str, verifier: dict):
    from speculators.models.dflash2 import DFlash2DraftModel, DFlash2SpeculatorConfig

    config = DFlash2SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"
    model = DFlash2DraftModel(config)
    weights = load_file(f"{folder}/model.safetensors")
    weights["embed_tokens.weight"] = verifier["model.embed_tokens.weight"]
    weights["lm_head.weight"] = verifier["lm_head.weight"]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= set(model._keys_to_ignore_on_save), (missing, unexpected)
    model = model.float().eval()

    def block(rows: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        target_hidden = model.hidden_norm(model.fc(rows))
        hidden = model.embed_tokens(tokens)
        rotary = model.rotary_emb(hidden, positions)
        for layer in model.layers:
            hidden = layer(
                hidden_states=hidden,
                target_hidden=target_hidden,
                attention_mask=None,  # (the anchor's block attends to the context before it and to itself, whole)
                position_ids=positions,
                position_embeddings=rotary,
            )
        return model.norm(hidden)

    return model, block


def specforge_dflash(folder: str, verifier: dict):
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from transformers import Qwen3Config

    config = Qwen3Config.from_pretrained(folder)
    config._attn_implementation = "eager"
    model = DFlashDraftModel(config)
    missing, unexpected = model.load_state_dict(load_file(f"{folder}/model.safetensors"), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model = model.float().eval()
    embedding = torch.nn.Embedding.from_pretrained(verifier["model.embed_tokens.weight"].float())

    def block(rows: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # (its forward as its spec_generate calls it: the target's embedding of the block, the block attending whole)
        return model(position_ids=positions, noise_embedding=embedding(tokens), target_hidden=rows, is_causal=False)

    return model, block


def drafted(folder: str, target: str, features: str, tokens: list[int], out: str) -> None:
    verifier = load_file(f"{target}/model.safetensors")
    speculators = "speculators_model_type" in json.loads(open(f"{folder}/config.json").read())
    model, block = (speculators_dflash2 if speculators else specforge_dflash)(folder, verifier)
    head = verifier["lm_head.weight"].float()
    rows = torch.from_numpy(np.load(features)).float()[None]
    positions = torch.arange(rows.shape[1] + len(tokens))[None]
    with torch.no_grad():
        hidden = block(rows, torch.tensor([tokens]), positions)[0]
        logits = hidden @ head.T
        results = {"logits": logits.numpy()}
        if speculators:
            results.update(selector_walk(model.candidate_selector, hidden, logits, tokens))
    np.savez(out, **results)


def selector_walk(selector, hidden: torch.Tensor, logits: torch.Tensor, tokens: list[int]) -> dict:
    """DFlash2's candidate selector's scores as llama.cpp lays them out: the first drafted position's after the
    anchor, each later one's after each of the previous position's top-k candidates."""
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
    return {"candidates": candidates.numpy(), "first": scores[0], "scores": np.array(scores[1:])}


if __name__ == "__main__":
    drafted(sys.argv[1], sys.argv[2], sys.argv[3], [int(i) for i in sys.argv[4].split(",")], sys.argv[5])

"""What a DFlash drafter's trainer computes of a drafted block (run in the `drafters` peer venv):

    python dflash_oracle.py FOLDER TARGET FEATURES.npy 5,127,127,127 OUT.npz

builds the drafter from its folder with its trainer's own classes, in float32 with eager attention: vLLM's speculators'
DFlash2DraftModel or DSparkDraftModel (the folder its DistributedCheckpointer saved: speculators' config) or SGLang's
SpecForge's DFlashDraftModel or DSparkDraftModel (its export_to_hf's folder), its embedding the target's (TARGET's
model.safetensors, as each loads its verifier's). It runs the drafter as its trainer's forward does for one anchor:
FEATURES.npy's rows (the context's target hidden states) through fc and its norm, the block's tokens (the anchor, then
mask tokens) at the positions after them through the layers, each attending to the context and to its block as it was
trained to (whole; speculators' window layers causally where its sliding_window_non_causal is off), then the norm and
the head:
- DFlash's and DFlash2's, the target's head;
- DSpark's, speculators' own over the draft vocabulary (SpecForge's, the target's), each drafted position biased by its
  Markov head after the token drafted before it (the anchor for the first; then the greedy pick, as llama.cpp chains
  it) and scored by its confidence head.

OUT.npz gets `logits` (one row per block position, over the target's vocabulary: -inf at ids a draft vocabulary
lacks); DSpark's `confidence` (per drafted position); DFlash2's `candidates` (top-k ids per position), `first` (the
first drafted position's selector scores after the anchor) and `scores` (the later positions': by predecessor and
candidate)."""

import json
import sys

import numpy as np
import torch
from safetensors.torch import load_file


def speculators_drafter(folder: str, verifier: dict, kind: str):
    """speculators' DFlash2 or DSpark drafter, and its block's normed hidden states as its _backbone_forward makes
    them."""
    if kind == "dflash2":
        from speculators.models.dflash2 import DFlash2DraftModel as Model
        from speculators.models.dflash2 import DFlash2SpeculatorConfig as Config
    else:
        from speculators.models.dspark import DSparkDraftModel as Model
        from speculators.models.dspark import DSparkSpeculatorConfig as Config
    config = Config.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"
    model = Model(config)
    weights = load_file(f"{folder}/model.safetensors")
    weights["embed_tokens.weight"] = verifier["model.embed_tokens.weight"]
    if not model.use_draft_vocab:
        weights["lm_head.weight"] = verifier["lm_head.weight"]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= set(model._keys_to_ignore_on_save), (missing, unexpected)
    model = model.float().eval()

    def block(rows: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        target_hidden = model.hidden_norm(model.fc(rows))
        hidden = model.embed_tokens(tokens)
        rotary = model.rotary_emb(hidden, positions)
        context, size = rows.shape[1], tokens.shape[1]
        # (its mask of a window layer trained causal inside the block; the block is far inside the window)
        causal = torch.zeros(1, 1, size, context + size)
        causal[..., context:] = torch.full((size, size), float("-inf")).triu(1)
        for i, layer in enumerate(model.layers):
            windowed = i in model.sliding_window_indices and not model.sliding_window_non_causal
            hidden = layer(
                hidden_states=hidden,
                target_hidden=target_hidden,
                attention_mask=causal if windowed else None,
                position_ids=positions,
                position_embeddings=rotary,
            )
        return model.norm(hidden)

    return model, block


def specforge_dflash(folder: str, verifier: dict):
    """SpecForge's DFlash or DSpark drafter, and its block's normed hidden states as its forward makes them."""
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from specforge.modeling.draft.dspark import DSparkDraftModel
    from transformers import Qwen3Config

    config = Qwen3Config.from_pretrained(folder)
    config._attn_implementation = "eager"
    model = (DSparkDraftModel if config.architectures[0] == "DSparkDraftModel" else DFlashDraftModel)(config)
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
    kind = json.loads(open(f"{folder}/config.json").read()).get("speculators_model_type")
    model, block = speculators_drafter(folder, verifier, kind) if kind else specforge_dflash(folder, verifier)
    rows = torch.from_numpy(np.load(features)).float()[None]
    positions = torch.arange(rows.shape[1] + len(tokens))[None]
    with torch.no_grad():
        hidden = block(rows, torch.tensor([tokens]), positions)[0]
        head = verifier["lm_head.weight"].float()
        if kind == "dspark":
            results = markov_chain(model, hidden, tokens, head.shape[0])
        elif getattr(model, "markov_head", None) is not None:  # (SpecForge's DSpark)
            results = specforge_markov_chain(model, hidden, hidden @ head.T, tokens)
        else:
            results = {"logits": (hidden @ head.T).numpy()}
        if kind == "dflash2":
            results.update(selector_walk(model.candidate_selector, hidden, torch.from_numpy(results["logits"]), tokens))
    np.savez(out, **results)


def markov_chain(model, hidden: torch.Tensor, tokens: list[int], vocabulary: int) -> dict:
    """DSpark's logits over the target's vocabulary: its head's, each drafted position's biased by its Markov head after
    the token before (the anchor, then the previous position's greedy pick), and its confidence head's sigmoid."""
    target_ids = model.d2t + torch.arange(model.d2t.numel())
    base = model.lm_head(hidden)
    logits = torch.full((len(tokens), vocabulary), float("-inf"))
    confidence, previous = [], tokens[0]
    start = 0 if model.config.sample_from_anchor else 1
    logits[:start, target_ids] = base[:start]
    for i in range(start, len(tokens)):
        embedded = model.markov_head.prev_embeddings(torch.tensor([previous]))
        biased = base[i] + model.markov_head.markov_w2(embedded)[0]
        logits[i, target_ids] = biased
        features = torch.cat([hidden[i : i + 1], embedded], dim=-1)
        confidence.append(torch.sigmoid(model.confidence_head(features))[0].item())
        previous = int(target_ids[biased.argmax()])
    return {"logits": logits.numpy(), "confidence": np.array(confidence, np.float32)}


def specforge_markov_chain(model, hidden: torch.Tensor, base: torch.Tensor, tokens: list[int]) -> dict:
    """SpecForge's DSpark logits by its own Markov head's greedy walk of the block (every position drafted, as it
    trains: the first after the anchor), and its confidence head's sigmoid after each position's previous token."""
    drafted, logits = model.markov_head.sample_block_tokens(
        base[None], first_prev_token_ids=torch.tensor([tokens[0]]), hidden_states=hidden[None]
    )
    previous = torch.cat([torch.tensor([[tokens[0]]]), drafted[:, :-1]], dim=1)
    confidence = torch.sigmoid(model.predict_confidence(hidden[None], prev_token_ids=previous))
    return {"logits": logits[0].numpy(), "confidence": confidence.reshape(-1).numpy()}


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

"""What NVIDIA's ModelOpt computes of a drafter's first drafting step (run in the `modelopt` peer venv):

    python modelopt_oracle.py FOLDER TARGET FEATURES.npy 5,20,33 OUT.npz

converts the target (TARGET, a transformers folder) with ModelOpt's speculative decoding mode set as the export in
FOLDER says (its sizes, its settings, and the rotary embedding it is served with: YaRN where ModelOpt's export put it),
loads the exported weights into its module, and runs that module as its training does.

EAGLE-3's first step: FEATURES.npy's rows (each token's three target hidden states) through fc, each token's embedding
(the target's) beside its row's projection through its layer (causal, at positions 0, 1, ...), then the final norm and
the draft head. OUT.npz gets `g` (fc's projections), `logits` (the draft vocabulary's), `target_ids` (d2t's offsets made
target ids), and `logits_normed_once`: the same step with the projections normed once before the layer's attention
(hidden_norm alone), where ModelOpt's layer norms them with its input_layernorm first (the attention's pre-hook norms
what the layer has normed already) and llama.cpp's eagle3, like EAGLE-3's other trainers, norms them once.

DFlash's block: FEATURES.npy's rows (the context's hidden states of its target layers) through fc and its norm, the
block's tokens (the anchor, then mask tokens; the target's embedding) at the positions after them through its layers,
attending to the context and to the whole block, then the norm and the target's head. OUT.npz gets `logits`, one row
per block position."""

import copy
import json
import sys

import modelopt.torch.speculative as mtsp
import numpy as np
import torch
from modelopt.torch.speculative.config import DFLASH_DEFAULT_CFG, EAGLE3_DEFAULT_CFG
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

SIZES = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "draft_vocab_size")


def first_step(folder: str, target: str, features: str, tokens: list[int], out: str) -> None:
    exported = json.load(open(f"{folder}/config.json"))
    config = copy.deepcopy(EAGLE3_DEFAULT_CFG["config"])
    config["eagle_architecture_config"].update(
        {key: exported[key] for key in SIZES},
        **{key: value for key, value in exported["eagle_config"].items() if key != "next_layer_regular"},
        rope_scaling={**exported["rope_scaling"], "rope_theta": exported["rope_theta"]},
        rope_theta=exported["rope_theta"],
        torch_dtype="float32",
    )
    config.update(eagle_use_torch_compile=False, eagle_export_rope_scaling={})
    model = mtsp.convert(AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32), [("eagle", config)])
    module = model.eagle_module
    missing, unexpected = module.load_state_dict(load_file(f"{folder}/model.safetensors"), strict=False)
    assert not unexpected and all(name.startswith("rotary_emb") for name in missing), (missing, unexpected)
    module = module.float().eval()
    module._maybe_init_rope()
    rows = torch.from_numpy(np.load(features)).float()[None]
    ids, n = torch.tensor([tokens]), len(tokens)
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        g = module.fc(rows)
        embedded = model.model.embed_tokens(ids)

        def draft_logits() -> torch.Tensor:
            normed, _, _ = module(g, embedded, attention_mask=causal, position_ids=torch.arange(n)[None])
            return module.lm_head(normed)

        logits = draft_logits()
        layer = module.layers[0]
        layer.self_attn._forward_pre_hooks.clear()  # (ModelOpt's pre-hook: hidden_norm over input_layernorm's output)
        layer.self_attn.register_forward_pre_hook(
            lambda attention, args, kwargs: (
                args,
                {**kwargs, "hidden_states": torch.cat((layer.input_layernorm(embedded), layer.hidden_norm(g)), -1)},
            ),
            with_kwargs=True,
        )
        normed_once = draft_logits()
    target_ids = module.d2t + torch.arange(module.d2t.numel())
    np.savez(
        out,
        g=g[0].numpy(),
        logits=logits[0].numpy(),
        logits_normed_once=normed_once[0].numpy(),
        target_ids=target_ids.numpy(),
    )


def drafted_block(folder: str, target: str, features: str, tokens: list[int], out: str) -> None:
    exported = json.load(open(f"{folder}/config.json"))
    settings = exported["dflash_config"]
    config = copy.deepcopy(DFLASH_DEFAULT_CFG["config"])
    config["dflash_architecture_config"] = {
        key: exported[key] for key in (*SIZES[:-1], "num_hidden_layers", "rms_norm_eps")
    } | {"target_layer_ids": settings["target_layer_ids"]}
    config.update(
        dflash_block_size=exported["block_size"],
        dflash_mask_token_id=settings["mask_token_id"],
        dflash_draft_attention="causal" if settings.get("causal") else "bidirectional",
        dflash_use_torch_compile=False,
    )
    model = mtsp.convert(AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32), [("dflash", config)])
    module = model.dflash_module
    missing, unexpected = module.load_state_dict(load_file(f"{folder}/model.safetensors"), strict=False)
    assert not unexpected and all(name.startswith("rotary_emb") for name in missing), (missing, unexpected)
    module = module.float().eval()
    rows = torch.from_numpy(np.load(features)).float()[None]
    block = torch.tensor([tokens])
    positions = torch.arange(rows.shape[1] + len(tokens))[None]
    assert not settings.get("causal"), "the oracle runs the block attending whole, as ModelOpt trains it by default"
    with torch.no_grad():
        hidden = module(model.model.embed_tokens(block), rows, positions)
        logits = model.lm_head(hidden)
    np.savez(out, logits=logits[0].numpy())


if __name__ == "__main__":
    architecture = json.load(open(f"{sys.argv[1]}/config.json"))["architectures"][0]
    run = first_step if architecture == "LlamaForCausalLMEagle3" else drafted_block
    run(*sys.argv[1:4], [int(i) for i in sys.argv[4].split(",")], sys.argv[5])

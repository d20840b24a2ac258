"""The routers of an assembled mixture of experts: one gate vector per expert and layer, as mergekit-moe
0.1.5 computes them (gate_mode):

- `hidden` / `hidden_last`: the base model's hidden state at each layer's input for the last token of each
  of the expert's prompts, averaged over the prompts; `hidden_avg` averages over the tokens first. The base
  runs in bfloat16, as mergekit runs it, but a layer at a time, read from its checkpoint when the forward
  pass reaches it: memory is one layer and the embeddings, not the model.
- `cheap_embed`: the sum of the prompts' token embeddings, the same vector for every layer.
- `random` (standard normal) and `uniform_random` (nn.Linear's initialisation): drawn from a generator
  seeded with --seed, so the same seed gives the same routers (and mergekit-moe's with --random-seed).

Each expert's negative prompts' vector is subtracted from its positive prompts', and every vector scaled to
unit length. Prompts are tokenised by the base model's tokenizer, padded on the left with its BOS token
and each started with it, as mergekit does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ..names import model_facts
from .inputs import Input
from .recipe import RecipeError

KEEP_LAYERS_BYTES = 256 << 20  # a base model up to this size (bf16) keeps its layers loaded across prompt groups
PROMPT_MODES = ("hidden", "hidden_avg", "hidden_last", "cheap_embed")
GATE_MODES = (*PROMPT_MODES, "random", "uniform_random")


def gate_vectors(
    mode: str, base: Input, prompts: list[tuple[list[str], list[str]]], config: dict[str, Any], seed: int
) -> torch.Tensor:
    """(layers, gates, hidden size) in float32: one vector per (positive, negative) prompt lists."""
    layers, hidden, count = config["num_hidden_layers"], config["hidden_size"], len(prompts)
    generator = torch.Generator().manual_seed(seed)
    if mode == "random":
        return torch.randn((layers, count, hidden), generator=generator)
    if mode == "uniform_random":
        scale = math.sqrt(1.0 / hidden)
        return torch.rand((layers, count, hidden), generator=generator) * 2 * scale - scale
    tokenizer = _tokenizer(base.plan.config_folder)
    if mode == "cheap_embed":
        embedding = base.read("model.embed_tokens.weight").float()
        vectors_of = lambda batch: _embedded(embedding, batch).expand(layers, -1)  # noqa: E731
    else:
        model = _LayerByLayer(base, config)
        vectors_of = lambda batch: model.hidden_states(batch, average=mode == "hidden_avg")  # noqa: E731
    found = []
    for positive, negative in prompts:
        vectors = vectors_of(_tokenized(tokenizer, positive))
        if negative:
            vectors = vectors - vectors_of(_tokenized(tokenizer, negative))
        found.append(vectors / vectors.norm(p=2, dim=-1, keepdim=True).clamp(min=1e-8))
    return torch.stack(found, dim=1).float()


def degenerate_layers(gates: torch.Tensor, threshold: float = 5.0) -> list[int]:
    """Layers whose gate vectors are nearly dependent (condition number above `threshold`, mergekit's
    warning): some experts there will hardly be chosen."""
    return [i for i in range(gates.shape[0]) if float(torch.linalg.cond(gates[i].float())) > threshold]


def _tokenizer(folder: Path | None):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as e:  # (transformers raises many kinds for a folder without a usable tokenizer)
        raise RecipeError(
            f"{folder}: the base model's tokenizer does not load ({str(e).splitlines()[0][:200]}); "
            "gate_mode hidden and cheap_embed tokenise the prompts with it"
        ) from None
    tokenizer.padding_side = "left"
    tokenizer.pad_token_id = tokenizer.bos_token_id
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _tokenized(tokenizer, prompts: list[str]):
    return tokenizer(
        [(tokenizer.bos_token or "") + p for p in prompts], return_tensors="pt", padding=True, add_special_tokens=False
    )


def _embedded(embedding: torch.Tensor, batch) -> torch.Tensor:
    """(1, hidden): the prompts' token embeddings summed over tokens (not padding) and prompts, unit length."""
    rows = embedding[batch["input_ids"]] * batch["attention_mask"].unsqueeze(-1)
    summed = rows.sum(dim=1).sum(dim=0, keepdim=True)
    return summed / summed.norm(dim=-1, keepdim=True).clamp(min=1e-8)


class _LayerByLayer:
    """The base model's decoder on the meta device, its embeddings and final norm loaded, each layer loaded
    from the checkpoint as the forward pass reaches it and dropped after (kept for a small model, which
    is then read once for all the prompt groups)."""

    def __init__(self, base: Input, config: dict[str, Any]):
        import transformers

        self.base = base
        hf_config = transformers.AutoConfig.for_model(**config)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
        decoder = model.get_decoder()
        prefix = next(name for name, module in model.named_modules() if module is decoder)
        layers = decoder.layers
        decoder.layers = torch.nn.ModuleList()
        decoder.to_empty(device="cpu")
        model_facts.rebuild_computed_modules(decoder)  # (rotary embeddings: after to_empty, their buffers are garbage)
        self._load(decoder, prefix)
        decoder.layers = layers
        bf16_bytes = sum(math.prod(o.shape) * 2 for o in base.plan.outputs)
        self.keep = bf16_bytes <= KEEP_LAYERS_BYTES
        for i, layer in enumerate(layers):
            layer.register_forward_pre_hook(lambda module, args, at=f"{prefix}.layers.{i}": self._arrive(module, at))
            if not self.keep:
                layer.register_forward_hook(_drop)
        self.decoder = decoder

    def _arrive(self, layer: torch.nn.Module, prefix: str) -> None:
        if next(layer.parameters()).is_meta:
            layer.to_empty(device="cpu")
            self._load(layer, prefix)

    def _load(self, module: torch.nn.Module, prefix: str) -> None:
        with torch.no_grad():
            for name, parameter in module.named_parameters():
                parameter.copy_(self.base.read(f"{prefix}.{name}"))

    def hidden_states(self, batch, average: bool) -> torch.Tensor:
        """(layers, hidden): each layer's input hidden state, at the last token or averaged over the tokens,
        averaged over the prompts."""
        with torch.no_grad():
            output = self.decoder(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                output_hidden_states=True,
                return_dict=True,
            )
        states = torch.stack(output.hidden_states[:-1])  # (layers, prompts, tokens, hidden)
        states = states.sum(dim=2) / states.shape[2] if average else states[:, :, -1, :]
        return states.sum(dim=1) / states.shape[1]


def _drop(layer: torch.nn.Module, args, output) -> None:
    layer.to("meta")  # (returns None: a forward hook's result would replace the layer's output)

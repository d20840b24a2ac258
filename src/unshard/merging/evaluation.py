"""What merge-search scores a merge by: the loss per token of the user's own data, on a merged model held in
memory (never written).

The eval FILE is text, one example per line (loss on every token), or JSONL of `{"prompt", "completion"}`
(loss on the completion's tokens only), tokenised by the base model's tokenizer, each example started
with its BOS token and cut to the model's context length."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..names import hf_names, model_facts
from ..types import Plan
from ..write.assemble import materialise
from .recipe import RecipeError

BATCH = 8  # examples per forward pass


@dataclass
class EvalSet:
    path: Path
    batches: list[
        tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    ]  # input ids, attention mask, labels (-100: not scored)
    tokens: int  # tokens scored

    @classmethod
    def read(cls, path: Path, tokenizer_folder: Path | None, context: int) -> EvalSet:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
        except Exception as e:  # (transformers raises many kinds for a folder without a usable tokenizer)
            raise RecipeError(
                f"{tokenizer_folder}: the base model's tokenizer does not load "
                f"({str(e).splitlines()[0][:200]}); merge-search tokenises --eval with it"
            ) from None
        try:
            text = Path(path).read_text()
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError) as e:
            raise RecipeError(
                f"{path}: cannot read the eval file ({e.__class__.__name__}); give a text or JSONL file"
            ) from None
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        examples: list[tuple[list[int], list[int]]] = []  # (ids, scored: 1 per token)
        if str(path).endswith(".jsonl"):
            for number, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    prompt, completion = entry["prompt"], entry["completion"]
                    if not isinstance(prompt, str) or not isinstance(completion, str):
                        raise TypeError
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise RecipeError(
                        f"{path}:{number}: each line must be a JSON object with string `prompt` and `completion`"
                    ) from None
                asked = bos + tokenizer(prompt, add_special_tokens=False).input_ids
                answered = tokenizer(completion, add_special_tokens=False).input_ids
                examples.append((asked + answered, [0] * len(asked) + [1] * len(answered)))
        else:
            for line in text.splitlines():
                if line.strip():
                    ids = bos + tokenizer(line, add_special_tokens=False).input_ids
                    examples.append((ids, [1] * len(ids)))
        examples = [(ids[:context], scored[:context]) for ids, scored in examples]
        tokens = sum(sum(scored[1:]) for _, scored in examples)  # (the first token is never predicted)
        if not tokens:
            raise RecipeError(
                f"{path}: nothing to score: no example has a token to predict after the first "
                "(an empty file, or completions that tokenise to nothing)"
            )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        batches = []
        for start in range(0, len(examples), BATCH):
            chunk = examples[start : start + BATCH]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), pad)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            labels = torch.full((len(chunk), width), -100)
            for row, (found, scored) in enumerate(chunk):
                ids[row, : len(found)] = torch.tensor(found)
                mask[row, : len(found)] = 1
                labels[row, : len(found)] = torch.tensor([t if s else -100 for t, s in zip(found, scored)])
            batches.append((ids, mask, labels))
        return cls(Path(path), batches, tokens)

    def loss(self, model, device: str) -> float:
        """Mean negative log-likelihood per scored token."""
        total = 0.0
        with torch.no_grad():
            for ids, mask, labels in self.batches:
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
                total += float(
                    torch.nn.functional.cross_entropy(
                        logits[:, :-1].reshape(-1, logits.shape[-1]),
                        labels[:, 1:].reshape(-1).to(device),
                        ignore_index=-100,
                        reduction="sum",
                    )
                )
        return total / self.tokens if math.isfinite(total) else math.inf


def context_length(plan: Plan) -> int:
    config = {**(hf_names.read_config(plan.config_folder) or {}), **plan.config_updates}
    return int(config.get("max_position_embeddings") or 2048)


def merged_model(plan: Plan, device: str):
    """The merged model in memory, each tensor merged once (the inputs read once), computing in float32 on a
    CPU (the weights as the plan writes them, then widened) and in the written dtype on a GPU."""
    import transformers

    config = {**(hf_names.read_config(plan.config_folder) or {}), **plan.config_updates}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    state = {name: tensor for group in plan.groups for name, tensor in materialise(plan, group)}
    compute = torch.float32 if device == "cpu" else plan.dtype.torch
    state = {
        name: tensor.to(device=device, dtype=compute if tensor.is_floating_point() else tensor.dtype)
        for name, tensor in state.items()
    }
    expected = set(model.state_dict())
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - {
        n for n, _ in model.named_parameters()
    }
    if set(state) - expected or expected - set(state) - tied:
        stray = sorted((set(state) - expected) | (expected - set(state) - tied))
        raise RecipeError(
            f"{plan.checkpoint.path}: the merged model's tensors load into transformers' model only as "
            f"saved names converted on loading (e.g. {stray[0]}), which merge-search does not do yet; "
            "search over dense models"
        )
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model_facts.rebuild_computed_modules(model)
    stray = next((name for name, buffer in model.named_buffers() if buffer.is_meta), None)
    if stray is not None:
        raise RecipeError(
            f"{stray}: a buffer the model computes when built, which merge-search cannot make for this architecture"
        )
    return model.to(device).eval()

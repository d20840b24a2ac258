"""A merge's output vocabulary (`tokenizer_source: union | base | MODEL`, or `tokenizer: {source, tokens,
pad_to_multiple_of}`), and each input's embedding and head rows laid onto it, as mergekit 0.1.5 does.

The tokenizers are transformers' (fast ones), built as mergekit builds them: the base model's, a model's, or
the union (the base's, with every other model's tokens added after it, then their added tokens), plus the
tokens `tokens:` names. Each input's rows are then moved to the output's token ids; a token an input lacks
gets the row of the one model that has it, else the base's, else the mean of the models that have it (or
what `tokens:` says: a model's row, another token's row, zeros; `force` for every input), and rows padded
up to `pad_to_multiple_of` are the mean of the rest. The merge method then merges those rows.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from .recipe import RecipeError, TokenSetting, VocabularyRecipe

# The tensors with a row per token (mergekit's `vocabulary_axis: 0` weights of these architectures).
VOCABULARY_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


class Vocabulary:
    """The output tokenizer, its size in rows, and each model's row for every output token (-1: none)."""

    def __init__(
        self, recipe: VocabularyRecipe, base: str, folders: dict[str, Path], sizes: dict[str, int], where: str
    ):
        self.recipe, self.base = recipe, base
        tokenizers = {base: _tokenizer(folders[base], sizes[base], base, strip=True)}
        for model, folder in folders.items():
            if model != base:
                try:
                    tokenizers[model] = _tokenizer(folder, sizes[model], model)
                except RecipeError:
                    pass  # (as mergekit: a model without a tokenizer is taken to share the base's)
        if recipe.source == "base":
            out = _copy(tokenizers[base])
        elif recipe.source == "union":
            out = _union(tokenizers, sizes)
        elif recipe.source in folders:
            out = _tokenizer(folders[recipe.source], None, recipe.source)
        else:
            raise RecipeError(f"{where}: tokenizer source {recipe.source!r} is none of union, base or the models")
        for token in recipe.tokens:
            if token not in out.get_vocab():
                out.add_tokens(token)
        self.tokenizer = out
        self.ids: dict[str, int] = out.get_vocab()
        self.rows = len(self.ids)
        if recipe.pad_to_multiple_of and self.rows % recipe.pad_to_multiple_of:
            self.rows += recipe.pad_to_multiple_of - self.rows % recipe.pad_to_multiple_of
        self.vocabularies = {model: tok.get_vocab() for model, tok in tokenizers.items()}
        self.rows_of: dict[str, list[int]] = {}
        for model in folders:
            theirs = self.vocabularies.get(model, self.vocabularies[base])
            row = [-1] * len(self.ids)
            for token, at in self.ids.items():
                if (found := theirs.get(token)) is not None and found < sizes[model]:
                    row[at] = found
            self.rows_of[model] = row
        for token, setting in recipe.tokens.items():
            for model in filter(None, [setting.model]):
                if model not in folders:
                    raise RecipeError(
                        f"{where}: tokenizer.tokens[{token!r}] takes its row from {model}, which the "
                        "recipe does not merge"
                    )
                if setting.token is not None and setting.token not in self.vocabularies.get(model, {}):
                    raise RecipeError(f"{where}: tokenizer.tokens[{token!r}]: {model} has no token {setting.token!r}")
                if setting.token_id is not None and not 0 <= setting.token_id < sizes[model]:
                    raise RecipeError(
                        f"{where}: tokenizer.tokens[{token!r}]: token_id {setting.token_id} is outside "
                        f"{model}'s {sizes[model]} rows"
                    )

    def files(self) -> dict[str, str]:
        """The output tokenizer's files, as save_pretrained writes them."""
        with tempfile.TemporaryDirectory() as folder:
            self.tokenizer.save_pretrained(folder)
            return {path.name: path.read_text() for path in Path(folder).iterdir() if path.is_file()}

    def laid_out(self, tensors: list[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Each model's rows (in `tensors`, one per model in the merge's order) on the output's token ids."""
        models = [model for model, _ in tensors]
        given = dict(tensors)
        dtype = given[models[0]].dtype
        for tensor in given.values():
            dtype = torch.promote_types(dtype, tensor.dtype)
        shape = given[models[0]].shape[1:]
        settings = self._settings(models)
        fallback: dict[str, torch.Tensor] = {}
        for token, at in self.ids.items():
            setting = settings.get(token)
            has = [m for m in models if self.rows_of[m][at] >= 0]
            if len(has) == len(models) and not (setting and setting.force):
                continue
            if setting is None:  # (present in several models, none of them the base: their mean)
                row = torch.zeros(shape, dtype=dtype)
                for model in has:
                    row = row + given[model][self.rows_of[model][at]]
                fallback[token] = row / len(has)
            elif setting.zero:
                fallback[token] = torch.zeros(shape, dtype=dtype)
            elif setting.model is not None:
                if setting.model not in given:
                    raise RecipeError(
                        f"token {token!r} takes its row from {setting.model}, which this tensor's merge does not read"
                    )
                source = (
                    self.vocabularies[setting.model][setting.token]
                    if setting.token is not None
                    else setting.token_id
                    if setting.token_id is not None
                    else self.rows_of[setting.model][at]
                )
                if source < 0:
                    raise RecipeError(f"token {token!r}: {setting.model} has no row for it")
                fallback[token] = given[setting.model][source]
        laid = []
        for model in models:
            rows_of = self.rows_of[model]
            out = torch.zeros((self.rows, *shape), dtype=dtype)
            for token, at in self.ids.items():
                setting = settings.get(token)
                if rows_of[at] >= 0 and not (setting and setting.force):
                    out[at] = given[model][rows_of[at]]
                elif token in fallback:
                    out[at] = fallback[token]
            if self.rows > len(self.ids):  # padding rows: the mean of the others
                out[len(self.ids) :] = out[: len(self.ids)].mean(dim=0)
            laid.append(out)
        return laid

    def _settings(self, models: list[str]) -> dict[str, TokenSetting]:
        """Every token's setting: the recipe's, else the one model that has it, zeros if none has, the base's
        where the base is merged and has it; a token in none of these is left out (then averaged)."""
        settings = dict(self.recipe.tokens)
        for token, at in self.ids.items():
            if token in settings:
                continue
            has = [m for m in models if self.rows_of[m][at] >= 0]
            if len(has) == 1:
                settings[token] = TokenSetting(has[0])
            elif not has:
                settings[token] = TokenSetting(zero=True)
            elif self.base in models and self.rows_of[self.base][at] >= 0:
                settings[token] = TokenSetting(self.base)
        return settings


def _tokenizer(folder: Path, rows: int | None, model: str, strip: bool = False):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, use_fast=True)
    except Exception as e:  # (transformers raises many kinds for a folder without a usable tokenizer)
        raise RecipeError(
            f"{model}: its tokenizer does not load ({str(e).splitlines()[0][:200]}); a vocabulary "
            "merge needs each model's"
        ) from None
    if strip and rows is not None and any(at >= rows for at in tokenizer.get_vocab().values()):
        raise RecipeError(
            f"{model}: its tokenizer has tokens beyond the {rows} rows of its embeddings, which unshard "
            "does not strip (mergekit does, for BPE tokenizers)"
        )
    return tokenizer


def _copy(tokenizer):
    """A tokenizer of its own (saved and loaded again), to add tokens to without changing the model's."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return AutoTokenizer.from_pretrained(folder, use_fast=True)


def _union(tokenizers: dict[str, Any], sizes: dict[str, int]):
    """The base's tokenizer (first in `tokenizers`) with every other model's tokens added, then the added
    tokens (a token beyond a model's rows is not that model's)."""
    vocabulary: dict[str, None] = {}
    added: dict[str, Any] = {}
    for model, tokenizer in tokenizers.items():
        for token, at in tokenizer.get_vocab().items():
            if at < sizes[model]:
                vocabulary.setdefault(token)
        for at, info in tokenizer.added_tokens_decoder.items():
            if at < sizes[model]:
                added.setdefault(info.content, info)
    base = next(iter(tokenizers.values()))
    out = _copy(base)
    known = base.get_vocab()
    for token in vocabulary:
        if token not in added and token not in known:
            out.add_tokens(token)
    for info in added.values():
        out.add_tokens(info)
    return out

"""A SentencePiece unigram vocabulary (llama.cpp's `t5` tokenizer) as llama.cpp's converter writes XLM-RoBERTa's and
T5's: from the release's SentencePiece model (XLM-RoBERTa's sentencepiece.bpe.model, T5's spiece.model or
tokenizer.model) where the folder has one, as a Hub download does, else from tokenizer.json's Unigram as transformers
reads it, which is all a tokenizer saved by transformers 5 leaves. Either way with the normalizer's precompiled
character map, by which llama.cpp normalizes text as SentencePiece does."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigMismatchError, read_json
from ...families.gguf_hooks import gguf_py, json_or_empty, special_vocab
from .vocabulary import (
    add_special_vocab,
    sentencepiece_model,
    sentencepiece_pieces,
    sentencepiece_processor,
    transformers_tokenizer,
    with_added_tokens_json,
)

# The families' unigram vocabularies (GGUFPart.vocabulary), by the SentencePiece model files the converter reads
# each from, in the order it looks for them (CamemBERT's none: its ids around the model's pieces are not XLM-RoBERTa's,
# by which the converter realigns a model's pieces; its tokenizer.json has them as transformers reads them)
UNIGRAM_KINDS = {
    "xlm-roberta": ("sentencepiece.bpe.model",),
    "camembert": (),
    "t5": ("tokenizer.model", "spiece.model"),
}

# fairseq's first four ids, which XLM-RoBERTa's tokenizer puts before the SentencePiece model's pieces (its own first
# three, <unk> <s> </s>, moved one on), by their text and the converter's type names for them
FAIRSEQ_SPECIALS = (("<s>", "CONTROL"), ("<pad>", "CONTROL"), ("</s>", "CONTROL"), ("<unk>", "UNKNOWN"))


@dataclass
class Unigram:
    tokens: list
    scores: list[float]
    kinds: list
    add_space_prefix: bool
    remove_extra_whitespaces: bool
    charsmap: bytes | None


def write_unigram_vocabulary(writer, hparams: dict, folder: Path, kind: str) -> str:
    """The vocabulary in the converter's order: the tokenizer's kind, its pieces with their scores and types, its
    normalizer's settings (XLM-RoBERTa's segment types' count among them), then gguf-py's SpecialVocab. Says which
    file it came from."""
    model = next((folder / name for name in UNIGRAM_KINDS[kind] if (folder / name).is_file()), None)
    described = None
    if model is not None:
        vocabulary = _from_sentencepiece(model, hparams, kind)
        said = f"{model.name} (SentencePiece's unigram)"
    elif (folder / "tokenizer.json").is_file():
        described = read_json(
            folder / "tokenizer.json",
            "fix it or pass --config-from a folder with the model's tokenizer",
            ConfigMismatchError,
        )
        vocabulary, said = _from_tokenizer_json(folder, described, hparams), "tokenizer.json (a Unigram)"
    else:
        raise ConfigMismatchError(
            f"{folder}: no {' or '.join((*UNIGRAM_KINDS[kind], 'tokenizer.json'))}; a GGUF file holds the vocabulary: "
            "pass --config-from a folder with the model's tokenizer"
        )
    writer.add_tokenizer_model("t5")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocabulary.tokens)
    writer.add_token_scores(vocabulary.scores)
    writer.add_token_types(vocabulary.kinds)
    writer.add_add_space_prefix(vocabulary.add_space_prefix)
    if kind in ("xlm-roberta", "camembert"):
        writer.add_token_type_count(hparams.get("type_vocab_size", 1))
    writer.add_remove_extra_whitespaces(vocabulary.remove_extra_whitespaces)
    if vocabulary.charsmap:
        writer.add_precompiled_charsmap(vocabulary.charsmap)
    add_special_vocab(special_vocab(folder, n_vocab=len(vocabulary.tokens)), writer, folder, described)
    return f"{len(vocabulary.tokens)} tokens from {said}"


def _from_sentencepiece(path: Path, hparams: dict, kind: str) -> Unigram:
    """The model's pieces, as the converter lists them: XLM-RoBERTa's as many as the larger of the model's and the
    config's vocab_size, after fairseq's four (the last id's left out, as the converter realigns them: its <mask> is
    the padding past the model's); T5's as many as the config's vocab_size, added_tokens.json's over them (T5's
    sentinels, which its tokenizer adds past the model's pieces, are padding there)."""
    proto = sentencepiece_model(path)
    if proto.trainer_spec.model_type != proto.trainer_spec.UNIGRAM:
        raise ConfigMismatchError(
            f"{path}: a {proto.trainer_spec.ModelType.Name(proto.trainer_spec.model_type)} SentencePiece model, and "
            "this family's GGUF vocabulary is a unigram one (llama.cpp's t5 tokenizer); restore the model's own"
        )
    processor = sentencepiece_processor(path)
    normalizer = proto.normalizer_spec
    settings = (normalizer.add_dummy_prefix, normalizer.remove_extra_whitespaces, normalizer.precompiled_charsmap)
    if kind == "t5":
        size = hparams.get("vocab_size") or processor.vocab_size()
        if size < processor.vocab_size():
            raise ConfigMismatchError(
                f"{path}: {processor.vocab_size()} pieces for a vocabulary of {size} (the config's vocab_size); pass "
                "--config-from the folder the model was trained with"
            )
        tokens, scores, kinds = sentencepiece_pieces(processor, size, path)
        with_added_tokens_json(path.parent, tokens, scores, kinds)
        return Unigram(tokens, scores, kinds, *settings)
    size = max(hparams.get("vocab_size") or 0, processor.vocab_size())
    tokens, scores, kinds = sentencepiece_pieces(processor, size, path)
    types = gguf_py().TokenType
    specials = [text.encode() for text, _ in FAIRSEQ_SPECIALS]
    return Unigram(
        specials + tokens[3:-1],
        [0.0] * len(specials) + scores[3:-1],
        [getattr(types, kind) for _, kind in FAIRSEQ_SPECIALS] + kinds[3:-1],
        *settings,
    )


def _from_tokenizer_json(folder: Path, described: dict, hparams: dict) -> Unigram:
    """tokenizer.json's pieces and scores as transformers lists them, each id's type as the converter reads it
    (unknown, control where the tokenizer names it special, user-defined where added, else normal); the space prefix
    and runs of spaces read as one where the tokenizer does so; the normalizer's character map, bare or within a
    Sequence (the converter reads only a bare one)."""
    path = folder / "tokenizer.json"
    model = described.get("model") or {}
    pieces = model.get("vocab")
    if model.get("type") != "Unigram" or not isinstance(pieces, list):
        raise ConfigMismatchError(
            f"{path}: a {model.get('type')} tokenizer, not the Unigram this family's GGUF file holds; pass "
            "--config-from a folder with the model's own tokenizer"
        )
    config = json_or_empty(folder / "tokenizer_config.json")
    tokenizer = transformers_tokenizer(folder)
    added, special = tokenizer.get_added_vocab(), set(tokenizer.all_special_ids)
    unknown = config.get("unk_token")
    unknown = unknown.get("content") if isinstance(unknown, dict) else unknown
    unknown_id = added.get(unknown, model.get("unk_id", 3))
    types = gguf_py().TokenType
    size = max(hparams.get("vocab_size") or 0, len(pieces))
    tokens = [f"[PAD{i}]".encode() for i in range(size)]
    scores, kinds = [-10000.0] * size, [types.UNUSED] * size
    for i, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(pieces))))):
        if piece is None:
            continue
        kinds[i] = (
            types.UNKNOWN
            if i == unknown_id
            else types.CONTROL
            if i in special
            else types.USER_DEFINED
            if i in added.values()
            else types.NORMAL
        )
        tokens[i], scores[i] = piece.encode(), float(pieces[i][1])
    return Unigram(
        tokens,
        scores,
        kinds,
        _adds_space_prefix(described, config),
        _collapses_whitespace(described),
        _precompiled_charsmap(described.get("normalizer")),
    )


def _steps(node, key: str) -> list[dict]:
    """A normalizer or pre-tokenizer and its steps within Sequences, in order."""
    if not isinstance(node, dict):
        return []
    return [node] + [step for child in node.get(key) or [] for step in _steps(child, key)]


def _adds_space_prefix(described: dict, config: dict) -> bool:
    """Whether the tokenizer puts a space before the text: its Metaspace's prepend scheme where it has one (T5's
    tokenizer_config.json says nothing, and the converter's reading of its add_prefix_space, absent, as none would
    have llama.cpp split the first word otherwise than transformers), else tokenizer_config.json's add_prefix_space."""
    spaces = [
        step for step in _steps(described.get("pre_tokenizer"), "pretokenizers") if step.get("type") == "Metaspace"
    ]
    if spaces and "prepend_scheme" in spaces[0]:
        return spaces[0]["prepend_scheme"] in ("always", "first")
    return bool(config.get("add_prefix_space", False))


def _collapses_whitespace(described: dict) -> bool:
    """Whether the tokenizer reads a run of spaces as one: its pre-tokenizer splits at whitespace (transformers 5's
    XLM-RoBERTa) or its normalizer replaces runs of spaces (transformers 4's conversion of a SentencePiece model).
    (The converter writes tokenizer_config.json's clean_up_tokenization_spaces here, a setting of decoding, and
    llama.cpp then splits a run of spaces into pieces transformers never makes.)"""
    return any(
        step.get("type") == "WhitespaceSplit" for step in _steps(described.get("pre_tokenizer"), "pretokenizers")
    ) or any(
        step.get("type") == "Replace" and (step.get("pattern") or {}).get("Regex") == " {2,}"
        for step in _steps(described.get("normalizer"), "normalizers")
    )


def _precompiled_charsmap(normalizer) -> bytes | None:
    """The normalizer's precompiled character map (SentencePiece's), bare or within a Sequence, or None."""
    found = [step for step in _steps(normalizer, "normalizers") if step.get("type") == "Precompiled"]
    charsmap = found[0].get("precompiled_charsmap") if found else None
    return base64.b64decode(charsmap) if charsmap else None

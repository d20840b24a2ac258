"""InternLM2's SentencePiece vocabulary as llama.cpp's converter (its InternLM2Model) writes it, which differs from the
other SentencePiece vocabularies it writes:
- a piece that is the NUL character is written as the emoji 🐉 (llama.cpp's C strings would end at it);
- a piece named `[UNUSED...` is unused;
- the tokens tokenizer_config.json's added_tokens_decoder and tokenizer.json's added tokens name are written over the
  pieces at their ids (control tokens where special, else user-defined);
- the space prefix is the SentencePiece model's own;
- where `<|im_end|>` is among those tokens, it ends a sequence in place of the tokenizer's end token (the end of
  InternLM2's chat turns)."""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigMismatchError
from ...families.gguf_hooks import gguf_py, json_or_empty, special_vocab
from .vocabulary import add_special_vocab, sentencepiece_model, sentencepiece_pieces, sentencepiece_processor

CHAT_END = "<|im_end|>"
NUL_PIECE, NUL_WRITTEN = b"\x00", "\U0001f409".encode()  # (🐉)


def write_internlm2_vocabulary(writer, hparams: dict, folder: Path) -> str:
    """The vocabulary in the converter's order: the tokenizer's kind and pre-tokenizer, the pieces with their scores
    and types, the space prefix, then gguf-py's SpecialVocab with the chat's end as the end token. Says which."""
    model = folder / "tokenizer.model"
    if not model.is_file():
        raise ConfigMismatchError(
            f"{folder}: no tokenizer.model; a GGUF file holds InternLM2's SentencePiece vocabulary: pass --config-from "
            "a folder with the model's tokenizer"
        )
    processor = sentencepiece_processor(model)
    size = hparams.get("vocab_size") or processor.vocab_size()
    if size != processor.vocab_size():
        raise ConfigMismatchError(
            f"{model}: {processor.vocab_size()} pieces for a vocabulary of {size} (the config's vocab_size), and the "
            "converter writes InternLM2's vocabulary as the model's pieces alone; pass --config-from the folder of the "
            "tokenizer the model was trained with"
        )
    types = gguf_py().TokenType
    tokens, scores, kinds = sentencepiece_pieces(processor, size, model)
    for i, token in enumerate(tokens):
        if token == NUL_PIECE:
            tokens[i] = NUL_WRITTEN
        if token.startswith(b"[UNUSED"):
            kinds[i] = types.UNUSED
    added_json = json_or_empty(folder / "added_tokens.json")
    if added_json:  # (the converter appends them after the pieces, and llama.cpp loads no more tokens than rows)
        raise ConfigMismatchError(
            f"{folder / 'added_tokens.json'}: {len(added_json)} tokens added past the model's pieces, which its "
            f"embedding of {size} rows has none of; resize the model's vocabulary and tokenizer.model to them, or "
            "remove the file"
        )
    end = None
    for i, added in _added_tokens(folder):
        if not 0 <= i < size:
            raise ConfigMismatchError(
                f"{folder}: the added token {added.get('content')!r} has id {i}, past the vocabulary's {size} tokens; "
                "pass --config-from the folder of the tokenizer the model was trained with"
            )
        if added["content"] == CHAT_END:
            end = i
        tokens[i], scores[i] = added["content"].encode(), -1000.0
        kinds[i] = types.CONTROL if added.get("special") else types.USER_DEFINED
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(kinds)
    writer.add_add_space_prefix(sentencepiece_model(model).normalizer_spec.add_dummy_prefix)  # (not the config's)
    special = special_vocab(folder, n_vocab=len(tokens))
    if end is not None and "eos" in special.special_token_ids:
        special.special_token_ids["eos"] = end
    add_special_vocab(special, writer, folder)
    said = f"{size} tokens from tokenizer.model (SentencePiece, as InternLM2's)"
    return said + (f"; {CHAT_END} ({end}) ends a sequence, as InternLM2's chat" if end is not None else "")


def _added_tokens(folder: Path) -> list[tuple[int, dict]]:
    """tokenizer_config.json's added_tokens_decoder, then tokenizer.json's added tokens, as (id, token)."""
    decoder = json_or_empty(folder / "tokenizer_config.json").get("added_tokens_decoder") or {}
    added = [(int(i), token) for i, token in decoder.items()]
    added += [(int(token["id"]), token) for token in json_or_empty(folder / "tokenizer.json").get("added_tokens", [])]
    return added

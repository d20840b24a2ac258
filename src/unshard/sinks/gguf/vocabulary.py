"""A GGUF file's vocabulary as llama.cpp's converter writes it: from a SentencePiece model (tokenizer.model) or a
byte-level BPE tokenizer.json, the pre-tokenizer named as the converter's table names it (where the user has it) or
by its split."""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigMismatchError, UnshardError, read_json
from ...families.gguf_hooks import gguf_py, gguf_quiet, json_or_empty, special_vocab
from ...names import known
from .pre_tokenizer_hashes import CHECKOUT_VARIABLE, converter_name

# the token InternLM3's converter ends a sequence with where tokenizer_config.json lists it as special (its chat's end)
INTERNLM3_END = "<|im_end|>"


def write_vocabulary(
    writer,
    hparams: dict,
    folder: Path,
    llama: bool,
    phi3: bool = False,
    kind: str = "auto",
    special_tokens: tuple[tuple[str, str], ...] = (),
    gpt2_split_as: str | None = None,
    control_tokens: tuple[str, ...] = (),
    unnamed_special_tokens: tuple[str, ...] = (),
) -> str:
    """The vocabulary as the converter writes it: from a SentencePiece model (tokenizer.model) where there is
    one, else from a byte-level BPE tokenizer.json; a `bpe` kind's (Qwen's MoE models', GLM's) from tokenizer.json
    alone, with the family's special tokens by their text and its control tokens; a `gemma4` kind's from
    tokenizer.json's BPE with byte fallback. Says which."""
    tokenizer_config = json_or_empty(folder / "tokenizer_config.json")
    if llama and tokenizer_config.get("add_prefix_space") is not None:
        writer.add_add_space_prefix(tokenizer_config["add_prefix_space"])
    if kind == "gemma4":
        size = _gemma4_vocabulary(writer, hparams, folder)
        return f"{size} tokens from tokenizer.json (Gemma 4's BPE with byte fallback)"
    if kind == "wordpiece":
        size = _wordpiece_vocabulary(writer, hparams, folder)
        return f"{size} tokens from tokenizer.json (WordPiece)"
    # (Phi-4's tokenizer, as the converter reads it; Qwen's MoE models, whose converter reads no other)
    if kind == "bpe" or phi3 and tokenizer_config.get("tokenizer_class") == "GPT2Tokenizer":
        size, pre = _bpe_vocabulary(
            writer, hparams, folder, special_tokens, control_tokens=control_tokens, unnamed=unnamed_special_tokens
        )
        said = f"{size} tokens from tokenizer.json (byte-level BPE, pre-tokenizer {pre})"
    elif (folder / "tokenizer.model").is_file():
        size = _sentencepiece_vocabulary(writer, hparams, folder, tokenizer_config, phi3, internlm3=kind == "internlm3")
        said = f"{size} tokens from tokenizer.model (SentencePiece)"
    elif (folder / "tokenizer.json").is_file():
        size, pre = _bpe_vocabulary(writer, hparams, folder, gpt2_split_as=gpt2_split_as)
        said = f"{size} tokens from tokenizer.json (byte-level BPE, pre-tokenizer {pre})"
    else:
        raise ConfigMismatchError(
            f"{folder}: no tokenizer.model or tokenizer.json; a GGUF file holds the "
            "vocabulary: pass --config-from a folder with the model's tokenizer"
        )
    if llama and hparams.get("vocab_size", 32000) == 32016:
        # (CodeLlama's: the converter's LlamaModel names its infill tokens by their ids for a vocabulary of this size,
        # after the rest, as gguf-py's SpecialVocab of those four kinds writes them: the end of turn alone, the only
        # one of them its writer has a key for)
        infill = special_vocab(folder, load_merges=False, special_token_types=["prefix", "suffix", "middle", "eot"])
        for kind, token in (("prefix", 32007), ("suffix", 32008), ("middle", 32009), ("eot", 32010)):
            infill._set_special_token(kind, token)
        with gguf_quiet():
            infill.add_to_gguf(writer, quiet=True)
    if llama and hparams.get("vocab_size", 32000) == 49152:
        # (the converter's LlamaModel turns the start token off for vocabularies of this size, SmolLM2's and small
        # Granites', over what the tokenizer says: in its place where the tokenizer said it)
        with gguf_quiet():
            writer.add_add_bos_token(False)
    return said


def _sentencepiece_vocabulary(
    writer, hparams: dict, folder: Path, tokenizer_config: dict, phi3: bool = False, internlm3: bool = False
) -> int:
    """Every id up to the config's vocab_size, with its piece, score and type; tokens added by
    tokenizer_config.json over them; then gguf-py's SpecialVocab (special ids, add_bos/eos, chat template).
    Phi-3's converter takes the added tokens as they are written, control tokens where marked special, and
    tokenizer.json's added tokens after them. InternLM3's writes tokenizer_config.json's space prefix before the
    special ids wherever the key is (false where null), and ends a sequence with its chat's end where
    tokenizer_config.json lists that token as special."""
    model = folder / "tokenizer.model"
    processor = sentencepiece_processor(model)
    size = hparams.get("vocab_size") or processor.vocab_size()
    types = gguf_py().TokenType
    tokens, scores, kinds = sentencepiece_pieces(processor, size, model)
    with_added_tokens_json(folder, tokens, scores, kinds)
    added_tokens = [(int(key), added) for key, added in tokenizer_config.get("added_tokens_decoder", {}).items()]
    if phi3:
        added_tokens += [
            (int(added["id"]), added) for added in json_or_empty(folder / "tokenizer.json").get("added_tokens", [])
        ]
    for i, added in added_tokens:
        text = added["content"]
        if i >= size:
            continue
        if phi3:
            kinds[i] = types.CONTROL if added.get("special") else types.USER_DEFINED
        elif added.get("special") or _looks_special(text):
            kinds[i] = types.CONTROL
        else:
            text, kinds[i] = text.replace("\u2581", " "), types.USER_DEFINED
        tokens[i], scores[i] = text.encode(), -1000.0
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(kinds)
    special = special_vocab(folder, n_vocab=len(tokens))
    if internlm3:
        if "add_prefix_space" in tokenizer_config:
            writer.add_add_space_prefix(bool(tokenizer_config["add_prefix_space"]))
        ends = [i for i, added in added_tokens if added.get("special") and added["content"] == INTERNLM3_END]
        if ends and "eos" in special.special_token_ids:
            special.special_token_ids["eos"] = ends[-1]
    add_special_vocab(special, writer, folder)
    return size


def with_added_tokens_json(folder: Path, tokens: list, scores: list[float], kinds: list) -> None:
    """added_tokens.json's tokens over the model's at their ids, user-defined (ids past the vocabulary's left out), as
    the converter reads a SentencePiece vocabulary's."""
    user_defined = gguf_py().TokenType.USER_DEFINED
    for text, i in json_or_empty(folder / "added_tokens.json").items():
        if isinstance(i, int) and 0 <= i < len(tokens):
            tokens[i], scores[i], kinds[i] = text.encode(), -1000.0, user_defined


def sentencepiece_processor(model: Path):
    """The SentencePiece model at that path, loaded; one line where it is not one."""
    from sentencepiece import SentencePieceProcessor

    processor = SentencePieceProcessor()
    try:
        processor.LoadFromFile(str(model))
    except (OSError, RuntimeError) as e:
        raise ConfigMismatchError(f"{model}: not a SentencePiece model ({str(e)[:120]}); restore it") from None
    return processor


def sentencepiece_model(path: Path):
    """The SentencePiece model's own description (its ModelProto: trainer and normalizer settings); one line where
    the file is not one."""
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except DecodeError:
        raise ConfigMismatchError(f"{path}: not a SentencePiece model; restore it") from None
    return proto


def sentencepiece_pieces(processor, size: int, path: Path) -> tuple[list[bytes], list[float], list]:
    """Every id up to size with its piece, score and type as the converter lists a SentencePiece model's (ids past
    the model's as unused [PADn])."""
    types = gguf_py().TokenType
    tokens = [f"[PAD{i}]".encode() for i in range(size)]
    scores, kinds = [-10000.0] * size, [types.UNUSED] * size
    for i in range(min(size, processor.vocab_size())):
        kind = (
            types.UNKNOWN
            if processor.IsUnknown(i)
            else types.CONTROL
            if processor.IsControl(i)
            else types.UNUSED
            if processor.IsUnused(i)
            else types.BYTE
            if processor.IsByte(i)
            else types.NORMAL
        )
        try:
            piece = processor.IdToPiece(i)
        except UnicodeDecodeError:  # (SentencePiece writes its pieces as UTF-8: this file was damaged since)
            raise ConfigMismatchError(f"{path}: token {i}'s piece is not UTF-8 text; restore the file") from None
        tokens[i], scores[i], kinds[i] = piece.encode(), processor.GetScore(i), kind
    return tokens, scores, kinds


# Gemma 4's tokens of its chat format that llama.cpp shows as text (the converter marks them user-defined), so that a
# chat parser reads them
GEMMA4_VISIBLE_TOKENS = (
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
)


def _gemma4_vocabulary(writer, hparams: dict, folder: Path) -> int:
    """Gemma 4's vocabulary as the converter writes it (llama.cpp's `gemma4` tokenizer): gguf-py's LlamaHfVocab of
    tokenizer.json (a BPE with byte fallback, read through transformers), its chat tokens shown as text, the merges,
    no space prefix, a start token. Its tokens are as many as the embedding's rows, or llama.cpp refuses the file."""
    gguf = gguf_py()
    path = folder / "tokenizer.json"
    described = read_json(path, "pass --config-from a folder with the model's tokenizer", ConfigMismatchError)
    model, decoder = described.get("model") or {}, described.get("decoder") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback") or decoder.get("type") != "Sequence":
        kind = "a BPE without byte fallback" if model.get("type") == "BPE" else f"a {model.get('type')} model"
        raise ConfigMismatchError(
            f"{path}: {kind}, not a BPE with byte fallback as Gemma 4's, which llama.cpp's gemma4 tokenizer reads; "
            "pass --config-from a folder with the model's own tokenizer"
        )
    try:
        with known.transformers_quiet():
            vocab = gguf.LlamaHfVocab(folder)
    except Exception as e:  # (transformers raises many kinds on a broken tokenizer folder)
        raise ConfigMismatchError(
            f"{path}: transformers cannot read the tokenizer ({type(e).__name__}: {str(e)[:120]}); restore it"
        ) from None
    tokens, scores, kinds = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        kinds.append(gguf.TokenType.USER_DEFINED if text.decode() in GEMMA4_VISIBLE_TOKENS else kind)
    if len(tokens) != hparams["vocab_size"]:
        raise ConfigMismatchError(
            f"{path}: {len(tokens)} tokens for an embedding of {hparams['vocab_size']} rows, which llama.cpp "
            "refuses; pass --config-from the folder the model was trained with"
        )
    writer.add_tokenizer_model("gemma4")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(kinds)
    add_special_vocab(special_vocab(folder, load_merges=True), writer, folder, described)
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(True)
    return len(tokens)


# llama.cpp's names of the byte-level BPE pre-tokenizers it implements, by the splits that tokenizer.json's
# pre-tokenizer makes before the byte-level step: GPT-2's own split (ByteLevel with its regex; SmolLM's digits one at a
# time before it), or Splits by these regexes in this order (a carriage return and a line feed written as escapes, as
# most files have them; DeepSeek's has the characters themselves), with whether llama.cpp looks a word up whole
# before merging it (its ignore_merges; tokenizer.json's model says the same of itself).
GPT2_PRE = "gpt-2"
SMOLLM_PRE = "smollm"
_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LINES = r"\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _LINES
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
PRE_TOKENIZER_SPLITS = {
    # Llama 3's (and GLM-4's, which llama.cpp splits as Llama 3's); without the whole-word lookup, cl100k's as DBRX
    # and OLMo 2 have it
    ((LLAMA3,), True): "llama-bpe",
    ((LLAMA3,), False): "dbrx",
    # Qwen2's and Qwen3's: digits one at a time; Qwen3.5's: marks kept with their letters
    ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + _LINES,), False): "qwen2",
    ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|" + _LINES,), False): (
        "qwen35"
    ),
    # o200k: GPT-4o's and gpt-oss's
    (
        (
            rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
            rf"{_CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|" + _LINES,
        ),
        False,
    ): "gpt-4o",
    # DeepSeek-V3's: numbers, then runs of Chinese and Japanese characters, then the rest
    (
        (
            r"\p{N}{1,3}",
            "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
            r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+"""
            r"[\r\n]*|" + _LINES,
        ),
        False,
    ): "deepseek-v3",
}


def _bpe_vocabulary(
    writer,
    hparams: dict,
    folder: Path,
    special_tokens: tuple[tuple[str, str], ...] = (),
    gpt2_split_as: str | None = None,
    control_tokens: tuple[str, ...] = (),
    unnamed: tuple[str, ...] = (),
) -> tuple[int, str]:
    """A byte-level BPE vocabulary (tokenizer.json) as the converter writes it (its `gpt2` tokenizer model):
    every id up to the config's vocab_size, read through transformers' tokenizer; added tokens as control or
    user-defined; the pre-tokenizer's llama.cpp name; then gguf-py's SpecialVocab with the merges, and the
    family's special tokens (kind, added token's text) where it names none of the kind.

    The converter names the pre-tokenizer by a hash of one text's token ids, listed per model it knows, so
    it refuses a tokenizer trained anew; unshard names it by that table where the user has it
    (pre_tokenizer_hashes.py), else by the split tokenizer.json declares, which is what llama.cpp reproduces, so a
    new vocabulary over a known split is taken too. `unnamed`: special tokens' kinds left unnamed (the family names
    them after the vocabulary, as the converter does)."""
    path = folder / "tokenizer.json"
    described = read_json(path, "fix it or pass --config-from a folder with the model's tokenizer", ConfigMismatchError)
    model = described.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        kind = "BPE with byte fallback" if model.get("type") == "BPE" else model.get("type")
        raise ConfigMismatchError(
            f"{path}: a {kind} tokenizer, not a byte-level BPE; unshard writes GGUF vocabularies "
            "from SentencePiece models and byte-level BPE so far: write a folder and use "
            "llama.cpp's convert_hf_to_gguf.py"
        )
    if not model.get("vocab") or not model.get("merges"):  # (llama.cpp could not tokenize with it)
        raise ConfigMismatchError(
            f"{path}: a BPE tokenizer without {'merges' if model.get('vocab') else 'a vocabulary'}; "
            "pass --config-from a folder with the model's own tokenizer"
        )
    # (the converter's name where its table is at hand and lists this tokenizer; else the split's, GPT-2's as the
    # family's tokenizers are named in that table where it names them otherwise)
    pre = converter_name(path)
    if pre is None:
        pre = _pre_tokenizer_name(described.get("pre_tokenizer"), model)
        pre = gpt2_split_as if pre == GPT2_PRE and gpt2_split_as else pre
    if pre is None:
        raise ConfigMismatchError(
            f"{path}: its pre-tokenizer is not one unshard can name for llama.cpp (the splits "
            f"of {', '.join([GPT2_PRE, SMOLLM_PRE, *PRE_TOKENIZER_SPLITS.values()])}, or by its hash in the "
            f"converter's table, read where {CHECKOUT_VARIABLE} names a llama.cpp checkout); write a folder and use "
            "llama.cpp's convert_hf_to_gguf.py"
        )
    tokenizer = transformers_tokenizer(folder)
    size, tokens, kinds, added = _tokens_and_types(tokenizer, hparams, path)
    kinds = [gguf_py().TokenType.CONTROL if token in control_tokens else kind for token, kind in zip(tokens, kinds)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    special = special_vocab(folder, load_merges=True)
    for kind, text in special_tokens:
        if text not in added:  # (the converter fails on a KeyError)
            raise ConfigMismatchError(
                f"{path}: has no added token {text}, which llama.cpp's {kind} token of this family is; "
                "pass --config-from a folder with the model's own tokenizer"
            )
        special.special_token_ids.setdefault(kind, added[text])  # (as the converter's _set_special_token)
    for kind in unnamed:
        special.special_token_ids.pop(kind, None)
    add_special_vocab(special, writer, folder, described)
    return size, pre


def _wordpiece_vocabulary(writer, hparams: dict, folder: Path) -> int:
    """A WordPiece vocabulary (BERT's tokenizer.json) as the converter writes it (llama.cpp's `bert` tokenizer model):
    the segment types' count, then every id's token as get_vocab_base lists them, each word's first piece after a
    phantom space and the pieces after it without their `##` (control tokens as they are), then gguf-py's
    SpecialVocab. llama.cpp's WordPiece splits words its own way whatever the pre-tokenizer's name: the converter's
    table's where it lists this tokenizer, else `default`."""
    gguf = gguf_py()
    path = folder / "tokenizer.json"
    described = read_json(path, "fix it or pass --config-from a folder with the model's tokenizer", ConfigMismatchError)
    if (described.get("model") or {}).get("type") != "WordPiece":
        raise ConfigMismatchError(
            f"{path}: a {(described.get('model') or {}).get('type')} tokenizer, not the WordPiece one this family's "
            "GGUF file holds; pass --config-from a folder with the model's own tokenizer"
        )
    size, tokens, kinds, _ = _tokens_and_types(transformers_tokenizer(folder), hparams, path)
    control = gguf.TokenType.CONTROL
    phantom = [t if k == control else t[2:] if t.startswith("##") else "\u2581" + t for t, k in zip(tokens, kinds)]
    writer.add_token_type_count(hparams.get("type_vocab_size", 1))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre(converter_name(path) or "default")
    writer.add_token_list(phantom)
    writer.add_token_types(kinds)
    add_special_vocab(special_vocab(folder, n_vocab=len(phantom)), writer, folder, described)
    return size


# tokenizer.json's normalizer settings that llama.cpp's WordPiece tokenizer reads (it lowercases and strips accents
# where the file says nothing), by their keys
NORMALIZER_KEYS = {
    "lowercase": "tokenizer.ggml.normalizer.lowercase",
    "strip_accents": "tokenizer.ggml.normalizer.strip_accents",
}


def add_special_vocab(special, writer, folder: Path, described: dict | None = None) -> None:
    """gguf-py's SpecialVocab into the header, then the normalizer's settings as the converter's newer SpecialVocab
    writes them after it (gguf-py 0.19's reads none): tokenizer.json's Lowercase and StripAccents steps, or its
    BertNormalizer's settings, within a Sequence too."""
    with gguf_quiet():  # (a special token the installed gguf-py has no key for: left out, as the converter leaves it)
        special.add_to_gguf(writer, quiet=True)
    found: dict[str, bool] = {}

    def read(normalizer) -> None:
        kind = normalizer.get("type") if isinstance(normalizer, dict) else None  # (a damaged file: as none)
        if kind == "Lowercase":
            found["lowercase"] = True
        elif kind == "StripAccents":
            found["strip_accents"] = True
        elif kind == "BertNormalizer":
            found.update({key: normalizer[key] for key in NORMALIZER_KEYS if key in normalizer})
        elif kind == "Sequence":
            for step in normalizer.get("normalizers") or []:
                read(step)

    # (tokenizer.json as the vocabulary's reader parsed it, where it did: a large file is not parsed again)
    read(((described if described is not None else json_or_empty(folder / "tokenizer.json")) or {}).get("normalizer"))
    with gguf_quiet():  # (in their places where the installed gguf-py wrote them already)
        for key, value in found.items():
            if value is not None:
                writer.add_bool(NORMALIZER_KEYS[key], bool(value))


def transformers_tokenizer(folder: Path):
    """The folder's tokenizer as transformers reads it (the converter's way to its vocabulary), no remote code."""
    path = folder / "tokenizer.json"
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UnshardError(
            "a GGUF file's vocabulary of tokenizer.json is read by transformers: pip install 'unshard[gguf]'"
        ) from None
    try:
        with known.transformers_quiet():
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except Exception as e:  # (transformers raises many kinds on a broken tokenizer folder)
        raise ConfigMismatchError(
            f"{path}: transformers cannot read the tokenizer ({type(e).__name__}: {str(e)[:120]}); restore it"
        ) from None
    return tokenizer


def _tokens_and_types(tokenizer, hparams: dict, path: Path) -> tuple[int, list[str], list, dict]:
    """Every id up to the config's vocab_size with its token and type, as the converter's get_vocab_base lists them
    (ids the tokenizer lacks as [PADn], added tokens as control or user-defined): (size, tokens, types, added)."""
    gguf = gguf_py()
    vocab = tokenizer.get_vocab()
    size, top = hparams.get("vocab_size") or len(vocab), max(vocab.values(), default=-1)
    if top >= size:
        raise ConfigMismatchError(
            f"{path}: token id {top} is beyond the config's vocab_size {size}; "
            "pass --config-from the folder the model was trained with"
        )
    by_id = {i: token for token, i in vocab.items()}
    added, decoder = tokenizer.get_added_vocab(), tokenizer.added_tokens_decoder
    types = gguf.TokenType
    tokens, kinds = [], []
    for i in range(size):
        token = by_id.get(i)
        kind = types.NORMAL
        if token is None:
            token, kind = f"[PAD{i}]", types.UNUSED
        elif token in added:
            if not decoder[i].normalized:  # (llama.cpp takes added tokens as they read once normalized)
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or _looks_special(token):
                kind = types.CONTROL
            else:
                token, kind = token.replace("\u2581", " "), types.USER_DEFINED
        tokens.append(token)
        kinds.append(kind)
    return size, tokens, kinds, added


def _pre_tokenizer_name(pre_tokenizer: dict | None, model: dict) -> str | None:
    """llama.cpp's name of a byte-level pre-tokenizer as tokenizer.json describes it, or None: its splits and
    whether the model looks a word up whole before merging (`ignore_merges`), both as llama.cpp's does."""
    steps = pre_tokenizer.get("pretokenizers", [pre_tokenizer]) if pre_tokenizer else []
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        return None
    *splits, byte_level = steps
    whole_words = bool(model.get("ignore_merges"))
    if byte_level.get("use_regex", True):  # (GPT-2's regex, in the byte-level step)
        if whole_words:
            return None
        if not splits:
            return GPT2_PRE
        digits = splits == [{"type": "Digits", "individual_digits": True}]
        return SMOLLM_PRE if digits else None
    if not splits or any(
        step.get("type") != "Split" or step.get("behavior") != "Isolated" or step.get("invert") for step in splits
    ):
        return None
    regexes = tuple(
        str((step.get("pattern") or {}).get("Regex")).replace("\r", r"\r").replace("\n", r"\n") for step in splits
    )
    return PRE_TOKENIZER_SPLITS.get((regexes, whole_words))


def _looks_special(text: str) -> bool:
    """The converter's guess at a token added as not special that ought to be a control token: a few known
    ones (deepseek-coder's, gemma's), <|...|>, <｜...｜> and gemma's <unused...>."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or text.startswith("<|")
        and text.endswith("|>")
        or text.startswith("<\uff5c")
        and text.endswith("\uff5c>")
        or text.startswith("<unused")
        and text.endswith(">")
    )

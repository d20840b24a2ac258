"""BERT (`BertModel`, and `BertForMaskedLM` around it): an encoder whose every token attends to every other, its output
the tokens' embeddings, as the embedding models people fine-tune (sentence-transformers') have it; position and
segment-type embeddings learned, each layer LayerNormed after its attention and its MLP. To GGUF as llama.cpp's
converter writes it (llama.cpp's bert, which llama-embedding and llama-server's embeddings read): non-causal, pooled
as the model's sentence-transformers config says, its WordPiece vocabulary (llama.cpp's `bert` tokenizer); the
pooler and a masked-LM head left out, as the converter leaves them. RoBERTa (`RobertaModel`): BERT's layers, its
positions counted from the padding token's id + 1, a byte-level BPE vocabulary. XLM-RoBERTa (`XLMRobertaModel`:
bge-m3's, multilingual-e5's): RoBERTa's layers, a SentencePiece unigram vocabulary (llama.cpp's `t5` tokenizer);
CamemBERT (`CamembertModel`: sentence-camembert's) the same, written as XLM-RoBERTa is.
Either under a sequence classifier's head (a reranker's) keeps the head, as llama.cpp's rank pooling reads it; so does
BERT's (a cross-encoder's), its pooler as llama.cpp's cls (which the converter leaves out). DistilBERT
(`DistilBertModel`): BERT's halved, no segment types, its sizes under names of its own. ModernBERT (`ModernBertModel`,
and `ModernBertForMaskedLM`'s encoder): rotary positions, a GeGLU MLP, layers attending within a window but every n-th,
norms without biases (llama.cpp's modern-bert). EuroBERT (`EuroBertModel`): a Llama's layers attending both ways
(llama.cpp's eurobert). Nomic BERT (`NomicBertModel`: nomic-embed-text's): BERT's embeddings and norms, rotary
positions in place of a position table, a SwiGLU MLP, no biases but the norms' (llama.cpp's nomic-bert)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_py, json_or_empty, rope_parameters, text_hyperparameters
from .llama import TEXT_ONLY
from .parts import Family, GGUFPart, Rearrangement, gguf_family
from .sentence_transformers import pooled


def bert_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The TextModel's, then attention over every token, how the tokens are pooled, a classifier's labels."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_causal_attention(False)
    pooled(writer, hparams, folder)
    if labels := classifier_labels(hparams, folder):
        writer.add_classifier_output_labels(labels)


def classifier_labels(hparams: dict, folder: Path) -> list[str]:
    """A classifier's labels in their order (a reranker's one score, LABEL_0), as the converter writes them: none where
    the config names transformers' two placeholder labels or none at all."""
    named = hparams.get("id2label") or {}
    try:
        labels = [label for _, label in sorted((int(i), label) for i, label in named.items())]
    except (AttributeError, TypeError, ValueError):
        raise ConfigMismatchError(
            f"{folder / 'config.json'}: id2label is not labels by their ids; fix it or pass --config-from the "
            "model's own folder"
        ) from None
    return [] if len(labels) == 2 and labels[0] == "LABEL_0" else [str(label) for label in labels]


def position_offset(hparams: dict) -> int:
    """RoBERTa's positions start after the padding token's id (transformers numbers them from it + 1): the rows of
    the table before them, which the converter drops (0: none)."""
    pad = hparams.get("pad_token_id")
    return 0 if pad is None else pad + 1


def roberta_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """BERT's, the context as the positions the table has after the offset."""
    if "max_position_embeddings" in hparams:
        hparams = {**hparams, "max_position_embeddings": hparams["max_position_embeddings"] - position_offset(hparams)}
    bert_hyperparameters(writer, hparams, ftype, blocks, folder)


def roberta_positions(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The position table from the offset on, as the converter writes it (llama.cpp counts positions from 0)."""
    offset = position_offset(hparams)
    if name.endswith("embeddings.position_embeddings.weight") and offset:
        return Rearrangement({name: (shape[0] - offset, *shape[1:])}, partial(rows_from, offset), shape[0])
    return None


def rows_from(first: int, band) -> tuple:
    return (band[first:],)


def segment_types_count(writer, hparams: dict, folder: Path) -> None:
    """The segment types' count, which the converter writes after RoBERTa's byte-level BPE vocabulary."""
    writer.add_token_type_count(hparams.get("type_vocab_size", 1))


# DistilBERT's sizes under the names the converter finds them by (its find_hparam's lists), which BERT's hooks read
DISTILBERT_SIZES = {"dim": "hidden_size", "hidden_dim": "intermediate_size", "n_heads": "num_attention_heads"}


def distilbert_sizes(hparams: dict, where: Path) -> dict:
    return {**{ours: hparams[theirs] for theirs, ours in DISTILBERT_SIZES.items() if theirs in hparams}, **hparams}


def distilbert_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """BERT's, after the LayerNorms' epsilon, which DistilBERT's config does not say (transformers' is 1e-12)."""
    writer.add_layer_norm_eps(1e-12)
    bert_hyperparameters(writer, hparams, ftype, blocks, folder)


def modernbert_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """BERT's, then the sliding window and which layers attend globally, no rope scaling, the vocabulary's size, the
    MLP's activation (GELU's GeGLU, or SiLU's SwiGLU in derivatives)."""
    bert_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_sliding_window(hparams["local_attention"])
    if (pattern := hparams.get("global_attn_every_n_layers")) is not None:
        writer.add_sliding_window_pattern(pattern)
    writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)
    writer.add_vocab_size(hparams["vocab_size"])
    if activation := hparams.get("hidden_activation"):
        writer.add_string(f"{writer.arch}.hidden_activation", activation)  # (gguf-py 0.19 has no method for it)


def modernbert_norms(hparams: dict, where: Path) -> dict:
    """ModernBERT's norms' epsilon also as a LayerNorm's, which its norms are and llama.cpp's modern-bert loads (the
    converter writes it as an RMS norm's alone, from norm_eps, and llama.cpp does not load its file)."""
    return {**hparams, "layer_norm_eps": hparams["norm_eps"]} if "norm_eps" in hparams else hparams


def sequence_ends(writer, hparams: dict, folder: Path) -> None:
    """ModernBERT's: a start, an end and a separator around every sequence, as the converter says before its
    vocabulary (the tokenizer's own settings written over them, in their places)."""
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(True)


def eurobert_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The TextModel's (a Llama's sizes and rotary), then attention over every token, no rope scaling, the pooling."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_causal_attention(False)
    writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)
    pooled(writer, hparams, folder)


def no_start_token(writer, hparams: dict, folder: Path) -> None:
    """EuroBERT's: no start token added, as the converter says before its vocabulary (the tokenizer's own setting
    written over it, in its place)."""
    writer.add_add_bos_token(False)


def nomic_sizes(hparams: dict, where: Path) -> dict:
    """Nomic BERT's config as the converter reads it: no head width of its own, which the converter does not write."""
    return {key: value for key, value in hparams.items() if key != "head_dim"}


# What llama.cpp's nomic-bert computes, which the config of nomic-embed-text's own code may say otherwise: (key, the
# value llama.cpp takes, what it does)
NOMIC_HUB_FIXED = (
    ("activation_function", "swiglu", "runs a SwiGLU MLP"),
    ("prenorm", False, "norms after each block"),
    ("rotary_emb_fraction", 1.0, "turns whole heads"),
    ("rotary_emb_interleaved", False, "turns a head by halves"),
    ("qkv_proj_bias", False, "has no attention biases"),
    ("mlp_fc1_bias", False, "has no MLP biases"),
    ("mlp_fc2_bias", False, "has no MLP biases"),
)


def nomic_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's nomic-bert computes: SiLU's SwiGLU, unscaled rope turned by halves over whole heads, norms
    after each block, no biases (as transformers' NomicBertModel, and as a config of nomic-embed-text's own code may
    say otherwise), a WordPiece vocabulary (v2's unigram one and its experts are not written yet). Another config is
    one line."""
    tokenizer = json_or_empty(where.parent / "tokenizer.json").get("model", {}).get("type")
    fixed = [(key, does) for key, value, does in NOMIC_HUB_FIXED if key in hparams and hparams[key] != value]
    why = None
    if fixed:
        key, does = fixed[0]
        why = f"{key} is {hparams[key]!r}, and llama.cpp's nomic-bert {does}"
    elif hparams.get("hidden_act", "silu") != "silu":
        why = f"hidden_act is {hparams['hidden_act']!r}, and llama.cpp's nomic-bert runs SiLU's SwiGLU"
    elif rope_parameters(hparams)[1].get("rope_type", "default") != "default" or hparams.get("rotary_scaling_factor"):
        why = "the rope is scaled, and llama.cpp's nomic-bert turns it unscaled"
    elif hparams.get("moe_every_n_layers"):
        why = "it has experts (nomic-embed-text-v2-moe's), which unshard does not write as GGUF yet"
    elif tokenizer not in (None, "WordPiece"):
        why = f"tokenizer.json is a {tokenizer} model, and unshard writes Nomic BERT's WordPiece vocabulary only so far"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: serve this model with transformers or sentence-transformers")


def encoder_family(name: str, model_type: str, architecture: str, gguf: GGUFPart, also: tuple[str, ...] = ()) -> Family:
    """An encoder unshard knows for GGUF, its q, k and v run as one by vLLM."""
    return gguf_family(name, model_type, architecture, gguf, (("query", "key", "value"),), TEXT_ONLY, also)


def camembert_as_xlm_roberta(hparams: dict, where: Path) -> list[str]:
    """The note: CamemBERT written as the converter writes XLM-RoBERTa, whose layers and unigram vocabulary it has."""
    return [
        "CamemBERT is written as llama.cpp's converter writes XLM-RoBERTa (its position table from the padding token's "
        "id + 1 on, its unigram vocabulary from tokenizer.json): the converter writes CamembertModel as BERT's, "
        "positions from 0 and a WordPiece vocabulary, which computes another model"
    ]


# What the file has no place for: llama.cpp computes the tokens' embeddings (and pools them itself)
POOLED_BY_LLAMA_CPP = "llama.cpp computes the tokens' embeddings, pooled as sentence-transformers says"

BERT_GGUF = GGUFPart(
    "BERT",
    hyperparameters=bert_hyperparameters,
    vocabulary="wordpiece",
    dropped_prefix="bert.",
    towers=r"^(?:bert\.)?(?:pooler|cls)\.",
    towers_left_out=f"the pooler's and a masked-LM head's: {POOLED_BY_LLAMA_CPP}",
)
# BERT under a sequence classifier's head (a cross-encoder's, ms-marco-MiniLM's): the pooler (a dense layer and tanh on
# the first token) as llama.cpp's cls and the classifier as its cls.output, which its rank pooling applies in turn.
# The converter leaves the pooler out, and llama.cpp then scores otherwise than transformers.
BERT_CLASSIFIER_GGUF = replace(
    BERT_GGUF,
    towers=r"^(?:bert\.)?cls\.",
    towers_left_out=f"a masked-LM head's: {POOLED_BY_LLAMA_CPP}",
    renames=((r"^pooler\.dense\.", "classifier.dense."), (r"^classifier\.(weight|bias)$", r"classifier.out_proj.\1")),
)
# RoBERTa's layers (positions after the padding token's id), whatever its vocabulary
ROBERTA_LAYERS_GGUF = GGUFPart(
    "BERT",
    hyperparameters=roberta_hyperparameters,
    rearranged=roberta_positions,
    dropped_prefix="roberta.",
    towers=r"^(?:roberta\.)?pooler\.",
    towers_left_out=f"the pooler's: {POOLED_BY_LLAMA_CPP}",
)
XLM_ROBERTA_GGUF = replace(ROBERTA_LAYERS_GGUF, vocabulary="xlm-roberta")


MODERNBERT_GGUF = GGUFPart(
    "MODERN_BERT",
    hyperparameters=modernbert_hyperparameters,
    as_the_converter_reads=modernbert_norms,
    before_vocabulary=sequence_ends,
    dropped_prefix="model.",
    # (a classifier's projection, as the converter names it where the config labels the classifier's scores)
    renames=((r"^classifier\.(weight|bias)$", r"classifier.out_proj.\1"),),
)
# ModernBERT under its masked-LM head (ModernBERT-base's own class): the encoder alone, the head (a dense layer, a norm,
# the decoder's bias) left out, as the converter writes the encoder (it stops on the head)
MODERNBERT_MLM_GGUF = replace(
    MODERNBERT_GGUF, towers=r"^(?:head|decoder)\.", towers_left_out=f"a masked-LM head's: {POOLED_BY_LLAMA_CPP}"
)


def distilbert_classifier_refused(hparams: dict, where: Path) -> None:
    raise ConfigMismatchError(
        f"{where}: DistilBertForSequenceClassification applies ReLU after its pre_classifier, and llama.cpp's bert "
        "applies tanh there: its scores would differ; serve this classifier with transformers"
    )


FAMILIES = (
    encoder_family(
        "BERT",
        "bert",
        "BertModel",
        replace(BERT_GGUF, classes=(("BertForSequenceClassification", BERT_CLASSIFIER_GGUF),)),
        also=("BertForMaskedLM", "BertForSequenceClassification"),
    ),
    encoder_family(
        "RoBERTa",
        "roberta",
        "RobertaModel",
        replace(ROBERTA_LAYERS_GGUF, after_vocabulary=segment_types_count, gpt2_split_as="roberta-bpe"),
        also=("RobertaForSequenceClassification",),  # (a reranker: its head llama.cpp's cls and cls.output)
    ),
    encoder_family(
        "XLM-RoBERTa",
        "xlm-roberta",
        "XLMRobertaModel",
        XLM_ROBERTA_GGUF,
        also=("XLMRobertaForSequenceClassification",),  # (a reranker: bge-reranker-v2-m3's, its head llama.cpp's cls)
    ),
    encoder_family(
        "CamemBERT",
        "camembert",
        "CamembertModel",
        replace(XLM_ROBERTA_GGUF, check_config=camembert_as_xlm_roberta, vocabulary="camembert"),
    ),
    encoder_family(
        "DistilBERT",
        "distilbert",
        "DistilBertModel",
        GGUFPart(
            "BERT",
            hyperparameters=distilbert_hyperparameters,
            as_the_converter_reads=distilbert_sizes,
            vocabulary="wordpiece",
            dropped_prefix="distilbert.",
            towers=r"^(?:distilbert\.)?vocab_",
            towers_left_out=f"a masked-LM head's: {POOLED_BY_LLAMA_CPP}",
            classes=(
                ("DistilBertForSequenceClassification", GGUFPart("BERT", check_config=distilbert_classifier_refused)),
            ),
        ),
        also=("DistilBertForMaskedLM", "DistilBertForSequenceClassification"),
    ),
    encoder_family(
        "ModernBERT",
        "modernbert",
        "ModernBertModel",
        replace(MODERNBERT_GGUF, classes=(("ModernBertForMaskedLM", MODERNBERT_MLM_GGUF),)),
        # (a reranker, gte-reranker-modernbert's: its head llama.cpp's cls, cls.norm and cls.output; and the masked-LM
        # model the base checkpoints are, ModernBERT-base's: its encoder alone)
        also=("ModernBertForSequenceClassification", "ModernBertForMaskedLM"),
    ),
    encoder_family(
        "EuroBERT",
        "eurobert",
        "EuroBertModel",
        GGUFPart(
            "EUROBERT",
            hyperparameters=eurobert_hyperparameters,
            before_vocabulary=no_start_token,
            dropped_prefix="model.",
        ),
    ),
    encoder_family(
        "Nomic BERT",
        "nomic_bert",
        "NomicBertModel",
        GGUFPart(
            "NOMIC_BERT",
            hyperparameters=bert_hyperparameters,
            as_the_converter_reads=nomic_sizes,
            check_config=nomic_checked,
            vocabulary="wordpiece",
            towers=r"^(?:pooler|cls)\.",
            towers_left_out=f"the pooler's and a masked-LM head's: {POOLED_BY_LLAMA_CPP}",
        ),
    ),
)

"""BERT (`BertModel`): an encoder whose every token attends to every other, its output the tokens' embeddings, as the
embedding models people fine-tune (sentence-transformers') have it; position and segment-type embeddings learned, each
layer LayerNormed after its attention and its MLP. To GGUF as llama.cpp's converter writes it (llama.cpp's bert, which
llama-embedding and llama-server's embeddings read): non-causal, pooled as the model's sentence-transformers config
says, its WordPiece vocabulary (llama.cpp's `bert` tokenizer); the pooler left out, as the converter leaves it."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_py, json_or_empty, text_hyperparameters
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model

# sentence-transformers' pooling settings, and llama.cpp's pooling types by its modes' names
POOLING_FLAGS = (
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_lasttoken", "lasttoken"),
)
POOLING = {"mean": "MEAN", "cls": "CLS", "lasttoken": "LAST"}


def pooling_type(folder: Path):
    """The pooling the model's sentence-transformers modules name (modules.json, its Pooling module's config.json),
    as the converter reads it, or None where there is none."""
    modules = json_or_empty(folder / "modules.json")
    path = next((m.get("path") for m in modules or () if str(m.get("type", "")).endswith("Pooling")), None)
    if path is None:
        return None
    where = folder / path / "config.json"
    pooling = json_or_empty(where)
    mode = next((mode for flag, mode in POOLING_FLAGS if pooling.get(flag)), pooling.get("pooling_mode"))
    if mode not in POOLING:
        raise ConfigMismatchError(
            f"{where}: pooling {mode!r}, and llama.cpp pools by the mean, the first token or the last; serve this "
            "model with sentence-transformers"
        )
    return getattr(gguf_py().PoolingType, POOLING[mode])


def bert_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The TextModel's, then attention over every token, and the pooling sentence-transformers' config names."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_causal_attention(False)
    if (pooling := pooling_type(folder)) is not None:
        writer.add_pooling_type(pooling)


FAMILIES = (
    Family(
        "BERT",
        "bert",
        "BertModel",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's BERT layout is not mapped yet"),
        **no_trainer_model("BERT"),
        fused_siblings=(("query", "key", "value"),),
        gguf=GGUFPart(
            "BERT",
            hyperparameters=bert_hyperparameters,
            vocabulary="wordpiece",
            dropped_prefix="bert.",
            towers=r"^(?:bert\.)?pooler\.",
            towers_left_out="the pooler's: llama.cpp pools the tokens' embeddings as sentence-transformers does",
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

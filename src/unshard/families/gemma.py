"""Gemma, Gemma 2 and Gemma 3 (its text model, and with its SigLIP vision tower): Llama's layout with norms applied
as 1 + weight (shifted by one for llama.cpp, which applies them as they are), Gemma 2's and 3's norms around the
feed-forward, Gemma 3's q and k norms; llama.cpp's gemma, gemma2 and gemma3 with their own header hooks, and Gemma
3's vision part as the mmproj file."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigMismatchError
from ..names import dense_tables as t
from .gguf_hooks import check_query_scale, gguf_quiet, json_or_empty, special_vocab, text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY, TORCHTUNE, TORCHTUNE_ENDS, TORCHTUNE_LLAMA, L
from .parts import NO_META_NAMES, NO_TABLE, Family, GGUFPart, MmprojPart, Unsupported
from .sentence_transformers import dense_modules, dense_weight, pooled

# torchtune's Gemma 2: Gemma's names, its final norm inside a module that also caps, and a layer's four norms by what
# torchtune computes with them (TransformerSelfAttentionLayer: sa_norm before the attention, sa_scale after it,
# mlp_norm before the MLP, mlp_scale after it). torchtune 0.6.1's own converter (gemma2_tune_to_hf) names mlp_norm
# post_feedforward_layernorm and mlp_scale pre_feedforward_layernorm, the other way round: its folder computes another
# model than the one trained.
TORCHTUNE_GEMMA2 = {
    **{name: rule for name, rule in TORCHTUNE.items() if name not in ("norm.scale", "layers.{i}.mlp_norm.scale")},
    **TORCHTUNE_ENDS,
    "norm.rms_norm.scale": ("model.norm.weight", None),
    "layers.{i}.sa_scale.scale": (L + "post_attention_layernorm.weight", None),
    "layers.{i}.mlp_norm.scale": (L + "pre_feedforward_layernorm.weight", None),
    "layers.{i}.mlp_scale.scale": (L + "post_feedforward_layernorm.weight", None),
}

GEMMA_HPARAMS = (
    "max_position_embeddings",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "rms_norm_eps",
    "head_dim",
)
GEMMA2_HPARAMS = (*GEMMA_HPARAMS, "attn_logit_softcapping", "final_logit_softcapping", "sliding_window")


def _gemma_hyperparameters(writer, hparams: dict, ftype, blocks: int, where: Path, gemma2: bool) -> None:
    """Gemma's and Gemma 2's, as the converter writes them: no rope frequency (llama.cpp's default is Gemma's);
    Gemma 2 adds the logits' soft caps and the sliding window."""
    needed, name = (GEMMA2_HPARAMS, "gemma2") if gemma2 else (GEMMA_HPARAMS, "gemma")
    missing = [key for key in needed if hparams.get(key) is None]
    if missing:
        raise ConfigMismatchError(
            f"{where}: no {', '.join(missing)}, which llama.cpp's {name} needs; "
            "pass --config-from the model's own folder"
        )
    if gemma2:  # (Gemma scales queries by head width alone, as llama.cpp's gemma does)
        check_query_scale(hparams, name, 46, where)
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(hparams.get("num_key_value_heads") or hparams["num_attention_heads"])
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    writer.add_key_length(hparams["head_dim"])
    writer.add_value_length(hparams["head_dim"])
    writer.add_file_type(ftype)
    if gemma2:
        writer.add_attn_logit_softcapping(hparams["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(hparams["final_logit_softcapping"])
        writer.add_sliding_window(hparams["sliding_window"])


# CodeGemma's fill-in-the-middle tokens, which the converter writes for every Gemma (its ids, as it has them)
GEMMA_SPECIAL_TOKENS = {"prefix": 67, "suffix": 69, "middle": 68, "fsep": 70, "eot": 107}


def _gemma_special_tokens(writer, folder: Path) -> None:
    special = special_vocab(folder, load_merges=False, special_token_types=list(GEMMA_SPECIAL_TOKENS))
    for kind, token in GEMMA_SPECIAL_TOKENS.items():
        special.special_token_ids.setdefault(kind, token)
    special.chat_template = None  # (written with the vocabulary)
    with gguf_quiet():  # (gguf-py has no field for some, and says so for each)
        special.add_to_gguf(writer, quiet=True)


GEMMA3_DEFAULTS = {
    "max_position_embeddings": 131072,
    "num_attention_heads": 8,
    "rms_norm_eps": 1e-6,
    "head_dim": 256,
    "num_key_value_heads": 4,
}


def _with_gemma3_defaults(hparams: dict) -> dict:
    return {**hparams, **{key: value for key, value in GEMMA3_DEFAULTS.items() if hparams.get(key) is None}}


def gemma3_header(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Gemma 3's header (Gemma 4's starts with it), as the converter writes it: TextModel's fields (the global
    layers' rope base, the sliding ones' as rope.freq_base_swa), with Gemma 3's defaults where the config lacks a
    value, then the final soft cap and the sliding window; a soft cap of the attention's scores is one line."""
    if hparams.get("attn_logit_softcapping") is not None:
        raise ConfigMismatchError(
            f"{folder / 'config.json'}: attn_logit_softcapping is set, which llama.cpp's gemma3 and gemma4 do not "
            "apply; serve this model with transformers or vLLM"
        )
    hparams = _with_gemma3_defaults(hparams)
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    if hparams.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(hparams["final_logit_softcapping"])
    if hparams.get("sliding_window_pattern") != 1:
        writer.add_sliding_window(hparams["sliding_window"])


def embedding_gemma(hparams: dict) -> bool:
    """Gemma 3's layers alone (`Gemma3TextModel`): EmbeddingGemma's, llama.cpp's gemma-embedding."""
    return (hparams.get("architectures") or [None])[0] == "Gemma3TextModel"


def embedding_gemma_dense(writer, hparams: dict, folder: Path) -> dict:
    """EmbeddingGemma's projections after pooling, its sentence-transformers Dense modules (2_Dense, 3_Dense), as the
    converter writes them with --sentence-transformers-dense-modules: without them llama.cpp's embedding is another.
    Modules llama.cpp would not run as sentence-transformers does: one line."""
    if not embedding_gemma(hparams):
        return {}
    modules = [path for path, _ in dense_modules(folder)]
    weights = {f"{_dense_name(path)}.weight": dense_weight(folder, path) for path in modules}
    width, where = hparams["hidden_size"], folder / "modules.json"
    if len(weights) < len(modules):
        raise ConfigMismatchError(
            f"{where}: Dense modules {modules}, and llama.cpp's gemma-embedding runs two, 2_Dense then one other; "
            "serve this model with sentence-transformers"
        )
    ends = {"dense_2.weight": ("takes", 1), "dense_3.weight": ("gives", 0)}  # (llama.cpp asserts both widths)
    for name, (what, axis) in ends.items():
        if name in weights and weights[name].shape[axis] != width:
            raise ConfigMismatchError(
                f"{where}: its {name.split('.')[0]} projection {what} {weights[name].shape[axis]} features, and "
                f"llama.cpp's gemma-embedding {what} the model's {width}; serve this model with sentence-transformers"
            )
    return weights


def _dense_name(path: str) -> str:
    """The converter's name of a Dense module's projection: dense_2 for 2_Dense, dense_3 for any other."""
    return "dense_2" if path == "2_Dense" else "dense_3"


def gemma3_architecture(hparams: dict) -> str | None:
    return "GEMMA_EMBEDDING" if embedding_gemma(hparams) else None


def gemma3_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Gemma 3's header. llama.cpp makes every sixth layer global and scales queries by head width: a config
    otherwise is one line. EmbeddingGemma's then the pooling its sentence-transformers folder names (its window as
    config.json says it, as the converter writes it over transformers' halving of a bidirectional model's)."""
    where = folder / "config.json"
    check_query_scale(_with_gemma3_defaults(hparams), "gemma3", 62, where)
    gemma3_header(writer, hparams, ftype, blocks, folder)
    if embedding_gemma(hparams):
        for path, config in dense_modules(folder):
            if config.get("in_features") is not None and config.get("out_features") is not None:
                writer.add_dense_features_dims(_dense_name(path), config["in_features"], config["out_features"])
        pooled(writer, hparams, folder)
    if hparams.get("sliding_window_pattern") != 1:
        global_every_sixth = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(blocks)]
        if hparams.get("layer_types") not in (None, global_every_sixth):
            raise ConfigMismatchError(
                f"{where}: layer_types is not one global layer in six, the only pattern "
                "llama.cpp's gemma3 runs; serve this model with transformers or vLLM"
            )
    if not (folder / "tokenizer.model").is_file():
        # The converter cuts the embedding to the tokens tokenizer.json lists (its vocabulary plus its added tokens,
        # counted again where they are in both) but lists the config's count of tokens, so fewer rows than that
        # make a file llama.cpp refuses to load ("token_embd.weight has wrong shape").
        tokenizer = json_or_empty(folder / "tokenizer.json")
        tokens = len(tokenizer.get("model", {}).get("vocab", {})) + len(tokenizer.get("added_tokens", []))
        if tokens < hparams["vocab_size"]:
            raise ConfigMismatchError(
                f"{folder / 'tokenizer.json'}: {tokens} tokens for an embedding of "
                f"{hparams['vocab_size']} rows; llama.cpp's converter would cut the embedding "
                "to the tokens, and llama.cpp then refuses the file; give the folder the model's "
                "tokenizer.model (SentencePiece), with which every row is kept"
            )


def gemma_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    _gemma_hyperparameters(writer, hparams, ftype, blocks, folder / "config.json", gemma2=False)


def gemma2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    _gemma_hyperparameters(writer, hparams, ftype, blocks, folder / "config.json", gemma2=True)


def gemma_after_vocabulary(writer, hparams: dict, folder: Path) -> None:
    """CodeGemma's fill-in-the-middle tokens, then no space prefix."""
    _gemma_special_tokens(writer, folder)
    writer.add_add_space_prefix(False)


def no_space_prefix(writer, hparams: dict, folder: Path) -> None:
    writer.add_add_space_prefix(False)


def gemma3_after_vocabulary(writer, hparams: dict, folder: Path) -> None:
    if (folder / "tokenizer.model").is_file():  # (a SentencePiece vocabulary: no space prefix)
        writer.add_add_space_prefix(False)


MEGATRON = Unsupported("Megatron's Gemma layout (GeGLU, the embedding's scale, 1 + weight norms) is not mapped yet")
DENSE_ONLY = Unsupported("a dense family; merge-moe assembles no MoE from Gemma models", applies=False)
GEMMA3 = GGUFPart(
    "GEMMA3",
    hyperparameters=gemma3_hyperparameters,
    after_vocabulary=gemma3_after_vocabulary,
    norm_shift=1.0,
    arch_by_config=gemma3_architecture,
    beside_model=embedding_gemma_dense,
)
GEMMA3_TABLE = t.TensorTable(
    "Gemma3ForCausalLM",
    {**t.SIZES, "num_key_value_heads": 4, "head_dim": 256},
    {**t.LAYER, **t.QK_NORM, **t.FEEDFORWARD_NORMS},
    {"attention_bias": (False, t.ATTENTION_BIAS)},
    nullable=(),
    heads_divide_hidden=True,
    tie_default=True,
)


def gemma3_vision_sizes(vision: dict, where: Path) -> dict:
    """Gemma 3's SigLIP tower, as its config names its sizes; a pooling head llama.cpp does not run is refused."""
    if vision.get("vision_use_head"):
        raise ConfigMismatchError(
            f"{where}: the vision tower has a pooling head (vision_use_head), which llama.cpp's "
            "gemma3 projector does not run; serve this model with transformers or vLLM"
        )
    return vision


def gemma3_vision_name(name: str) -> str:
    """The name the converter maps to gguf-py's CLIP names: the Hub's layout of Gemma 3's checkpoints
    (vision_tower.vision_model..., which transformers 5 saves as vision_tower...), `_weight` as `.weight`."""
    name = re.sub(r"^model\.", "", name)
    if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
        name = "vision_tower.vision_model." + name[len("vision_tower.") :]
    return name.replace("_weight", ".weight")


def gemma3_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's Gemma 3 projection in F16 and its embeddings (patches, positions) in F32, whatever the file's
    type."""
    if len(shape) > 1 and "input_projection" in source:
        return gguf.GGMLQuantizationType.F16
    if ".embeddings." in source or name.startswith("v.position_embd"):
        return gguf.GGMLQuantizationType.F32
    return None


def gemma3_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The tower's norm epsilon and GELU; the patches averaged n x n into the image's tokens: llama.cpp assumes 4
    (Gemma 3's 64 x 64 patches into 16 x 16 tokens) unless the file says otherwise."""
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    writer.add_vision_use_gelu(True)
    per_side = int(processor.get("image_seq_length", 256) ** 0.5)
    scale = (vision["image_size"] // vision["patch_size"]) // per_side
    if scale > 0 and scale != 4:
        writer.add_vision_projector_scale_factor(scale)


GEMMA3_MMPROJ = MmprojPart(
    "GEMMA3",
    r"^(?:model\.)?(?:vision_tower|multi_modal_projector)\.",
    gemma3_vision_sizes,
    gemma3_projector_keys,
    forced_type=gemma3_forced_type,
    converter_name=gemma3_vision_name,
)

FAMILIES = (
    Family(
        "Gemma",
        "gemma",
        "GemmaForCausalLM",
        tensors=t.TensorTable(
            "GemmaForCausalLM",
            {**t.SIZES, "num_key_value_heads": 16, "head_dim": 256},
            t.LAYER,
            {"attention_bias": (False, t.ATTENTION_BIAS)},
            nullable=(),
            tie_default=True,
        ),
        megatron=MEGATRON,
        # torchtune's Gemma: Llama's torchtune names (q and k rows permuted as Llama's), the head tied to the embedding
        meta_names=TORCHTUNE_LLAMA,
        torchtune_names=TORCHTUNE_LLAMA,
        torchtitan_names=Unsupported("torchtitan has no Gemma model", applies=False),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "GEMMA", hyperparameters=gemma_hyperparameters, after_vocabulary=gemma_after_vocabulary, norm_shift=1.0
        ),
        mmproj=TEXT_ONLY,
        moe_layout=DENSE_ONLY,
        notes={"meta_names": "torchtune's names (torchtitan has no Gemma)"},
    ),
    Family(
        "Gemma 2",
        "gemma2",
        "Gemma2ForCausalLM",
        tensors=t.TensorTable(
            "Gemma2ForCausalLM",
            {**t.SIZES, "num_key_value_heads": 4, "head_dim": 256},
            {**t.LAYER, **t.FEEDFORWARD_NORMS},
            {"attention_bias": (False, t.ATTENTION_BIAS)},
            nullable=(),
            heads_divide_hidden=True,
            tie_default=True,
        ),
        megatron=MEGATRON,
        meta_names=TORCHTUNE_GEMMA2,
        torchtune_names=TORCHTUNE_GEMMA2,
        torchtitan_names=Unsupported("torchtitan has no Gemma 2 model", applies=False),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "GEMMA2", hyperparameters=gemma2_hyperparameters, after_vocabulary=no_space_prefix, norm_shift=1.0
        ),
        mmproj=TEXT_ONLY,
        moe_layout=DENSE_ONLY,
        notes={"meta_names": "torchtune's names, its MLP's norms by what torchtune computes (not as its converter)"},
    ),
    Family(
        "Gemma 3 (text)",
        "gemma3_text",
        "Gemma3ForCausalLM",
        tensors=GEMMA3_TABLE,
        megatron=MEGATRON,
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=GEMMA3,
        mmproj=TEXT_ONLY,
        moe_layout=DENSE_ONLY,
        also=("Gemma3TextModel",),  # (its layers alone: EmbeddingGemma's, llama.cpp's gemma-embedding)
    ),
    Family(
        "Gemma 3",
        "gemma3",
        "Gemma3ForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=GEMMA3,
        mmproj=GEMMA3_MMPROJ,
        moe_layout=DENSE_ONLY,
    ),
)

"""Command R and Aya (Cohere's first Command R layout): attention and MLP in parallel behind one LayerNorm, rotary over
interleaved pairs, tied embeddings whose logits are scaled; llama.cpp's command-r, the converter's TextModel header
with the context the tokenizer says (model_max_length), the logit scale and no rope scaling.

Command R7B and Command A (`Cohere2ForCausalLM`): the same layout, three layers in four with rotary embeddings and a
sliding window, the fourth global without positions; llama.cpp's cohere2, which takes that pattern as it is."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of, gguf_py, rope_parameters, sliding_three_in_four, text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import LLAMA_CPP_GGUF_PY, NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def cohere_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's CommandR2Model's: the TextModel's over the longest context the config gives, the logit scale,
    rope unscaled."""
    context = first_of(hparams, "model_max_length", "max_position_embeddings")
    text_hyperparameters(writer, {**hparams, "max_position_embeddings": context}, ftype, blocks, folder)
    writer.add_logit_scale(hparams["logit_scale"])
    writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)


def cohere_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's command-r turns rope unscaled, whatever scaling the config gives."""
    rope_type = rope_parameters(hparams)[1].get("rope_type")
    if rope_type not in (None, "default"):
        raise ConfigMismatchError(
            f"{where}: rope type {rope_type!r}, and llama.cpp's command-r turns rope unscaled: it would compute "
            "another model; serve this one with transformers or vLLM"
        )


def cohere2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Cohere2Model's: the TextModel's, the logit scale, the sliding window, the vocabulary's size,
    the rotated part of a head (`rotary_pct` on the Hub; transformers' config has none: all of it), rope unscaled."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_logit_scale(hparams["logit_scale"])
    writer.add_sliding_window(hparams["sliding_window"])
    writer.add_vocab_size(hparams["vocab_size"])
    rotated = first_of(hparams, "rotary_pct", "partial_rotary_factor")
    head = hparams["hidden_size"] // hparams["num_attention_heads"]
    writer.add_rope_dimension_count(int((1.0 if rotated is None else rotated) * head))
    writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)


def cohere2_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's cohere2 slides a window over three layers in four and turns rope on those alone, ties the output to
    the embeddings and has no biases: a config of another layout is one line, as is cohere_checked's rope scaling."""
    cohere_checked(hparams, where)
    pattern = sliding_three_in_four(hparams["num_hidden_layers"])
    kinds = hparams.get("layer_types") or pattern
    if kinds != pattern or hparams.get("sliding_window") is None:
        raise ConfigMismatchError(
            f"{where}: layer_types is not a sliding window on three layers in four (and sliding_window set), which "
            "llama.cpp's cohere2 runs; serve this model with transformers or vLLM"
        )
    for key, llama_cpp in (("tie_word_embeddings", True), ("attention_bias", False)):
        if bool(hparams.get(key, llama_cpp)) != llama_cpp:
            raise ConfigMismatchError(
                f"{where}: {key} is {str(not llama_cpp).lower()}, and llama.cpp's cohere2 has "
                f"{'its output tied to the embeddings' if llama_cpp else 'no biases'}; serve this model with "
                "transformers or vLLM"
            )


def cohere2moe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Cohere2MoeModel's: the TextModel's (the router's function among them), the logit scale, the
    window and its layers, the vocabulary's size, the experts' width (intermediate_size), no dense layers first
    (cohere2moe_checked), whether the chosen experts' weights are renormalised, the rotated head, rope unscaled."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=True)
    writer.add_logit_scale(hparams["logit_scale"])
    writer.add_sliding_window(hparams["sliding_window"])
    writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in hparams["layer_types"]])
    writer.add_vocab_size(hparams["vocab_size"])
    writer.add_expert_feed_forward_length(hparams["intermediate_size"])
    writer.add_leading_dense_block_count(0)
    writer.add_expert_weights_norm(hparams.get("norm_topk_prob", False))
    writer.add_rope_dimension_count(hparams["head_dim"])
    writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)


def cohere2moe_checked(hparams: dict, where: Path) -> None:
    """What unshard has checked against llama.cpp's cohere2moe: experts in every layer, without shared experts,
    MTP layers or biases (the converter drops those it finds zeros). Another config is one line."""
    for refused, what in (
        (
            any(kind != "sparse" for kind in hparams.get("mlp_layer_types") or ()),
            f"mlp_layer_types is {hparams.get('mlp_layer_types')}: dense layers",
        ),
        (hparams.get("num_shared_experts"), "num_shared_experts is set: shared experts"),
        (hparams.get("num_nextn_predict_layers"), "num_nextn_predict_layers is set: MTP layers"),
        (hparams.get("attention_bias"), "attention_bias is set: biases"),
    ):
        if refused:
            raise ConfigMismatchError(
                f"{where}: {what}, which unshard does not write for llama.cpp's cohere2moe yet; write a folder and use "
                "llama.cpp's convert_hf_to_gguf.py"
            )


FAMILIES = (
    Family(
        "Command R",
        "cohere",
        "CohereForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Command R layout (attention and MLP in parallel) is not mapped yet"),
        **no_trainer_model("Command R"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "COMMAND_R", hyperparameters=cohere_hyperparameters, check_config=cohere_checked, vocabulary="bpe"
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "Command R7B / A",
        "cohere2",
        "Cohere2ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Command R layout (attention and MLP in parallel) is not mapped yet"),
        **no_trainer_model("Command R7B"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "COHERE2", hyperparameters=cohere2_hyperparameters, check_config=cohere2_checked, vocabulary="bpe"
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "Command R MoE",
        "cohere2_moe",
        "Cohere2MoeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Command R layout (attention and MLP in parallel) is not mapped yet"),
        **no_trainer_model("Command R MoE"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "COHERE2MOE", hyperparameters=cohere2moe_hyperparameters, check_config=cohere2moe_checked, vocabulary="bpe"
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="cohere2moe")},
    ),
)

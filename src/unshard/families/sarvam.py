"""Sarvam MoE (Sarvam AI's `SarvamMoEForCausalLM`: Sarvam-30B and -105B), which transformers 5 builds as GLM-4.5's MoE
and saves under Sarvam's names (q, k and v in one `query_key_value`, `dense`, `query_layernorm`, the experts'
correction bias as `expert_bias`): q and k normed per head, rope on all of a head, dense first layers, then experts
behind a sigmoid router with its correction bias and shared experts. To GGUF as llama.cpp's bailingmoe2, the
converter's SarvamMoEModel's file: BailingMoeV2's header with the whole head's rotary width, the experts stacked, the
correction bias less its mean (Sarvam's loader centres it: the same experts are chosen)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of, routed_by_sigmoid, text_hyperparameters, with_leading_dense_layers
from .llama import TEXT_ONLY
from .parts import NO_TABLE, Family, GGUFPart, Unsupported, no_trainer_model


def sarvam_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's SarvamMoEModel's: the TextModel's (routed by a sigmoid, as transformers routes whatever the
    config says), BailingMoeV2's experts, dense first layers and vocabulary size (its rotary width of half a head
    written, then the whole head's over it, in its place), and the MTP layers' count where the config has one."""
    where = folder / "config.json"
    hparams = with_leading_dense_layers(routed_by_sigmoid(hparams, where), where, "bailingmoe2")
    text_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=True)
    head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    shared, width = first_of(hparams, "num_shared_experts", "n_shared_experts"), hparams["moe_intermediate_size"]
    writer.add_rope_dimension_count(head)
    writer.add_leading_dense_block_count(hparams["first_k_dense_replace"])
    writer.add_vocab_size(hparams["vocab_size"])
    writer.add_expert_feed_forward_length(width)
    writer.add_expert_shared_feed_forward_length(hparams.get("moe_shared_expert_intermediate_size", width * shared))
    writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
    writer.add_expert_shared_count(shared)
    writer.add_expert_weights_norm(hparams["norm_topk_prob"])
    if hparams.get("num_nextn_predict_layers") is not None:
        writer.add_nextn_predict_layers(hparams["num_nextn_predict_layers"])


def sarvam_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's bailingmoe2 computes otherwise than transformers: queries narrower or wider than the hidden
    size (its fused q, k and v take q as wide as the model), experts chosen within groups, MTP layers a trained
    checkpoint lacks (llama.cpp would look for them)."""
    head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    if head * hparams["num_attention_heads"] != hparams["hidden_size"]:
        raise ConfigMismatchError(
            f"{where}: the queries are {head * hparams['num_attention_heads']} wide where the model is "
            f"{hparams['hidden_size']}, and llama.cpp's bailingmoe2 takes them as wide as the model; serve this model "
            "with transformers or vLLM"
        )
    if (hparams.get("topk_group") or 1) < (hparams.get("n_group") or 1):
        raise ConfigMismatchError(
            f"{where}: the experts are chosen within {hparams['topk_group']} of {hparams['n_group']} groups, which "
            "the converter's file for llama.cpp's bailingmoe2 does not say; serve this model with transformers or vLLM"
        )
    if hparams.get("num_nextn_predict_layers"):
        raise ConfigMismatchError(
            f"{where}: num_nextn_predict_layers is {hparams['num_nextn_predict_layers']}, MTP layers transformers' "
            "model does not hold (a trained checkpoint lacks them) and llama.cpp's bailingmoe2 would look for; set it "
            "to 0 with --config-from a folder whose config says so"
        )


FAMILIES = (
    Family(
        "Sarvam MoE",
        "sarvam_moe",
        "SarvamMoEForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Sarvam MoE layout is not mapped yet"),
        **no_trainer_model("Sarvam MoE"),
        fused_siblings=Unsupported(
            "not yet compared with what llm-compressor writes for Sarvam MoE (its pinned transformers has none)"
        ),
        gguf=GGUFPart(
            "BAILINGMOE2",
            hyperparameters=sarvam_hyperparameters,
            check_config=sarvam_checked,
            renames=((r"\.expert_bias$", ".expert_bias.bias"),),
            centred=(".expert_bias",),
            vocabulary="bpe",
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        also=("modeling_sarvam_moe.SarvamMoEForCausalLM",),
    ),
)

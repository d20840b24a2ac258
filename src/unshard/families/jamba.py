"""Jamba (`JambaForCausalLM`, AI21's): Mamba layers (their time step, B and C normed with weights) with an attention
layer every `attn_layer_period` layers (no rotary embeddings), and experts behind a softmax router every
`expert_layer_period` layers, the others an MLP; llama.cpp's jamba, which tells the attention layers by their
key-value heads (none on the Mamba layers) and the MoE layers by their router, as the converter's JambaModel writes
them (its own header)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .llama import TEXT_ONLY
from .mamba import mamba_tensors
from .parts import NO_TABLE, Family, GGUFPart, Unsupported, no_trainer_model


def jamba_attention_layers(hparams: dict, blocks: int) -> list[bool]:
    offset, period = hparams["attn_layer_offset"], hparams["attn_layer_period"]
    return [i >= offset and (i - offset) % period == 0 for i in range(blocks)]


def jamba_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's JambaModel's (not the TextModel's): the sizes, the key-value heads of each layer (0 on the
    Mamba layers), Mamba's sizes (the time step's rank a sixteenth of the width where the config names none), the
    norms' epsilon, the experts."""
    width = hparams["hidden_size"]
    writer.add_block_count(blocks)
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    kv_heads = hparams["num_key_value_heads"]
    writer.add_head_count_kv([kv_heads if layer else 0 for layer in jamba_attention_layers(hparams, blocks)])
    writer.add_ssm_conv_kernel(hparams.get("mamba_d_conv") or 4)
    writer.add_ssm_inner_size(hparams["mamba_expand"] * width)
    writer.add_ssm_state_size(hparams.get("mamba_d_state") or 16)
    writer.add_ssm_time_step_rank(hparams.get("mamba_dt_rank") or -(width // -16))
    writer.add_layer_norm_rms_eps(hparams.get("layer_norm_epsilon") or hparams.get("rms_norm_eps") or 1e-6)
    writer.add_expert_count(hparams["num_experts"])
    writer.add_expert_used_count(hparams["num_experts_per_tok"])
    writer.add_file_type(ftype)


def jamba_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's jamba has not: an inner width other than twice the model's, biases on the Mamba projections,
    a convolution without its bias, a sliding window, another activation than SiLU; and a tokenizer without its
    SentencePiece model, whose tokenizer.json alone the converter reads as a Llama vocabulary unshard does not write
    yet."""
    if not (where.parent / "tokenizer.model").is_file():
        raise ConfigMismatchError(
            f"{where.parent}: no tokenizer.model, and llama.cpp's converter reads a Jamba's tokenizer.json alone as a "
            "Llama vocabulary unshard does not write yet; pass --config-from a folder with the SentencePiece model "
            "(Jamba's releases have one)"
        )
    for wrong, why in (
        (hparams["mamba_expand"] != 2, f"mamba_expand is {hparams['mamba_expand']}, and llama.cpp's jamba takes 2"),
        (hparams.get("mamba_proj_bias"), "mamba_proj_bias is set, and llama.cpp's jamba has no such biases"),
        (not hparams.get("mamba_conv_bias", True), "mamba_conv_bias is off, and llama.cpp's jamba reads the bias"),
        (
            hparams.get("sliding_window"),
            f"sliding_window is {hparams.get('sliding_window')}, which llama.cpp's jamba has not",
        ),
        (hparams.get("hidden_act", "silu") != "silu", f"hidden_act is {hparams.get('hidden_act')!r}, not SiLU"),
    ):
        if wrong:
            raise ConfigMismatchError(
                f"{where}: {why}: llama.cpp would compute another model or not load the file; serve this model with "
                "transformers or vLLM"
            )


FAMILIES = (
    Family(
        "Jamba",
        "jamba",
        "JambaForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Jamba layout is not mapped yet"),
        **no_trainer_model("Jamba"),
        fused_siblings=(("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj")),
        gguf=GGUFPart(
            "JAMBA", hyperparameters=jamba_hyperparameters, check_config=jamba_checked, rearranged=mamba_tensors
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)

"""Nemotron (NVIDIA's Nemotron-4 and Minitron): LayerNorms applied as 1 + weight, rope over part of each head, a
two-layer ReLU² MLP (up and down); llama.cpp's nemotron, whose converter stores the norms as 1 + weight, writes the
TextModel's header with the vocabulary's size, the LayerNorm's epsilon, the rotary dimensions and the rope scaling,
and sets the SentencePiece vocabulary's padding and unknown tokens to 0 and 1.

Nemotron-H (NVIDIA's Nemotron-H and Nemotron Nano 2): layers of one kind each, Mamba-2 (mamba2.py), attention without
rope, or a two-layer ReLU² MLP, each behind an RMS norm; llama.cpp's nemotron_h, whose converter is Granite 4.0's
hybrid one with the attention's head width and the MLP's width per layer (0 where a layer has none). Its transformers
(4.57) has no nemotron_h, so it reads config.json as the Hub writes it: the layers as a pattern (M, *, -) and no
MoE settings in a dense model, where transformers 5 reads every MoE setting defaulted; unshard writes the header the
converter writes from the Hub's config. Nemotron 3 Nano's MoE layers: ReLU² experts (up and down) behind a sigmoid
router with its correction bias, a shared expert; llama.cpp's nemotron_h_moe. Nemotron 3 Super's: the experts in a
narrower space (moe_latent_size), each MoE layer projecting into it and out of it."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of, gguf_py, gguf_quiet, rope_parameters, text_hyperparameters
from .granite import granitemoe_hyperparameters
from .llama import TEXT_ONLY
from .mamba2 import add_mamba2_sizes, mamba2_checked, mamba2_tensors
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Rearrangement, Unsupported, no_trainer_model


def nemotron_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's NemotronModel's, in its order (the epsilon it writes again keeps its first place)."""
    gguf = gguf_py()
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_vocab_size(hparams["vocab_size"])
    with gguf_quiet():
        writer.add_layer_norm_eps(first_of(hparams, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "norm_eps"))
    _, rope = rope_parameters(hparams)
    writer.add_rope_dimension_count(
        int(rope["partial_rotary_factor"] * hparams["hidden_size"]) // hparams["num_attention_heads"]
    )
    factor = hparams.get("factor") or rope.get("factor")
    if factor is None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    else:
        with gguf_quiet():
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(factor)


def nemotron_special_tokens(writer, hparams: dict, folder: Path) -> None:
    """The padding and unknown tokens the converter sets after the vocabulary, whatever the tokenizer says."""
    with gguf_quiet():
        writer.add_pad_token_id(0)
        writer.add_unk_token_id(1)


# Nemotron-H's layer kinds, by the Hub's pattern's letters and transformers 5's names
NEMOTRON_H_KINDS = {
    "M": "mamba",
    "linear_attention": "mamba",
    "*": "attention",
    "full_attention": "attention",
    "-": "mlp",
    "E": "moe",
}
# the MoE settings transformers 5 fills in for every Nemotron-H, which a dense model's config on the Hub lacks
MOE_SETTINGS = (
    "n_routed_experts",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "n_shared_experts",
    "norm_topk_prob",
    "routed_scaling_factor",
    "moe_intermediate_size",
    "moe_shared_expert_intermediate_size",
    "moe_latent_size",
)


def nemotron_h_layers(hparams: dict) -> list[str]:
    """Each layer's kind (mamba, attention, mlp, moe), from the Hub's pattern or transformers 5's layer types."""
    pattern = hparams.get("hybrid_override_pattern") or hparams.get("layers_block_type") or ()
    return [NEMOTRON_H_KINDS.get(kind, kind) for kind in pattern]


def nemotron_h_as_the_hub_has_it(hparams: dict, where: Path) -> dict:
    """The config as the converter reads a Nemotron-H's from the Hub: its layer count from its layers, no MoE
    settings in a dense model (with them the converter writes its MoE architecture), no MTP layers (a trained
    checkpoint has none: transformers drops them)."""
    kinds = nemotron_h_layers(hparams)
    hub = {**hparams, "num_hidden_layers": len(kinds), "num_nextn_predict_layers": 0}
    return hub if "moe" in kinds else {k: v for k, v in hub.items() if k not in MOE_SETTINGS}


def nemotron_h_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's NemotronHModel's: Granite 4.0's hybrid's (Granite's header without the head width, Mamba-2's
    sizes, the key-value heads of the attention layers), then the head width, the MLP's width per layer (the experts'
    in a MoE model) and the experts' settings, some rewritten in their places as the converter writes them again."""
    kinds = nemotron_h_layers(hparams)
    moe = "moe" in kinds
    granitemoe_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=moe)
    sizes = {
        "conv": hparams["conv_kernel"],
        "state": hparams["ssm_state_size"],
        "groups": hparams["n_groups"],
        "inner": hparams["mamba_num_heads"] * hparams["mamba_head_dim"],
        "heads": hparams["mamba_num_heads"],
    }
    kv_heads = hparams.get("num_key_value_heads") or hparams["num_attention_heads"]
    add_mamba2_sizes(writer, sizes, kv_heads, [kind == "attention" for kind in kinds])
    writer.add_key_length(hparams["head_dim"])
    writer.add_value_length(hparams["head_dim"])
    width, mlp = ("moe_intermediate_size", "moe") if moe else ("intermediate_size", "mlp")
    with gguf_quiet():
        writer.add_feed_forward_length([hparams[width] if kind == mlp else 0 for kind in kinds])
        if moe:
            writer.add_expert_used_count(hparams["num_experts_per_tok"])
            writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
            writer.add_expert_shared_feed_forward_length(hparams["moe_shared_expert_intermediate_size"])
            writer.add_expert_count(hparams["n_routed_experts"])
            writer.add_expert_shared_count(hparams["n_shared_experts"])
            writer.add_expert_weights_norm(hparams["norm_topk_prob"])
            writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
            writer.add_expert_group_count(hparams["n_group"])
            writer.add_expert_used_count(hparams["num_experts_per_tok"])
            if hparams.get("moe_latent_size") is not None:  # (Nemotron 3 Super's experts, in a narrower space)
                writer.add_moe_latent_size(hparams["moe_latent_size"])


def nemotron_h_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's nemotron_h would compute otherwise than transformers: a sliding window, another MLP activation
    than ReLU² or Mamba-2's than SiLU; in a MoE model, MLP layers beside the experts, or experts chosen within groups;
    and every hybrid's Mamba-2 checks (mamba2.mamba2_checked)."""
    kinds = nemotron_h_layers(hparams)
    refused = [
        (hparams.get("sliding_window") is not None, f"sliding_window is {hparams.get('sliding_window')}"),
        (hparams.get("mlp_hidden_act", "relu2") != "relu2", f"mlp_hidden_act is {hparams.get('mlp_hidden_act')!r}"),
        (
            hparams.get("mamba_hidden_act", "silu") != "silu",
            f"mamba_hidden_act is {hparams.get('mamba_hidden_act')!r}",
        ),
        (
            "moe" in kinds and "mlp" in kinds,
            "a MoE model with MLP layers (llama.cpp takes the experts' width for theirs)",
        ),
        (
            "moe" in kinds and (hparams.get("topk_group") or 1) < (hparams.get("n_group") or 1),
            f"experts chosen within {hparams.get('topk_group')} of {hparams.get('n_group')} groups",
        ),
    ]
    for refuse, what in refused:
        if refuse:
            raise ConfigMismatchError(
                f"{where}: {what}, which llama.cpp's nemotron_h does not compute: it would compute another model; "
                "serve this one with transformers or vLLM"
            )
    mamba2_checked(hparams, where, "nemotron_h")


def nemotron_h_arch(hparams: dict) -> str | None:
    """llama.cpp's nemotron_h_moe for a model with MoE layers (Nemotron 3 Nano's), else the family's nemotron_h."""
    return "NEMOTRON_H_MOE" if "moe" in nemotron_h_layers(hparams) else None


def nemotron_h_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The Mamba-2 layers' tensors as the converter stores them (mamba2.py); the experts are stacked as every MoE
    family's (under the name the converter gives them: the family's renames)."""
    return mamba2_tensors(name, shape, ".mixer.", hparams["n_groups"])


FAMILIES = (
    Family(
        "Nemotron",
        "nemotron",
        "NemotronForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Nemotron layout (LayerNorm1P, partial rope) is not mapped yet"),
        **no_trainer_model("Nemotron"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        gguf=GGUFPart(
            "NEMOTRON",
            hyperparameters=nemotron_hyperparameters,
            after_vocabulary=nemotron_special_tokens,
            norm_shift=1.0,  # (LayerNorm1P: the converter stores 1 + weight, which llama.cpp applies as it is)
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "Nemotron-H",
        "nemotron_h",
        "NemotronHForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Nemotron-H layout (Mamba-2 layers) is not mapped yet"),
        **no_trainer_model("Nemotron-H"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        gguf=GGUFPart(
            "NEMOTRON_H",
            hyperparameters=nemotron_h_hyperparameters,
            permute_qk=True,
            check_config=nemotron_h_checked,
            vocabulary="bpe",
            rearranged=nemotron_h_tensors,
            as_the_converter_reads=nemotron_h_as_the_hub_has_it,
            arch_by_config=nemotron_h_arch,
            # (a layer's experts, stacked under the name the converter gives them before it maps them)
            renames=((r"^backbone\.layers\.(\d+)\.mixer\.experts\.", r"model.layers.\1.mlp.experts."),),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)

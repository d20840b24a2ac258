"""Step 3.7 Flash (StepFun's, `Step3p7ForConditionalGeneration`): q and k normed per head, attention's output gated per
head by a sigmoid of its own projection, more heads on the sliding-window layers than on the global ones, rope on all
of a sliding head and on half of a global one, each at its own base, dense first layers, then experts behind a sigmoid
router with its correction bias (renormalised, scaled) and a shared expert, the SwiGLU clamped on the layers the config
bounds, Gemma's norms (1 + weight); beside a vision tower. Its text model as llama.cpp's step35, which PyPI's gguf-py
0.19 lacks."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_quiet, rope_parameters, text_hyperparameters
from .parts import LLAMA_CPP_GGUF_PY, NO_TABLE, Family, GGUFPart, Unsupported, no_trainer_model

# the converter's test of a full-attention layer's rope (on half of each head) and a sliding one's (on all of it),
# which llama.cpp's step35 fixes in its code
TURNED = {"full_attention": 0.5, "sliding_attention": 1.0}


def sliding(hparams: dict) -> list[bool]:
    return [kind == "sliding_attention" for kind in hparams["layer_types"]]


def bounds(limits: list | None, blocks: int) -> list[float] | None:
    """A SwiGLU's bound on each layer as the converter writes it (0 where none), or None where the config bounds
    none."""
    if limits is None:
        return None
    return [0.0 if limit is None else float(limit) for limit in limits] + [0.0] * (blocks - len(limits))


def step35_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Step35Model's: the TextModel's, then the heads and key-value heads of each layer, the window
    and which layers slide it, the values' width, the experts (their count, those used, their width and the shared
    expert's), the routing's scale and renormalisation (transformers' router always renormalises), the dense first
    layers, the norms' epsilon and the SwiGLU's bounds."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    windowed = sliding(hparams)
    heads = hparams.get("num_sliding_attention_heads") or hparams["num_attention_heads"]
    with gguf_quiet():  # (over the TextModel's, in their places)
        writer.add_head_count([heads if slides else hparams["num_attention_heads"] for slides in windowed])
        writer.add_head_count_kv([hparams["num_key_value_heads"]] * blocks)
    writer.add_sliding_window(hparams["sliding_window"])
    writer.add_sliding_window_pattern(windowed)
    with gguf_quiet():
        writer.add_value_length(hparams["head_dim"])
        writer.add_expert_count(hparams["n_routed_experts"])
        writer.add_expert_used_count(hparams["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_expert_shared_feed_forward_length(hparams["share_expert_dim"])
    writer.add_expert_weights_scale(hparams.get("moe_router_scaling_factor", 1.0))
    writer.add_expert_weights_norm(True)
    kinds = hparams["mlp_layer_types"]
    writer.add_leading_dense_block_count(next((i for i, kind in enumerate(kinds) if kind != "dense"), len(kinds)))
    writer.add_moe_every_n_layers(1)
    with gguf_quiet():
        writer.add_layer_norm_rms_eps(hparams.get("rms_norm_eps", 1e-5))
    if (routed := bounds(hparams.get("swiglu_limits"), blocks)) is not None:
        writer.add_swiglu_clamp_exp(routed)
    if (shared := bounds(hparams.get("swiglu_limits_shared"), blocks)) is not None:
        writer.add_swiglu_clamp_shexp(shared)


def step35_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's step35 computes: full and sliding layers only, rope unscaled on half of a global head and all
    of a sliding one, a gate per head, queries scaled by 1/sqrt(head_dim), causal attention, dense layers first only,
    SiLU without biases. Another config is one line."""
    by_layer, _ = rope_parameters(hparams)
    kinds = hparams.get("layer_types") or []
    dense = [kind == "dense" for kind in hparams.get("mlp_layer_types") or []]
    lead = dense.index(False) if False in dense else len(dense)
    why = None
    if any(kind not in TURNED for kind in kinds):
        why = f"layer_types is {kinds}: llama.cpp's step35 has full and sliding-window layers only"
    elif any(
        float((by_layer.get(kind) or {}).get("partial_rotary_factor", 1.0)) != part
        for kind, part in TURNED.items()
        if kind in kinds
    ):
        why = "rope does not turn half of a global head and all of a sliding one, as llama.cpp's step35 fixes it"
    elif any((by_layer.get(kind) or {}).get("rope_type", "default") != "default" for kind in kinds):
        why = "the rope is scaled, and unshard writes step35's unscaled rope only"
    elif hparams.get("gating", True) not in (True, "per-head"):
        why = f"gating is {hparams.get('gating')!r}, and llama.cpp's step35 gates each head's output by one number"
    elif hparams.get("query_pre_attn_scalar", hparams["head_dim"]) != hparams["head_dim"]:
        why = "query_pre_attn_scalar is not head_dim, and llama.cpp's step35 scales queries by 1/sqrt(head_dim)"
    elif hparams.get("use_bidirectional_attention"):
        why = "use_bidirectional_attention is set, and llama.cpp's step35 attends causally"
    elif any(dense[lead:]):
        why = "a dense layer follows a layer with experts, and llama.cpp's step35 has dense layers first only"
    elif hparams.get("hidden_act", "silu") != "silu" or hparams.get("mlp_bias") or hparams.get("attention_bias"):
        why = "its MLP or attention has biases or another activation than SiLU, which llama.cpp's step35 lacks"
    if why:
        raise ConfigMismatchError(
            f"{where}: {why}: it would compute another model; serve this one with transformers or vLLM"
        )


FAMILIES = (
    Family(
        "Step 3.7 Flash",
        "step3p7",
        "Step3p7ForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Step 3.7 layout (a vision tower beside) is not mapped yet"),
        **no_trainer_model("Step 3.7 Flash"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")),
        gguf=GGUFPart(
            "STEP35",
            hyperparameters=step35_hyperparameters,
            check_config=step35_checked,
            norm_shift=1.0,
            renames=((r"\.moe\.router_bias$", ".moe.router_bias.bias"),),
            expert_stack_order=("gate_proj.weight", "up_proj.weight", "down_proj.weight"),
            towers=r"^(?:model\.)?(?:vision_model|multi_modal_projector)\.|^vit_large_projector\.",
            towers_left_out="its vision tower's: the converter's step3 projector is written for Step3-VL-10B's alone",
        ),
        mmproj=Unsupported(
            "Step 3.7's vision tower: llama.cpp's converter writes the step3 projector for Step3-VL-10B's tower alone "
            "(its sizes asserted), so unshard has no file to match yet"
        ),
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="step35")},
    ),
)

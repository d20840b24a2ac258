"""MiMo-V2-Flash (Xiaomi's, `MiMoV2FlashForCausalLM`): a window on most layers, with more key-value heads and rope
of its own there, learned attention sinks on the windowed layers, values narrower than keys and the attention's
output scaled, rope on a third of each head, a dense first layer, then experts behind a sigmoid router with its
correction bias (DeepSeek-V3's routing); llama.cpp's mimo2, without the multi-token-prediction layers the Hub's
checkpoints carry beside the model (transformers' model has none)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import GATING_KEYS, first_of, gguf_quiet, rope_parameters, text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_TABLE, Family, GGUFPart, Unsupported, no_trainer_model

# the Hub's keys for the windowed layers' attention, and transformers' for the same sizes, which it keeps for all
SAME_ON_WINDOWED_LAYERS = {
    "swa_head_dim": "head_dim",
    "swa_num_attention_heads": "num_attention_heads",
    "swa_v_head_dim": "v_head_dim",
}


def windowed(hparams: dict) -> list[bool]:
    """Which layers slide a window: transformers' layer_types, else the Hub's hybrid_layer_pattern."""
    if hparams.get("layer_types") is not None:
        return [kind == "sliding_attention" for kind in hparams["layer_types"]]
    return [bool(kind) for kind in hparams["hybrid_layer_pattern"]]


def windowed_key_value_heads(hparams: dict) -> int:
    """The windowed layers' key-value heads: the Hub's swa_num_key_value_heads, else transformers' (twice the
    global layers')."""
    return hparams.get("swa_num_key_value_heads") or 2 * hparams["num_key_value_heads"]


def window(hparams: dict) -> int:
    """The tokens a windowed query sees, itself among them, as transformers counts them (the Hub's
    sliding_window_size is those before it)."""
    if hparams.get("sliding_window_size") is not None:
        return hparams["sliding_window_size"] + 1
    return hparams["sliding_window"]


def mimo2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MimoV2Model's: the TextModel's (DeepSeek-V3's expert groups), then the key-value heads of
    each layer (over the TextModel's count, in its place), the window and which layers slide it, the values' width
    (over the keys', in its place), the experts' width, the rotated part of a head and the attention's output
    scale."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=True)
    kinds = windowed(hparams)
    heads = [windowed_key_value_heads(hparams) if slides else hparams["num_key_value_heads"] for slides in kinds]
    with gguf_quiet():
        writer.add_head_count_kv(heads)
    writer.add_sliding_window(window(hparams))
    writer.add_sliding_window_pattern([int(slides) for slides in kinds])
    with gguf_quiet():
        writer.add_value_length(hparams["v_head_dim"])
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    turned = float(rope_parameters(hparams)[1].get("partial_rotary_factor", 1.0))
    writer.add_rope_dimension_count(int(hparams["head_dim"] * turned))
    if hparams.get("attention_value_scale") is not None:  # (gguf-py 0.19 has the key, not its adder)
        writer.add_float32(f"{writer.arch}.attention.value_scale", float(hparams["attention_value_scale"]))


def mimo2_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's mimo2 computes: SiLU without biases, full and windowed layers only, the same rope on both
    but for its base, the routing (by a sigmoid) renormalised and unscaled, the windowed layers' heads as wide and
    as many as the others'. Another config is one line."""
    by_layer, full = rope_parameters(hparams)
    sliding = by_layer.get("sliding_attention") or full
    kinds = hparams.get("layer_types") or []
    pattern = hparams.get("hybrid_layer_pattern")
    gating = first_of(hparams, *GATING_KEYS)
    why = None
    if hparams.get("hidden_act", "silu") != "silu":
        why = f"hidden_act is {hparams['hidden_act']!r}, and llama.cpp's mimo2 runs SiLU"
    elif hparams.get("attention_bias"):
        why = "attention_bias is set, and llama.cpp's mimo2 has no biases"
    elif any(kind not in ("full_attention", "sliding_attention") for kind in kinds):
        why = f"layer_types is {kinds}: llama.cpp's mimo2 has full and sliding-window layers only"
    elif kinds and pattern is not None and [int(slides) for slides in windowed(hparams)] != list(pattern):
        why = "layer_types and hybrid_layer_pattern name different windowed layers"
    elif any(rope.get("rope_type", "default") != "default" for rope in (full, sliding)):
        why = "the rope is scaled, and llama.cpp's mimo2 turns it unscaled"
    elif full.get("partial_rotary_factor", 1.0) != sliding.get("partial_rotary_factor", 1.0):
        why = "the windowed layers turn another part of a head than the others, and llama.cpp's mimo2 turns one"
    elif hparams.get("norm_topk_prob") is False:
        why = "norm_topk_prob is off, and llama.cpp's mimo2 always renormalises the experts' weights"
    elif float(hparams.get("routed_scaling_factor") or 1.0) != 1.0:
        why = "routed_scaling_factor is not 1, and llama.cpp's mimo2 is given no scale for the experts' weights"
    elif gating not in (None, "sigmoid"):
        why = f"the experts' gating function is {gating!r}, and both transformers and llama.cpp route by a sigmoid"
    elif any(hparams.get(hub, hparams.get(key)) != hparams.get(key) for hub, key in SAME_ON_WINDOWED_LAYERS.items()):
        why = "the windowed layers' heads differ from the others' in width or count, which llama.cpp's mimo2 keeps"
    elif windowed_key_value_heads(hparams) != 2 * hparams["num_key_value_heads"]:
        why = "swa_num_key_value_heads is not twice num_key_value_heads, as transformers' MiMo-V2-Flash has them"
    if why:
        raise ConfigMismatchError(
            f"{where}: {why}: it would compute another model; serve this one with transformers or vLLM"
        )


FAMILIES = (
    Family(
        "MiMo-V2-Flash",
        "mimo_v2_flash",
        "MiMoV2FlashForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's MiMo-V2-Flash layout is not mapped yet"),
        **no_trainer_model("MiMo-V2-Flash"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "MIMO2",
            hyperparameters=mimo2_hyperparameters,
            check_config=mimo2_checked,
            renames=((r"\.attention_sink_bias$", ".attention_sink_bias.weight"),),
            expert_stack_order=("gate_proj.weight", "up_proj.weight", "down_proj.weight"),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)

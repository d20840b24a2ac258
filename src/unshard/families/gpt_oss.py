"""gpt-oss (OpenAI's): attention with biases and a learned sink per head, every other layer a sliding window, YaRN;
MoE layers whose experts are fused 3-D parameters with biases (gate and up interleaved in one, as transformers keeps
them on disk) behind a router with a bias, and a clamped SwiGLU. llama.cpp's gpt-oss, from a bf16 checkpoint as the
converter writes one: the experts transposed, gate and up apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigMismatchError
from ..names import megatron_rules as m
from ..names.meta_rules import Zeros
from ..names.stacked import Stacked
from .gguf_hooks import text_hyperparameters
from .llama import TEXT_ONLY, TORCHTITAN_COMMON
from .parts import (
    NO_TABLE,
    Family,
    GGUFPart,
    MegatronRules,
    Rearrangement,
    Unsupported,
    renamed_only,
    transposed,
)

EXPERTS = "mlp.experts."
L, A, E = m.L, "decoder.layers.{i}.self_attention.", "decoder.layers.{i}.mlp.experts.{e}."
# megatron-core's gpt-oss (SequentialMLP experts, each with its biases) as transformers names it: each expert's fc1
# ([gate; up]) a row of the layer's gate_up_proj, its columns interleaved; fc2 a row of down_proj, both turned.
MEGATRON = {
    **m.COMMON,
    A + "linear_proj.bias": L + "self_attn.o_proj.bias",
    A + "core_attention.softmax_offset": L + "self_attn.sinks",
    "decoder.layers.{i}.mlp.router.weight": L + "mlp.router.weight",
    "decoder.layers.{i}.mlp.router.bias": L + "mlp.router.bias",
    E + "linear_fc1.weight": Stacked(L + "mlp.experts.gate_up_proj", transposed=True, interleaved=True),
    E + "linear_fc1.bias": Stacked(L + "mlp.experts.gate_up_proj_bias", interleaved=True),
    E + "linear_fc2.weight": Stacked(L + "mlp.experts.down_proj", transposed=True),
    E + "linear_fc2.bias": Stacked(L + "mlp.experts.down_proj_bias"),
}

# torchtitan's gpt-oss (0.3): q, k and v with their biases in its QKV module, a sink per head, the router's gate with
# its bias, and the grouped experts: mlp1 [experts, 2 x width (gate and up interleaved, as transformers'), dim], mlp2
# [experts, dim, width], each expert turned as transformers holds it. torchtitan's own GptOssStateDictAdapter maps
# other names (mlp1_weight, under the Hub's MXFP4 `_blocks` names), so its to_hf leaves the experts out.
T, X = "layers.{i}.", "layers.{i}.moe.routed_experts.inner_experts."
TORCHTITAN = {
    **TORCHTITAN_COMMON,
    **{
        T + f"attention.qkv_linear.w{p}.{kind}": (L + f"self_attn.{p}_proj.{kind}", None)
        for p in "qkv"
        for kind in ("weight", "bias")
    },
    T + "attention.wo.weight": (L + "self_attn.o_proj.weight", None),
    T + "attention.wo.bias": (L + "self_attn.o_proj.bias", None),
    T + "attention.sinks": (L + "self_attn.sinks", None),
    T + "moe.router.gate.weight": (L + "mlp.router.weight", None),
    T + "moe.router.gate.bias": (L + "mlp.router.bias", None),
    X + "mlp1_weight_EGD": Stacked(L + "mlp.experts.gate_up_proj", transposed=True),
    X + "mlp1_bias_EG": (L + "mlp.experts.gate_up_proj_bias", None),
    X + "mlp2_weight_EDF": Stacked(L + "mlp.experts.down_proj", transposed=True),
    X + "mlp2_bias_ED": (L + "mlp.experts.down_proj_bias", None),
    T + "moe.expert_bias_E": Zeros(
        L + "mlp.router.weight",
        "torchtitan's load-balancing expert bias (transformers' gpt-oss routes without one)",
    ),
}


def megatron_config(args: dict[str, Any]) -> dict[str, Any]:
    """config.json's gpt-oss keys from Megatron-LM's args (its intermediate_size is the experts' width); what
    transformers' gpt-oss computes otherwise than the args say is refused."""
    differ = [
        what
        for what, bad in (
            ("the router's softmax before its top-k (--moe-router-pre-softmax)", args.get("moe_router_pre_softmax")),
            ("a router score other than softmax", args.get("moe_router_score_function", "softmax") != "softmax"),
            ("a GLU offset other than 1 (--glu-linear-offset)", args.get("glu_linear_offset") != 1.0),
            ("a window that looks ahead (--window-size)", (args.get("window_size") or (0, 0))[1] != 0),
            (
                "no clamp before the GLU (--activation-func-clamp-value)",
                args.get("activation_func_clamp_value") is None,
            ),
        )
        if bad
    ]
    if differ:
        raise CheckpointError(f"the args say {differ[0]}, which transformers' gpt-oss does not compute")
    layers, window, skip = args["num_layers"], args.get("window_size"), args.get("window_attn_skip_freq")
    if isinstance(skip, int):
        sliding = [(i + 1) % skip != 0 for i in range(layers)]
    else:  # (every layer windowed, or the args' own list of 1 for a windowed layer)
        sliding = [bool(x) for x in skip] if skip is not None else [True] * layers
    return {
        "num_local_experts": args["num_experts"],
        "num_experts_per_tok": args.get("moe_router_topk", 2),
        "intermediate_size": args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"],
        "attention_bias": True,
        "sliding_window": window[0] + 1 if window else None,
        "layer_types": ["sliding_attention" if window and windowed else "full_attention" for windowed in sliding],
        "swiglu_limit": args["activation_func_clamp_value"],
    }


def megatron_args(config: dict[str, Any]) -> dict[str, Any]:
    """Megatron-LM's gpt-oss args from config.json (megatron_config's other way): biases on every linear layer, the
    learned sinks, the clamped SwiGLU, the window and the layers it is on (a period where the layers keep one, as
    gpt-oss's every other layer, else one flag per layer)."""
    layers = config["num_hidden_layers"]
    sliding = [kind == "sliding_attention" for kind in config.get("layer_types") or ["full_attention"] * layers]
    window, skip = None, None
    if any(sliding):
        window = (config["sliding_window"] - 1, 0)  # (Megatron's: the tokens before; transformers' counts the token)
        periods = [k for k in range(2, layers + 1) if sliding == [(i + 1) % k != 0 for i in range(layers)]]
        skip = None if all(sliding) else periods[0] if periods else [int(windowed) for windowed in sliding]
    return {
        "swiglu": False,
        "quick_geglu": True,
        "glu_linear_offset": 1.0,
        "activation_func_clamp_value": config["swiglu_limit"],
        "add_bias_linear": True,
        "add_qkv_bias": False,  # (--add-bias-linear gives every linear layer, QKV's too, its bias)
        "softmax_type": "learnable",
        "window_size": window,
        "window_attn_skip_freq": skip,
    }


def gpt_oss_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's GptOssModel's: the TextModel's, the sliding window, the experts' width."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_sliding_window(hparams["sliding_window"])
    writer.add_expert_feed_forward_length(hparams["intermediate_size"])


def fused_experts(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The fused experts as llama.cpp stacks them: gate_up_proj (experts x hidden x 2 intermediate, gate and up
    columns interleaved) as gate's and up's stacks, each expert transposed; its bias likewise apart; down_proj
    transposed."""
    if EXPERTS not in name:
        return None
    base, kind = name.split(EXPERTS)
    base += EXPERTS
    if kind == "gate_up_proj":
        experts, hidden, both = shape
        halves = (experts, both // 2, hidden)
        return Rearrangement({base + "gate_proj.weight": halves, base + "up_proj.weight": halves}, interleaved_halves)
    if kind == "gate_up_proj_bias":
        halves = (shape[0], shape[1] // 2)
        return Rearrangement({base + "gate_proj.bias": halves, base + "up_proj.bias": halves}, interleaved_halves)
    if kind == "down_proj":
        return Rearrangement({base + "down_proj.weight": (shape[0], shape[2], shape[1])}, transposed)
    return None


def linear_experts(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The fused experts as llm-compressor makes Linear layers of them before quantizing: each expert's gate_proj and
    up_proj ([intermediate, hidden]: gate_up_proj's interleaved columns, transposed) and down_proj ([hidden,
    intermediate]), and their biases, stacked here one expert after the other."""
    if name.endswith(EXPERTS + "down_proj_bias"):
        return Rearrangement({name.removesuffix("down_proj_bias") + "down_proj.bias": shape}, renamed_only)
    return fused_experts(name, shape, hparams, where)


def interleaved_halves(band) -> tuple:
    """Gate's and up's experts from a band of gate_up_proj's (transposed) or its bias's: every other row."""
    rows = band.swapaxes(-1, -2) if band.ndim == 3 else band
    return rows[:, ::2], rows[:, 1::2]


def gpt_oss_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's gpt-oss assumes whatever the config says: SwiGLU's clamp at 7 and alpha of 1.702, a sliding
    window on every other layer from the first."""
    for key, assumed in (("swiglu_limit", 7.0), ("swiglu_alpha", 1.702)):
        if hparams.get(key, assumed) != assumed:
            raise ConfigMismatchError(
                f"{where}: {key} is {hparams[key]}, and llama.cpp's gpt-oss computes with {assumed}: it would "
                "compute another model; serve this one with transformers or vLLM"
            )
    alternating = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(hparams["num_hidden_layers"])]
    if hparams.get("layer_types", alternating) != alternating:
        raise ConfigMismatchError(
            f"{where}: layer_types are not a sliding window on every other layer from the first, as llama.cpp's "
            "gpt-oss has them: it would compute another model; serve this one with transformers or vLLM"
        )


FAMILIES = (
    Family(
        "gpt-oss",
        "gpt_oss",
        "GptOssForCausalLM",
        tensors=NO_TABLE,
        megatron=MegatronRules(
            MEGATRON,
            m.Signature(qkv_bias=True, experts=True, linear_bias=True, attention_sinks=True, activation="quick_geglu"),
            megatron_config,
            megatron_args,
        ),
        meta_names=TORCHTITAN,
        torchtitan_names=TORCHTITAN,
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        linearized=linear_experts,
        gguf=GGUFPart(
            "GPT_OSS",
            hyperparameters=gpt_oss_hyperparameters,
            vocabulary="bpe",
            rearranged=fused_experts,
            renames=((r"self_attn\.sinks$", "self_attn.sinks.weight"), (r"down_proj_bias$", "down_proj.bias")),
            check_config=gpt_oss_checked,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={
            "quantize": "each expert's projections Linear layers, as llm-compressor makes them",
            "megatron_legacy": "attention sinks, biased experts, sliding window, YaRN",
            "megatron_dist": "attention sinks, biased experts, sliding window, YaRN",
            "to_megatron": "each expert turned back into SequentialMLP's fc1 and fc2, with their biases",
            "meta_names": "torchtitan's names (its grouped experts turned as transformers holds them)",
        },
    ),
)

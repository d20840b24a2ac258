"""Hy4 (Tencent's, `HYV4ForCausalLM`): DeepSeek-V3's latent attention and experts behind a sigmoid router (the routed
experts' SwiGLU clamped, held stacked with gate and up fused), the attention's output gated per head and given a
learned sink, the residual stream kept as several mixed by hyper-connections (iHC), DeepSeek's sparse attention with
an indexer on some layers and the others reusing the last one's choice; llama.cpp's hy_v4, which PyPI's gguf-py 0.19
lacks (written with llama.cpp's own, sinks/gguf)."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .deepseek import DEEPSEEK2, deepseek2_hyperparameters, latent_kv, latent_query_checked
from .gguf_hooks import GATING_KEYS, first_of, gguf_py, with_leading_dense_layers
from .llama import TEXT_ONLY
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    Family,
    Rearrangement,
    Unsupported,
    gate_then_up,
    no_trainer_model,
    pairs_from_halves,
    rows_of_each_head,
)

# transformers' save_pretrained writes some of Hy4's names otherwise than the Hub (its renames undone in the wrong
# order, and every gate_proj taken for the attention's linear_gate): the Hub's, which vLLM and the converter read
HUB_NAMES = (
    (r"\.hc_pre\.hc_(attn|mlp)_layer\.hc_(fn|base|scale)$", r".hc_\1_layer.hc_pre.hc_\2"),
    (r"^model\.hc_pre\.hc_head\.", "model.hc_head."),
    (r"\.mlp\.(shared_experts\.)?linear_gate\.", r".mlp.\1gate_proj."),
)
# the converter's renames: the Hub's names without `.weight` with it
RENAMES = (
    (r"\.experts\.down_proj$", ".experts.down_proj.weight"),
    (r"\.learnable_sink_param$", ".learnable_sink_param.weight"),
    (r"\.(hc_head_fn|hc_head_base|hc_head_scale|hc_fn|hc_base|hc_scale)$", r".\1.weight"),
)


def indexer_owners(hparams: dict) -> list[bool]:
    """Which layers own an indexer (indexer_types' `full`); the others (`shared`) reuse the last one's choice."""
    return [kind == "full" for kind in hparams["indexer_types"][: hparams["num_hidden_layers"]]]


def hy_v4_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's HYV4Model's: DeepSeek-V2's (no expert groups: Hy4 routes over all experts; the dense first
    layers by mlp_layer_types), then the sigmoid gating, the routed experts' clamp on every block, the
    hyper-connections' streams, epsilon and magnitude, the indexer's heads, their width, the tokens it keeps and the
    layers that own one."""
    gguf = gguf_py()
    ungrouped = {key: value for key, value in hparams.items() if key not in ("n_group", "topk_group")}
    deepseek2_hyperparameters(writer, with_leading_dense_layers(ungrouped, folder, "hy_v4"), ftype, blocks, folder)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if (limit := float(hparams.get("swiglu_limit") or 0.0)) > 0.0:
        writer.add_swiglu_clamp_exp([limit] * blocks)
    writer.add_hyper_connection_count(hparams["hc_mult"])
    writer.add_hyper_connection_epsilon(hparams["hc_eps"])
    writer.add_hyper_connection_magnitude(hparams["hc_magnitude"])
    writer.add_indexer_head_count(hparams["index_n_heads"])
    writer.add_indexer_key_length(hparams["index_head_dim"])
    writer.add_indexer_top_k(hparams["index_topk"])
    writer.add_indexer_types(indexer_owners(hparams))


# the transformers releases whose built-in Hy4 turns the rotary part by halves (5.17, which added it, to 5.24); 5.25
# turns it by consecutive pairs, as Tencent's own code and llama.cpp do
TURNED_BY_HALVES = ((5, 17), (5, 25))


def saved_by(hparams: dict) -> str:
    """The transformers release the checkpoint's config.json names (what its trainer ran), or '' if it names none."""
    return str(hparams.get("transformers_version") or "")


def turned_by_halves(hparams: dict) -> bool:
    """Whether the checkpoint was trained by a transformers whose Hy4 turns the rotary part by halves: its config saved
    by 5.17-5.24, with no remote code of its own (auto_map). Another (Tencent's release, 5.25 on) turns pairs."""
    release = re.match(r"(\d+)\.(\d+)", saved_by(hparams))
    first, after = TURNED_BY_HALVES
    return bool(release) and not hparams.get("auto_map") and first <= tuple(map(int, release.groups())) < after


def rotated_rows(name: str, hparams: dict) -> int | None:
    """The rows of each head of a tensor whose last qk_rope_head_dim rows feed the rotary part (of q, the latent's
    key, the indexer's q and k: transformers' Hy4 turns them by halves), or None for another tensor."""
    heads = {
        ".self_attn.q_b_proj.weight": hparams["qk_nope_head_dim"] + hparams["qk_rope_head_dim"],
        ".self_attn.kv_a_proj_with_mqa.weight": hparams["kv_lora_rank"] + hparams["qk_rope_head_dim"],
        ".self_attn.indexer.wq_b.weight": hparams["index_head_dim"],
        ".self_attn.indexer.wk.weight": hparams["index_head_dim"],
        ".self_attn.indexer.k_norm.weight": hparams["index_head_dim"],  # (normed before it turns: its weight and bias
        ".self_attn.indexer.k_norm.bias": hparams["index_head_dim"],  # follow the rows)
    }
    return next((rows for end, rows in heads.items() if name.endswith(end)), None)


def hy_v4_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The experts' fused gate_up_proj (experts x gate's and up's rows x hidden) as gate's stack and up's, as the
    converter splits it; kv_b_proj as DeepSeek-V2's. And, for a checkpoint trained by a transformers that turns the
    rotary part by halves (5.17-5.24), its rotary rows in the order llama.cpp's hy_v4 turns them (by consecutive
    pairs: the converter leaves them, and its file would compute another model than the one trained)."""
    if name.endswith(".experts.gate_up_proj"):
        stack, base = (shape[0], shape[1] // 2, shape[2]), name.removesuffix("gate_up_proj")
        return Rearrangement({base + "gate_proj.weight": stack, base + "up_proj.weight": stack}, gate_then_up)
    if turned_by_halves(hparams) and (head_rows := rotated_rows(name, hparams)) is not None:
        rotated = hparams["qk_rope_head_dim"]
        order = pairs_from_halves(head_rows, rotated, head_rows - rotated)
        return Rearrangement({name: shape}, partial(rows_of_each_head, order=order), head_rows)
    return latent_kv(name, shape, hparams, where)


def hy_v4_checked(hparams: dict, where: Path) -> list[str]:
    """What llama.cpp's hy_v4 computes: routing over all experts by a sigmoid, renormalised, an indexer on the first
    layer (none before it to share), SiLU, and DeepSeek-V2's query projection. Another config is one line. The note:
    which way the checkpoint's trainer turned the rotary part, and so whether its rows are reordered."""
    latent_query_checked(hparams, where)
    gating = first_of(hparams, *GATING_KEYS)
    why = None
    if (hparams.get("n_group") or 1) > 1 or (hparams.get("topk_group") or 1) > 1:
        why = "its experts are routed in groups, which llama.cpp's hy_v4 does not read"
    elif gating not in (None, "sigmoid"):
        why = f"the experts' gating function is {gating!r}, and transformers' Hy4 and llama.cpp's route by a sigmoid"
    elif not hparams.get("norm_topk_prob", True):
        why = "norm_topk_prob is off, and llama.cpp's hy_v4 renormalises the experts' weights"
    elif hparams.get("hidden_act", "silu") != "silu":
        why = f"hidden_act is {hparams['hidden_act']!r}, and llama.cpp's hy_v4 runs SiLU"
    elif not indexer_owners(hparams)[0]:
        why = "the first layer's indexer_types is not `full`: it has no layer before it to share an indexer with"
    if why:
        raise ConfigMismatchError(
            f"{where}: {why}: it would compute another model; serve this one with transformers or vLLM"
        )
    trainer = f"transformers {saved_by(hparams)}" if saved_by(hparams) else "no transformers release"
    if turned_by_halves(hparams):
        return [
            f"the config names {trainer}, whose Hy4 turns the rotary part of each head by halves, where llama.cpp's "
            "hy_v4 (after Tencent's code and transformers 5.25 on) turns consecutive pairs: the file's rotary rows are "
            "reordered so llama.cpp computes the model that was trained (the converter's file would compute another)"
        ]
    return [
        f"the config names {trainer}, so the rotary part is taken as turned by consecutive pairs (Tencent's code, "
        "transformers 5.25 on, llama.cpp): its rows are kept as they are, as the converter keeps them (a checkpoint "
        "trained with transformers 5.17-5.24, which turn halves, says so by its config's transformers_version)"
    ]


FAMILIES = (
    Family(
        "Hy4",
        "hy_v4",
        "HYV4ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Hy4 layout (hyper-connections, sparse attention) is not mapped yet"),
        **no_trainer_model("Hy4"),
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=replace(
            DEEPSEEK2,
            arch="HY_V4",
            hyperparameters=hy_v4_hyperparameters,
            check_config=hy_v4_checked,
            rearranged=hy_v4_tensors,
            renames=RENAMES,
            # (the hyper-connections' mixing matrices and the indexer's norm bias, as the converter keeps them)
            kept_in_f32=("hc_attn_fn.", "hc_ffn_fn.", "output_hc_fn.", "indexer.k_norm.bias"),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        hub_renames=HUB_NAMES,
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="hy_v4")},
    ),
)

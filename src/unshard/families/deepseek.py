"""DeepSeek-V3 (and Kimi K2, which is one), DeepSeek-V2 (its router softmax, without the bias), and Youtu-LLM (the
latent attention in a dense Llama, its embeddings tied): multi-latent
attention (queries and keys/values each through a low-rank down projection, a norm and an up projection; a rotary
part carried beside the latent), a few dense layers first, then MoE layers whose router scores experts (V3's by sigmoid
plus a learned bias, `e_score_correction_bias`), in groups, with shared experts beside the routed ones. llama.cpp's
deepseek2 computes the latent attention absorbed: one key-value head (MQA) of the latent's width, kv_b_proj split per
head into k_b and v_b (latent_kv).

The MoE block (router and bias, routed and shared experts, dense first layers) is also GLM-4.5's (glm.py).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigMismatchError
from ..names import megatron_rules as m
from ..names.meta_rules import TORCHTITAN_ROUTED_EXPERTS, AfterTheModel
from .gguf_hooks import gguf_quiet, json_or_empty, rope_parameters, routed_by_sigmoid, text_hyperparameters
from .llama import TEXT_ONLY, TORCHTITAN_COMMON
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MegatronRules,
    Rearrangement,
    Unsupported,
    no_trainer_model,
    one_kv_head,
)

L = m.L
A = "decoder.layers.{i}.self_attention."
MEGATRON_LATENT_ATTENTION = {
    A + "linear_q_proj.weight": L + "self_attn.q_proj.weight",  # (no query down projection: DeepSeek-V2-Lite)
    A + "linear_q_down_proj.weight": L + "self_attn.q_a_proj.weight",
    A + "q_layernorm.weight": L + "self_attn.q_a_layernorm.weight",
    A + "linear_q_up_proj.layer_norm_weight": L + "self_attn.q_a_layernorm.weight",  # (Transformer Engine's fusion)
    A + "linear_q_up_proj.weight": L + "self_attn.q_b_proj.weight",
    A + "linear_kv_down_proj.weight": L + "self_attn.kv_a_proj_with_mqa.weight",
    A + "kv_layernorm.weight": L + "self_attn.kv_a_layernorm.weight",
    A + "linear_kv_up_proj.layer_norm_weight": L + "self_attn.kv_a_layernorm.weight",
    A + "linear_kv_up_proj.weight": L + "self_attn.kv_b_proj.weight",
    A + "linear_proj.weight": L + "self_attn.o_proj.weight",
}
# The norms and embeddings every family shares, without the fused QKV attention.
MEGATRON_COMMON = {k: v for k, v in m.COMMON.items() if ".self_attention." not in k}
MEGATRON_SIGMOID_MOE = {
    **m.DENSE_MLP,  # (the first, dense layers)
    **m.ROUTED_EXPERTS,
    "decoder.layers.{i}.mlp.router.expert_bias": L + "mlp.gate.e_score_correction_bias",
    "decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight": (
        m.GATE_UP,
        L + "mlp.shared_experts.gate_proj.weight",
        L + "mlp.shared_experts.up_proj.weight",
    ),
    "decoder.layers.{i}.mlp.shared_experts.linear_fc2.weight": L + "mlp.shared_experts.down_proj.weight",
}
# DeepSeek-V3's layers (GLM-4.7-Flash's too): latent attention, the MoE block, the MTP layers
MEGATRON_V3 = {**MEGATRON_COMMON, **MEGATRON_LATENT_ATTENTION, **MEGATRON_SIGMOID_MOE, **m.MTP_LAYER}
# DeepSeek-V2's MoE block: V3's without the router's expert bias (its router scores by softmax)
MEGATRON_SOFTMAX_MOE = {k: v for k, v in MEGATRON_SIGMOID_MOE.items() if not k.endswith(".router.expert_bias")}

# torchtitan's DeepSeek-V3 (its DeepSeekV3StateDictAdapter's names): latent attention, the dense first layers'
# feed_forward, the MoE layers' grouped experts, shared experts and the router's bias. Its rotary turns interleaved
# pairs, as DeepSeek's weights keep them (transformers' rope_interleave): no rows are permuted.
T = "layers.{i}."
TORCHTITAN_WITHOUT_MTP = {
    **TORCHTITAN_COMMON,
    T + "attention.wq.weight": (L + "self_attn.q_proj.weight", None),
    T + "attention.wq_a.weight": (L + "self_attn.q_a_proj.weight", None),
    T + "attention.q_norm.weight": (L + "self_attn.q_a_layernorm.weight", None),
    T + "attention.wq_b.weight": (L + "self_attn.q_b_proj.weight", None),
    T + "attention.wkv_a.weight": (L + "self_attn.kv_a_proj_with_mqa.weight", None),
    T + "attention.kv_norm.weight": (L + "self_attn.kv_a_layernorm.weight", None),
    T + "attention.wkv_b.weight": (L + "self_attn.kv_b_proj.weight", None),
    T + "attention.wo.weight": (L + "self_attn.o_proj.weight", None),
    **{
        T + f"feed_forward.{w}.weight": (L + f"mlp.{p}.weight", None)
        for w, p in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))
    },
    **{
        T + f"moe.shared_experts.{w}.weight": (L + f"mlp.shared_experts.{p}.weight", None)
        for w, p in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))
    },
    **TORCHTITAN_ROUTED_EXPERTS,
    T + "moe.expert_bias_E": (L + "mlp.gate.e_score_correction_bias", None),
}
# (its multi-token prediction layers, as its adapter maps them: the layers after the model's, as on the Hub)
TORCHTITAN = {
    **TORCHTITAN_WITHOUT_MTP,
    "mtp_layers.": AfterTheModel("DeepSeek-V3's multi-token prediction layers"),
    **{T + f"{own}.weight": (L + f"{own}.weight", None) for own in ("enorm", "hnorm", "eh_proj")},
    T + "mtp_norm.weight": (L + "shared_head.norm.weight", None),
}


def dense_layers_first(args: dict[str, Any]) -> int:
    """How many dense layers come before the MoE ones (transformers' first_k_dense_replace), from Megatron-LM's
    --moe-layer-freq: 1 (every layer MoE) or a list of 0 (dense) and 1 (MoE) per layer."""
    freq = args.get("moe_layer_freq", 1)
    if freq == 1:
        return 0
    if isinstance(freq, (list, tuple)):
        dense = next((i for i, moe in enumerate(freq) if moe), len(freq))
        if all(freq[dense:]):
            return dense
    raise CheckpointError(
        f"the args' moe_layer_freq {freq!r} puts dense layers after MoE ones, which transformers' DeepSeek-V3 and "
        "GLM-4.5 (dense layers first only) cannot hold"
    )


def _shared_experts_moe_config(args: dict[str, Any]) -> dict[str, Any]:
    """config.json's keys of DeepSeek's MoE block (routed and shared experts, dense first layers, the chosen experts'
    scale), whatever its router, from Megatron-LM's args."""
    width = args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]
    shared = args.get("moe_shared_expert_intermediate_size") or 0
    if shared % width:
        raise CheckpointError(
            f"the args' shared expert width {shared} is not a multiple of the experts' {width}; transformers counts "
            "shared experts of the routed experts' width (n_shared_experts)"
        )
    return {
        "n_routed_experts": args["num_experts"],
        "n_shared_experts": shared // width,
        "moe_intermediate_size": width,
        "num_experts_per_tok": args.get("moe_router_topk", 2),
        "routed_scaling_factor": args.get("moe_router_topk_scaling_factor") or 1.0,
        "first_k_dense_replace": dense_layers_first(args),
    }


def sigmoid_moe_config(args: dict[str, Any]) -> dict[str, Any]:
    """config.json's MoE keys for a sigmoid router with an expert bias (DeepSeek-V3, GLM-4.5), from Megatron-LM's."""
    groups = args.get("moe_router_num_groups") or 1
    return {
        **_shared_experts_moe_config(args),
        # Megatron renormalises the chosen experts' sigmoid scores whenever it picks more than one
        "norm_topk_prob": args.get("moe_router_topk", 2) > 1,
        "n_group": groups,
        "topk_group": args.get("moe_router_group_topk") or groups,
    }


def softmax_moe_config(args: dict[str, Any]) -> dict[str, Any]:
    """config.json's MoE keys for DeepSeek-V2's router, from Megatron-LM's: a softmax over every expert, then the top-k
    (--moe-router-pre-softmax), their weights scaled and not renormalised; in groups, the best groups first, where
    Megatron's rank of a group (the sum of its best topk / group-topk experts) is transformers' (its best one)."""
    topk = args.get("moe_router_topk", 2)
    if not args.get("moe_router_pre_softmax"):
        raise CheckpointError(
            "the args take the top-k experts before the softmax, which renormalises their weights; transformers' "
            "DeepSeek-V2 takes them after it, and would compute another model"
        )
    groups, chosen = args.get("moe_router_num_groups") or 1, args.get("moe_router_group_topk")
    if groups > 1 and chosen and topk // chosen != 1:
        raise CheckpointError(
            f"the args rank {groups} groups of experts by the sum of each one's best {topk // chosen}, transformers' "
            "DeepSeek-V2 by its best one, and would compute another model"
        )
    grouped = groups > 1 and bool(chosen)
    return {
        **_shared_experts_moe_config(args),
        "norm_topk_prob": False,
        "topk_method": "group_limited_greedy" if grouped else "greedy",
        "n_group": groups if grouped else None,
        "topk_group": chosen if grouped else None,
    }


def _rope(args: dict[str, Any]) -> dict[str, Any]:
    """rope_scaling: yarn's, as Megatron's MLA applies it (its default), or none for plain rope."""
    if args.get("rope_type", "yarn") != "yarn":
        return {"rope_scaling": None}
    return {
        "rope_scaling": {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": args.get("rotary_scaling_factor", 40.0),
            "original_max_position_embeddings": args.get("original_max_position_embeddings", 4096),
            "beta_fast": args.get("beta_fast", 32),
            "beta_slow": args.get("beta_slow", 1),
            "mscale": args.get("mscale", 1.0),
            "mscale_all_dim": args.get("mscale_all_dim", 0.0),
        }
    }


def _latent_attention_config(args: dict[str, Any]) -> dict[str, Any]:
    """config.json's keys of the latent attention and its rotary embedding (DeepSeek-V2's and V3's), from
    Megatron-LM's args. (Its rotary pairs interleaved, as DeepSeek's weights keep them and Megatron's MLA reads them:
    V2's rotary always, V3's with rope_interleave.)"""
    rope_dim = args.get("qk_pos_emb_head_dim", 64)
    return {
        "q_lora_rank": args.get("q_lora_rank"),
        "kv_lora_rank": args.get("kv_lora_rank", 512),
        "qk_nope_head_dim": args.get("qk_head_dim", 128),
        "qk_rope_head_dim": rope_dim,
        "v_head_dim": args.get("v_head_dim", 128),
        "head_dim": rope_dim,
        "num_key_value_heads": args["num_attention_heads"],
        "attention_bias": False,
        **_rope(args),
    }


def _config(args: dict[str, Any]) -> dict[str, Any]:
    return {**_latent_attention_config(args), "rope_interleave": True, **sigmoid_moe_config(args)}


def _v2_config(args: dict[str, Any]) -> dict[str, Any]:
    return {**_latent_attention_config(args), **softmax_moe_config(args)}


def _args(config: dict[str, Any]) -> dict[str, Any]:
    """Megatron-LM's args of latent attention and its rotary embedding, from config.json (_config's other way). A
    config megatron-core would compute otherwise is refused: its latent attention reads rotary pairs interleaved and
    has no biases, and its YaRN divides by mscale_all_dim's factor whenever one is given (transformers only where
    mscale is given too)."""
    refused = [
        ("rope_interleave false", not config.get("rope_interleave", True)),
        ("attention_bias true", config.get("attention_bias")),
    ]
    rope = rope_parameters(config)[1]
    kind = rope.get("rope_type") or "default"
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if kind == "yarn":
        refused += [
            ("YaRN's mscale_all_dim without its mscale", mscale_all_dim and not mscale),
            ("YaRN's attention_factor given", rope.get("attention_factor") is not None),
            ("YaRN's truncate false", not rope.get("truncate", True)),
        ]
    elif kind != "default":
        refused.append((f"rope of type {kind!r}", True))
    said = [what for what, bad in refused if bad]
    if said:
        raise CheckpointError(f"the config has {said[0]}, which megatron-core's latent attention cannot compute")
    latent = {
        "multi_latent_attention": True,
        "q_lora_rank": config.get("q_lora_rank"),
        "kv_lora_rank": config["kv_lora_rank"],
        "qk_head_dim": config["qk_nope_head_dim"],
        "qk_pos_emb_head_dim": config["qk_rope_head_dim"],
        "v_head_dim": config["v_head_dim"],
        "kv_channels": config["v_head_dim"],  # (unread by latent attention; DeepSeek's scripts give the values' width)
        "qk_layernorm": True,  # (the latent's norms)
        "rotary_base": rope.get("rope_theta", 10000),
    }
    if kind == "default":  # (megatron-core's latent attention scales its softmax by mscale_all_dim's factor even so)
        return {**latent, "rope_type": "rope", "mscale": 1.0, "mscale_all_dim": 0.0}
    return {
        **latent,
        "rope_type": "yarn",
        "rotary_scaling_factor": rope["factor"],
        "original_max_position_embeddings": rope["original_max_position_embeddings"],
        "beta_fast": rope.get("beta_fast") or 32,
        "beta_slow": rope.get("beta_slow") or 1,
        # (both given, or neither: megatron-core's 1 and 0 then give transformers' factor)
        "mscale": mscale if mscale and mscale_all_dim else 1.0,
        "mscale_all_dim": mscale_all_dim if mscale and mscale_all_dim else 0.0,
    }


def _v2_args(config: dict[str, Any]) -> dict[str, Any]:
    """Megatron-LM's args of DeepSeek-V2 from config.json (_v2_config's other way): the latent attention's, and its
    router's: softmax over every expert before the top-k, the chosen weights scaled; its groups where Megatron ranks
    them as transformers does (by their best expert: one group chosen per expert taken)."""
    topk, groups = config.get("num_experts_per_tok", 2), config.get("n_group") or 1
    grouped = config.get("topk_method", "greedy") == "group_limited_greedy" and groups > 1
    chosen = config.get("topk_group") or groups
    if grouped and topk // chosen != 1:
        raise CheckpointError(
            f"the config ranks {groups} groups of experts by each one's best, and Megatron by the sum of its best "
            f"{topk // chosen} (num_experts_per_tok {topk} over topk_group {chosen}): it would compute another model"
        )
    return {
        **_args(config),
        "moe_router_pre_softmax": True,
        "moe_router_topk_scaling_factor": config.get("routed_scaling_factor") or None,
        "moe_router_num_groups": groups if grouped else None,
        "moe_router_group_topk": chosen if grouped else None,
    }


# the families llama.cpp's deepseek2 runs that route by a sigmoid whatever their config.json says
SIGMOID_ROUTED = ("deepseek_v3", "deepseek_v32", "glm4_moe_lite")


def deepseek2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path, latent: bool = True) -> None:
    """The converter's DeepseekV2Model's: its TextModel's with one key-value head (the latent attention as MQA) and the
    expert groups, then the dense first layers, the latent's ranks and the widths of keys and values (absorbed, and
    as the model has them), the experts' width, count and shared count, the routing's scale and renormalisation, the
    rotary part, YaRN's log multiplier. Some keys are written twice, as the converter does (the second value counts,
    in the first one's place). latent False: DeepSeek-OCR's text model (llama.cpp's deepseek2-ocr), each head its own
    keys and values as the config has them, no latent's widths, and the sliding window its config names."""
    with gguf_quiet():  # (gguf-py warns of each key written again)
        as_mqa = {**hparams, "rms_norm_eps": hparams.get("rms_norm_eps", 1e-6)}
        if latent:
            as_mqa["num_key_value_heads"] = 1
        if hparams.get("model_type") in SIGMOID_ROUTED:
            # transformers' DeepSeek-V3 and GLM-4.7-Flash route by sigmoid and their config.json does not say so (the
            # Hub's DeepSeek-V3 does: scoring_func); llama.cpp's deepseek2 would route such a file by softmax, as
            # DeepSeek-V2 did (but for GLM-4.7-Flash's own sizes, which it recognises)
            as_mqa = routed_by_sigmoid(as_mqa, folder / "config.json")
        text_hyperparameters(writer, as_mqa, ftype, blocks, folder, expert_groups=True)
        dense = hparams.get("first_k_dense_replace")
        if dense is None:  # (no MoE: every layer dense)
            dense = hparams["num_hidden_layers"] if hparams.get("n_routed_experts") is None else 0
        writer.add_leading_dense_block_count(dense)
        writer.add_vocab_size(hparams["vocab_size"])
        if hparams.get("q_lora_rank") is not None:
            writer.add_q_lora_rank(hparams["q_lora_rank"])
        rank, rope = hparams.get("kv_lora_rank", 512), hparams["qk_rope_head_dim"]
        if latent:
            writer.add_kv_lora_rank(rank)
            writer.add_key_length(rank + rope)
            writer.add_value_length(rank)
            writer.add_key_length_mla(hparams["qk_nope_head_dim"] + rope)
            writer.add_value_length_mla(hparams["v_head_dim"])
        writer.add_expert_feed_forward_length(hparams.get("moe_intermediate_size") or hparams["intermediate_size"])
        if hparams.get("n_routed_experts") is not None:
            writer.add_expert_count(hparams["n_routed_experts"])
        writer.add_expert_shared_count(hparams.get("n_shared_experts") or 0)
        if hparams.get("routed_scaling_factor") is not None:
            writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
        if hparams.get("norm_topk_prob"):
            writer.add_expert_weights_norm(True)
        writer.add_rope_dimension_count(rope)
        if not latent and (window := hparams.get("sliding_window_size") or hparams.get("sliding_window")):
            writer.add_sliding_window(window)
        if (mscale := rope_parameters(hparams)[0].get("mscale_all_dim")) is not None:
            writer.add_rope_scaling_yarn_log_mul(0.1 * mscale)


def latent_kv(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """kv_b_proj as llama.cpp's deepseek2 takes it, for its absorbed attention: each head's rows in two tensors, its
    keys' transposed (k_b: the latent's columns by the key's rows) and its values' (v_b), as the converter splits
    them. A band holds whole heads."""
    if not name.endswith("self_attn.kv_b_proj.weight"):
        return None
    heads = hparams["num_attention_heads"]  # (each head its own keys and values from the latent, as transformers)
    keys, values = hparams["qk_nope_head_dim"], hparams["v_head_dim"]
    if shape[0] != heads * (keys + values):
        raise ConfigMismatchError(
            f"{where}: {name} has {shape[0]} rows, not {heads} heads of {keys} key and {values} value rows; pass "
            "--config-from the model's own folder"
        )
    split = {
        name.replace("kv_b_proj", "k_b_proj"): (heads, shape[1], keys),
        name.replace("kv_b_proj", "v_b_proj"): (heads, values, shape[1]),
    }
    return Rearrangement(split, partial(latent_kv_pieces, keys=keys, head_rows=keys + values), keys + values)


def latent_kv_pieces(band, keys: int, head_rows: int) -> tuple:
    heads = band.reshape(-1, head_rows, band.shape[-1])
    return heads[:, :keys].swapaxes(1, 2), heads[:, keys:]


def latent_query_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's deepseek2 loads a model without a query down projection (q_lora_rank null) only as DeepSeek-V2-Lite,
    which it knows by its layers (26 or 27; or 48 of a vocabulary of 128256), and refuses any other."""
    layers = hparams["num_hidden_layers"]
    lite = layers in (26, 27) or (layers == 48 and hparams.get("vocab_size") == 128256)
    if hparams.get("q_lora_rank") is None and not lite:
        raise ConfigMismatchError(
            f"{where}: q_lora_rank is null (no query down projection) in {layers} layers, and llama.cpp's deepseek2 "
            "loads such a model only as DeepSeek-V2-Lite, by its 26 or 27 layers; serve this one with transformers or "
            "vLLM"
        )


def interleaved_rope_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's deepseek2 turns the rotary part by interleaved pairs (transformers' rope_interleave), and the
    converter leaves the rows as they are."""
    latent_query_checked(hparams, where)
    if hparams.get("rope_interleave") is False:
        raise ConfigMismatchError(
            f"{where}: rope_interleave is false (the rotary part turned by halves), and llama.cpp's deepseek2 turns it "
            "by interleaved pairs: it would compute another model; serve this one with transformers or vLLM"
        )


def deepseek_v2_checked(hparams: dict, where: Path) -> None:
    """DeepSeek-V2's routing as llama.cpp's deepseek2 computes it: softmax over all experts (V2-Lite's `greedy`); V2's
    `group_limited_greedy` ranks groups by their best expert, llama.cpp by the sum of their best two (V3's rule)."""
    latent_query_checked(hparams, where)
    if hparams.get("topk_method", "greedy") != "greedy" and (hparams.get("n_group") or 1) > 1:
        raise ConfigMismatchError(
            f"{where}: topk_method is {hparams['topk_method']} in {hparams['n_group']} groups, which ranks groups by "
            "their best expert, and llama.cpp's deepseek2 by the sum of their best two: it would compute another "
            "model; serve this one with transformers or vLLM"
        )


def deepseek32_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's DeepseekV32Model's: DeepSeek-V2's, the MTP layers' count where the config has one, then the
    sparse attention's indexer: its heads, their width, how many tokens it keeps."""
    deepseek2_hyperparameters(writer, hparams, ftype, blocks, folder)
    if hparams.get("num_nextn_predict_layers") is not None:
        writer.add_nextn_predict_layers(hparams["num_nextn_predict_layers"])
    writer.add_indexer_head_count(hparams["index_n_heads"])
    writer.add_indexer_key_length(hparams["index_head_dim"])
    writer.add_indexer_top_k(hparams["index_topk"])


def deepseek32_checked(hparams: dict, where: Path) -> None:
    """DeepSeek-V3's checks; and the converter stops on a DeepSeek-V3.2 whose tokenizer adds no start token, which
    the model needs: one line."""
    interleaved_rope_checked(hparams, where)
    tokenizer_config = where.parent / "tokenizer_config.json"
    if json_or_empty(tokenizer_config).get("add_bos_token") is not True:
        raise ConfigMismatchError(
            f"{tokenizer_config}: add_bos_token is not true, and DeepSeek-V3.2 reads every prompt after "
            "its start token (llama.cpp's converter stops here too); set it to true, as DeepSeek's release has it"
        )


# llama.cpp's deepseek2 (DeepSeek-V3's and V2's): the latent attention absorbed
DEEPSEEK2 = GGUFPart(
    "DEEPSEEK2",
    hyperparameters=deepseek2_hyperparameters,
    vocabulary="bpe",
    rearranged=latent_kv,
    first_kv_heads=one_kv_head,
    check_config=interleaved_rope_checked,
)

FAMILIES = (
    Family(
        "DeepSeek-V3",
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        tensors=NO_TABLE,
        megatron=MegatronRules(
            MEGATRON_V3,
            m.Signature(experts=True, shared_experts=True, sigmoid_router=True, latent_attention=True, qk_norm=None),
            _config,
            _args,
        ),
        meta_names=TORCHTITAN,
        torchtitan_names=TORCHTITAN,
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=DEEPSEEK2,
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={
            "megatron_legacy": "multi-latent attention, dense first layers; MTP layers as the Hub holds them",
            "megatron_dist": "multi-latent attention, dense first layers; MTP layers as the Hub holds them",
            "to_megatron": "multi-latent attention, dense first layers; the Hub's MTP layers as megatron-core's",
            "meta_names": "torchtitan's names; its MTP layers as the Hub holds them",
        },
    ),
    Family(
        "DeepSeek-V3.2",
        "deepseek_v32",
        "DeepseekV32ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's DeepSeek-V3.2 layout (its sparse attention's indexer) is not mapped yet"),
        **no_trainer_model("DeepSeek-V3.2"),
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=replace(
            DEEPSEEK2,
            arch="DEEPSEEK32",
            hyperparameters=deepseek32_hyperparameters,
            check_config=deepseek32_checked,
            extra_blocks="num_nextn_predict_layers",
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="deepseek32")},
    ),
    Family(
        "DeepSeek-V2",
        "deepseek_v2",
        "DeepseekV2ForCausalLM",
        tensors=NO_TABLE,
        megatron=MegatronRules(
            {**MEGATRON_COMMON, **MEGATRON_LATENT_ATTENTION, **MEGATRON_SOFTMAX_MOE},
            m.Signature(experts=True, shared_experts=True, latent_attention=True, qk_norm=None),
            _v2_config,
            _v2_args,
        ),
        **no_trainer_model("DeepSeek-V2"),
        notes={
            path: "its softmax router before the top-k, scaled; expert groups where Megatron ranks them as transformers"
            for path in ("megatron_legacy", "megatron_dist", "to_megatron")
        },
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=replace(DEEPSEEK2, check_config=deepseek_v2_checked),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
    Family(
        "Youtu-LLM",
        "youtu",
        "YoutuForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Youtu-LLM layout (latent attention in a dense model) is not mapped yet"),
        **no_trainer_model("Youtu-LLM"),
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=DEEPSEEK2,  # (every layer dense: no experts' keys, as the converter writes it)
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)

"""MiniMax-01 (MiniMax-Text-01 and MiniMax-M1; transformers' `MiniMaxForCausalLM`): seven layers of lightning
attention (linear attention with a decay per head: q, k and v in one `qkv_proj` through SiLU, the output normed and
gated) to each layer of softmax attention with rope, Mixtral's experts in every layer, residuals
scaled by the config's alpha factors; llama.cpp's minimax-01, as the converter's MiniMaxText01Model writes it (the
decay tables transformers saves and the Hub's checkpoints lack left out, the tokens of the vocabulary's zero rows
suppressed).

MiniMax-M2 (`MiniMaxM2ForCausalLM`): grouped-query attention with q and k each normed over all heads and rotary
embeddings on part of each head (`rotary_dim` on the Hub, transformers' partial_rotary_factor), every layer's MLP as
experts `block_sparse_moe.experts.E.w1/w2/w3` (Mixtral's names) behind a sigmoid router with its correction bias, the
chosen experts' weights renormalised; llama.cpp's minimax-m2 with the experts stacked.

MiniMax-M3 (`MiniMaxM3SparseForConditionalGeneration`): MiniMax-M2's attention, q and k normed per head, with dense
first layers, then experts and shared experts (gpt-oss's clamped SwiGLU in both), those layers' attention block-sparse
(MiniMax Sparse Attention: an indexer scores blocks of keys, each query attends to the best few and its own), Gemma's
norms (1 + weight); beside a vision tower. Its text model as llama.cpp's minimax-m3, which PyPI's gguf-py 0.19
lacks; the tower (Qwen2-VL's two-frame patches, CLIP's layers, rope over time, height and width on part of each head)
and its two projectors (each patch to the text model's width, then 2 x 2 of them into one token) as the mmproj file of
llama.cpp's minimaxm3 projector."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import (
    fixed_in_code,
    mmproj_model_forced_type,
    rope_parameters,
    routed_by_sigmoid,
    text_hyperparameters,
)
from .llama import TEXT_ONLY
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    Family,
    GGUFPart,
    MmprojPart,
    Rearrangement,
    Unsupported,
    no_trainer_model,
    rows_of_each_head,
)
from .vlm import frames

# The indexer's sizes by transformers' names, and the Hub's within sparse_attention_config (which the converter reads)
INDEXER = {
    "index_n_heads": "sparse_num_index_heads",
    "index_head_dim": "sparse_index_dim",
    "index_topk_blocks": "sparse_topk_blocks",
    "index_block_size": "sparse_block_size",
    "index_local_blocks": "sparse_local_block",
}
# gpt-oss's SwiGLU as llama.cpp's minimax-m3 computes it (constants in its code): the sigmoid's gain, the clamp
LLAMA_CPP_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}


# MiniMax-01's residual factors by transformers' keys, each with the Hub's (which the converter reads)
RESIDUAL_FACTORS = {
    "full_attn_alpha_factor": "layernorm_full_attention_alpha",
    "linear_attn_alpha_factor": "layernorm_linear_attention_alpha",
    "mlp_alpha_factor": "layernorm_mlp_alpha",
    "full_attn_beta_factor": "layernorm_full_attention_beta",
    "linear_attn_beta_factor": "layernorm_linear_attention_beta",
    "mlp_beta_factor": "layernorm_mlp_beta",
}
LIGHTNING_NORM_EPS = 1e-6  # (transformers' MiniMaxLightningAttention's norm's, whatever the config says)
SOFTMAX_EVERY = 8  # (llama.cpp's minimax-01: every eighth layer softmax attention, the others lightning)


def residual_factors(hparams: dict) -> dict[str, float]:
    """The six residual factors by the Hub's keys: the Hub's value where the config has it, else transformers'."""
    return {hub: hparams.get(hub, hparams.get(key, 1)) for key, hub in RESIDUAL_FACTORS.items()}


def rotated_width(hparams: dict) -> int:
    """The rotated part of a head: the Hub's rotary_dim, else transformers' partial_rotary_factor of a head."""
    if hparams.get("rotary_dim") is not None:
        return hparams["rotary_dim"]
    head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    return int(head * rope_parameters(hparams)[0].get("partial_rotary_factor", 1.0))


def minimax01_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MiniMaxText01Model's: the TextModel's, the tokens of the embedding's zero rows suppressed (the
    plan finds them: GGUFPart.suppresses_zero_embeddings), the residuals' factor, the rotated part of a head."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    if hparams.get("zero_embedding_tokens"):
        writer.add_array("tokenizer.ggml.suppress_tokens", hparams["zero_embedding_tokens"])
    writer.add_residual_scale(residual_factors(hparams)["layernorm_full_attention_alpha"])
    writer.add_rope_dimension_count(rotated_width(hparams))


def minimax01_checked(hparams: dict, where: Path) -> list[str]:
    """What llama.cpp's minimax-01 computes whatever the file says: one factor on every residual and none on the
    branches (the converter asserts as much), every eighth layer softmax attention, SiLU. Another config is one line.
    The notes: transformers norms the lightning attention's output at its own epsilon, llama.cpp at the config's; and
    turns rope on the whole head, where the config may say part of it."""
    factors = residual_factors(hparams)
    alphas = {factors[key] for key in ("layernorm_full_attention_alpha", "layernorm_linear_attention_alpha")}
    alphas.add(factors["layernorm_mlp_alpha"])
    betas = {factors[hub] for key, hub in RESIDUAL_FACTORS.items() if "beta" in key}
    if "attn_type_list" in hparams:  # (the Hub's: 0 for lightning attention)
        lightning = [kind == 0 for kind in hparams["attn_type_list"]]
    else:  # (none said: llama.cpp's own layout)
        kinds = hparams.get("layer_types") or []
        lightning = [kind == "linear_attention" for kind in kinds]
    why = None
    if len(alphas) > 1 or betas != {1}:
        why = (
            f"the residual factors are {factors}, and llama.cpp's minimax-01 scales every residual by one factor and "
            "adds the branches unscaled"
        )
    elif lightning != [(i + 1) % SOFTMAX_EVERY != 0 for i in range(len(lightning))]:
        why = (
            f"the layers' attention is {['lightning' if kind else 'softmax' for kind in lightning]}, and llama.cpp's "
            f"minimax-01 makes every {SOFTMAX_EVERY}th layer softmax attention and the others lightning attention"
        )
    elif hparams.get("hidden_act", "silu") != "silu":
        why = f"the activation is {hparams['hidden_act']!r}, and llama.cpp's minimax-01 runs SiLU"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: it would compute another model; serve this one with transformers")
    notes = []
    eps = hparams.get("rms_norm_eps")
    if eps is not None and eps != LIGHTNING_NORM_EPS:
        notes.append(
            f"llama.cpp norms the lightning attention's output at the config's rms_norm_eps ({eps}), where "
            f"transformers norms it at {LIGHTNING_NORM_EPS}: its logits differ slightly from transformers'"
        )
    head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    if rotated_width(hparams) < head:
        notes.append(
            f"rope turns {rotated_width(hparams)} of each head's {head} dimensions, as the config says and MiniMax's "
            "release computes; transformers 5's MiniMax turns the whole head whatever the config says, so llama.cpp's "
            "logits differ from transformers'"
        )
    return notes


def minimax_m2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MiniMaxM2Model's: the TextModel's (sigmoid gating, which transformers' model routes by
    whatever the config says), then the experts' width and the rotated part of a head."""
    text_hyperparameters(writer, routed_by_sigmoid(hparams, folder / "config.json"), ftype, blocks, folder, True)
    writer.add_expert_feed_forward_length(hparams["intermediate_size"])
    rotated = hparams.get("rotary_dim")
    if rotated is None:
        head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
        rotated = int(head * rope_parameters(hparams)[0].get("partial_rotary_factor", 1.0))
    writer.add_rope_dimension_count(rotated)


def indexer_sizes(hparams: dict) -> dict:
    """The indexer's sizes by transformers' names: the Hub's sparse_attention_config where the config has it."""
    hub = hparams.get("sparse_attention_config") or {}
    return {key: hub.get(name, hparams.get(key)) for key, name in INDEXER.items()}


def dense_first(hparams: dict) -> list[bool]:
    """Which layers are dense, by the Hub's moe_layer_freq or transformers' mlp_layer_types."""
    if hparams.get("moe_layer_freq") is not None:
        return [not sparse for sparse in hparams["moe_layer_freq"]]
    return [kind == "dense" for kind in hparams.get("mlp_layer_types") or ["sparse"] * hparams["num_hidden_layers"]]


def shared_experts(hparams: dict) -> int:
    """The shared experts' count: the Hub's n_shared_experts, else transformers' width of them in experts' widths."""
    if hparams.get("n_shared_experts") is not None:
        return int(hparams["n_shared_experts"])
    return hparams["shared_intermediate_size"] // hparams["intermediate_size"]


def minimax_m3_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MiniMaxM3Model's: MiniMax-M2's, then the shared experts' count, the routing's scale and its
    renormalisation, the indexer's heads, their width, the blocks each query keeps, a block's tokens and the blocks
    before a query always kept, and the dense first layers."""
    minimax_m2_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_expert_shared_count(shared_experts(hparams))
    writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
    writer.add_expert_weights_norm(True)
    sizes = indexer_sizes(hparams)
    writer.add_indexer_head_count(sizes["index_n_heads"])
    writer.add_indexer_key_length(sizes["index_head_dim"])
    writer.add_indexer_top_k(sizes["index_topk_blocks"])
    writer.add_indexer_block_size(sizes["index_block_size"])
    writer.add_indexer_local_blocks(sizes["index_local_blocks"])
    dense = dense_first(hparams)
    writer.add_leading_dense_block_count(dense.index(False) if False in dense else len(dense))


def minimax_m3_checked(hparams: dict, where: Path) -> list[str]:
    """What llama.cpp's minimax-m3 computes: gpt-oss's SwiGLU constants, dense layers first only, block-sparse
    attention on every layer with experts and on no other, one indexer head per key-value head, rope on the part of a
    head rotary_dim says (the converter's) and transformers turns, shared experts as wide as experts. Another config
    is one line. The note: llama.cpp's sparse attention needs flash attention."""
    dense = dense_first(hparams)
    lead = dense.index(False) if False in dense else len(dense)
    sparse = [kind == "minimax_m3_sparse" for kind in hparams.get("layer_types") or [False] * len(dense)]
    sizes = indexer_sizes(hparams)
    head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    turned = int(head * rope_parameters(hparams)[0].get("partial_rotary_factor", 1.0))
    width = hparams.get("shared_intermediate_size")
    why = None
    if any(hparams.get(key, value) != value for key, value in LLAMA_CPP_SWIGLU.items()):
        why = f"the SwiGLU's swiglu_alpha and swiglu_limit are not {LLAMA_CPP_SWIGLU}, which llama.cpp fixes"
    elif any(dense[lead:]):
        why = "a dense layer follows a layer with experts, and llama.cpp's minimax-m3 has dense layers first only"
    elif "sparse_attention_config" not in hparams and sparse != [not d for d in dense]:
        why = "layer_types' sparse layers are not those with experts, the only ones llama.cpp's minimax-m3 sparsifies"
    elif sizes["index_n_heads"] != hparams["num_key_value_heads"]:
        why = "index_n_heads is not num_key_value_heads: llama.cpp's minimax-m3 has one indexer head per key-value head"
    elif hparams.get("rotary_dim") is not None and hparams["rotary_dim"] != turned:
        why = (
            f"rotary_dim is {hparams['rotary_dim']} and transformers turns {turned} dimensions of a head (its "
            "partial_rotary_factor): the converter writes the first"
        )
    elif width is not None and width != shared_experts(hparams) * hparams["intermediate_size"]:
        why = "shared_intermediate_size is not a whole number of experts' widths, as llama.cpp's minimax-m3 sizes it"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: it would compute another model; serve this one with transformers")
    reach = sizes["index_topk_blocks"] * sizes["index_block_size"]
    return [
        "llama.cpp's minimax-m3 runs the sparse attention only with flash attention on (-fa on); without it every "
        f"query attends to every key, which differs from transformers past {reach} tokens"
    ]


def minimax_m3_vision_sizes(vision: dict, where: Path) -> dict:
    """The tower as the converter reads it (transformers' names), refusing what llama.cpp's minimaxm3 computes
    otherwise: rope at a base of 10000, GELU (erf) in the tower's MLPs, patches two frames deep, heads of an even
    width."""
    runs = {
        "rope_theta": ((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0), 10000.0),
        "hidden_act": (vision.get("hidden_act", "gelu"), "gelu"),
        "temporal_patch_size": (vision.get("temporal_patch_size", 2), 2),
    }
    fixed_in_code(where, "vision", "minimaxm3 projector", runs)
    width, heads = vision.get("hidden_size"), vision.get("num_attention_heads")
    if width and heads and (width // heads) % 2:
        raise ConfigMismatchError(
            f"{where}: the vision tower's heads are {width // heads} wide, "
            "odd, and llama.cpp's minimaxm3 projector sizes their rope's axes otherwise than transformers then; "
            "serve this model with transformers or vLLM"
        )
    return vision


def minimax_m3_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """GELU, the tower's norms' epsilon, the patches merged into a token per side: transformers' spatial_merge_size
    (the converter reads the Hub's img_token_compression_config, else 2)."""
    writer.add_vision_use_gelu(True)
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-5))
    hub = vision.get("img_token_compression_config") or {}
    writer.add_vision_spatial_merge_size(int(vision.get("spatial_merge_size", hub.get("spatial_merge_size", 2))))


def axes_apart(rows: int) -> tuple[int, ...]:
    """The order of a head's `rows` of q or k that puts its rotary rows as llama.cpp's minimaxm3 turns them:
    transformers holds [time, height, width] of the first half of each pair, then the same of the second; llama.cpp
    turns each axis by halves of its own, so [time's two halves, height's, width's], then the rows rope leaves as
    they are."""
    axis = 2 * ((rows // 3) // 2)  # (the rotated rows of an axis, as both compute them)
    half, third = 3 * axis // 2, axis // 2
    order = [j for a in range(3) for start in (a * third, half + a * third) for j in range(start, start + third)]
    return (*order, *range(3 * axis, rows))


def minimax_m3_vision_split(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """The converter's: the Conv3D patch embedding as one 2-D convolution per frame; the tower's q and k (weights and
    biases) with each head's rotary rows reordered by axis (axes_apart)."""
    if name.endswith("embeddings.patch_embedding.weight") and len(shape) == 5:
        frame = (shape[0], shape[1], *shape[3:])
        return Rearrangement({"v.patch_embd.weight": frame, "v.patch_embd.weight.1": frame}, frames)
    if name.startswith("vision_tower.") and (".self_attn.q_proj." in name or ".self_attn.k_proj." in name):
        order = axes_apart(shape[0] // vision["num_attention_heads"])
        return Rearrangement({name: shape}, partial(rows_of_each_head, order=order), shape[0])
    return None


MINIMAX_M3_MMPROJ = MmprojPart(
    "MINIMAXM3",
    r"^(?:model\.)?(?:vision_tower|multi_modal_projector|patch_merge_mlp)\.",
    minimax_m3_vision_sizes,
    minimax_m3_projector_keys,
    forced_type=mmproj_model_forced_type,
    rearranged=minimax_m3_vision_split,
)


FAMILIES = (
    Family(
        "MiniMax-01",
        "minimax",
        "MiniMaxForCausalLM",
        also=("MiniMaxText01ForCausalLM", "MiniMaxM1ForCausalLM"),  # (the Hub's classes, their own code's)
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's MiniMax-01 layout (lightning attention) is not mapped yet"),
        **no_trainer_model("MiniMax-01"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"), ("w1", "w3")),
        gguf=GGUFPart(
            "MINIMAX01",
            hyperparameters=minimax01_hyperparameters,
            check_config=minimax01_checked,
            skipped=(
                (
                    r"\.self_attn\.(slope_rate|query_decay|key_decay|diagonal_decay)$",
                    "buffers transformers computes from the config left out (the Hub's checkpoints lack them, and "
                    "llama.cpp computes them too)",
                ),
            ),
            suppresses_zero_embeddings=True,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="minimax-01")},
    ),
    Family(
        "MiniMax-M2",
        "minimax_m2",
        "MiniMaxM2ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's MiniMax-M2 layout is not mapped yet"),
        **no_trainer_model("MiniMax-M2"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"), ("w1", "w3")),
        gguf=GGUFPart("MINIMAXM2", hyperparameters=minimax_m2_hyperparameters),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
    Family(
        "MiniMax-M3",
        "minimax_m3_vl",
        "MiniMaxM3SparseForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's MiniMax-M3 layout (block-sparse attention, a vision tower) is not mapped yet"),
        **no_trainer_model("MiniMax-M3"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"), ("w1", "w3")),
        gguf=GGUFPart(
            "MINIMAXM3",
            hyperparameters=minimax_m3_hyperparameters,
            check_config=minimax_m3_checked,
            norm_shift=1.0,
            kept_in_f32=(".indexer.",),
        ),
        mmproj=MINIMAX_M3_MMPROJ,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="minimax-m3")},
    ),
)

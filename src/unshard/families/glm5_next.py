"""GLM-5-Next (Z.ai's GLM-5.3-Flash, `Glm5NextForConditionalGeneration`): Kimi Delta Attention layers (a short
convolution on each of q, k and v, a recurrent state per head, a low-rank forget gate with a lower bound) between
DeepSeek's latent attention layers without rotary embeddings, whose sparse attention's indexer scores pools of keys
(each pool's keys gated and given a learned position, the last, incomplete pool kept); the residual stream kept as
four, mixed by hyper-connections (mHC: Sinkhorn-normalised) and averaged before the final norm; dense first layers,
then DeepSeek-V3's experts behind a sigmoid router with its correction bias, a shared expert, SwiGLU clamped. Its text
model is llama.cpp's glm5-next (which PyPI's gguf-py 0.19 lacks), written as the converter writes it: the delta
attention's kernels as Kimi Linear's (kimi_linear.py), kv_b_proj split as DeepSeek-V3's, the hyper-connections' and the
pools' parameters named as weights and kept in F32. The converter reads the Hub's config (the delta attention's sizes
in `linear_attn_config`, `mla_use_nope`, `first_k_dense_replace`), which transformers 5 saves otherwise: unshard reads
either. Its vision tower, GLM-4.1V's (glm.py) with q and k RMS-normed per head, no norm after the patch embedding,
no learned positions and its SwiGLU clamped, goes in the mmproj file of llama.cpp's glm5v projector."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_quiet, text_hyperparameters, with_leading_dense_layers
from .glm import GLM4V_MMPROJ, GLM_SPECIAL_TOKENS, glm4v_projector_keys, glm4v_sizes
from .kimi_linear import kimi_linear_tensors
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    Family,
    GGUFPart,
    Unsupported,
    no_trainer_model,
)

LINEAR = "linear_attention"
# transformers' names of the delta attention's sizes, by the Hub's within linear_attn_config
LINEAR_SIZES = (
    ("head_dim", "linear_head_dim"),
    ("num_heads", "linear_num_heads"),
    ("short_conv_kernel_size", "linear_conv_kernel_dim"),
    ("gate_lower_bound", "linear_lower_bound"),
)
# the epsilon llama.cpp's glm5-next reads for the delta attention's l2 norms, which the converter writes as it is
L2_NORM_EPS = 1e-6
HYPER_CONNECTIONS = 4  # (the only count llama.cpp's glm5-next runs)


def glm5_next_as_the_converter_reads(hparams: dict, where: Path) -> dict:
    """The config as the Hub's release names it, which the converter reads: the delta attention's sizes within
    linear_attn_config, the latent attention named rope-less (mla_use_nope), the dense first layers as
    first_k_dense_replace (from transformers' mlp_layer_types: dense layers first only); head_dim, which the converter
    drops, dropped. A config already in the Hub's form is read as it is."""
    read = dict(hparams)
    if "linear_attn_config" not in read:
        read["linear_attn_config"] = {hub: read.get(ours) for hub, ours in LINEAR_SIZES}
    read.setdefault("mla_use_nope", not read.get("qk_rope_head_dim"))
    if "first_k_dense_replace" not in read:
        read = with_leading_dense_layers(read, where, "glm5-next")
    read.pop("head_dim", None)
    return read


def glm5_next_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's glm5-next runs, and the converter asserts: four hyper-connection streams, the delta attention's
    heads the latent attention's, no rotary part, pools of keys that divide the tokens kept, the routing of
    transformers' (a sigmoid, without groups), an indexer of its own on the first latent layer."""
    linear = hparams["linear_attn_config"]
    heads = hparams["num_attention_heads"]
    kpool, topk = hparams.get("index_kpool") or 0, hparams["index_topk"]
    indexed = [i for i, kind in enumerate(hparams["layer_types"]) if kind != LINEAR]
    owners = hparams.get("indexer_types") or ["full"] * hparams["num_hidden_layers"]
    why = None
    if hparams.get("hc_mult") != HYPER_CONNECTIONS or not hparams.get("mhc", True):
        why = f"hc_mult is {hparams.get('hc_mult')}, and llama.cpp's glm5-next runs {HYPER_CONNECTIONS} streams"
    elif linear.get("num_heads") != heads:
        why = f"its delta attention has {linear.get('num_heads')} heads, and llama.cpp's glm5-next gives it {heads}"
    elif hparams.get("qk_rope_head_dim") or not hparams.get("mla_use_nope", True):
        why = "its latent attention turns a rotary part, and llama.cpp's glm5-next has none"
    elif kpool < 2 or topk % kpool:
        why = f"index_kpool {kpool} does not divide index_topk {topk} in pools of 2 or more, as llama.cpp needs"
    elif (hparams.get("n_group") or 1) > 1 or (hparams.get("topk_group") or 1) > 1:
        why = "its experts are routed in groups, which llama.cpp's glm5-next does not read"
    elif hparams.get("hidden_act", "silu") != "silu":
        why = f"hidden_act is {hparams['hidden_act']!r}, and llama.cpp's glm5-next runs SiLU"
    elif indexed and owners[indexed[0]] != "full":
        why = "the first latent layer's indexer_types is not `full`: it has no layer before it to share an indexer with"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: it would compute another model; serve this one with transformers")


def glm5_next_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Glm5NextModel's, in its order: its TextModel's, which layers are recurrent (0 key-value heads;
    the MTP layers' 1), the vocabulary's size, the l2 norms' epsilon, the MTP layers' count where the config has some,
    the delta attention's kernel, head width and gate bound, the latent's ranks and widths, the indexer's heads, width,
    tokens kept, pools and layers, the hyper-connections' streams, iterations and epsilon, then the experts'."""
    linear = hparams["linear_attn_config"]
    kinds = hparams["layer_types"][: hparams["num_hidden_layers"]]
    with gguf_quiet():  # (the key-value heads written again, as the converter does: in the first one's place)
        text_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=True)
        writer.add_head_count_kv([0 if kind == LINEAR else 1 for kind in kinds] + [1] * (blocks - len(kinds)))
    writer.add_vocab_size(hparams["vocab_size"])
    writer.add_layer_norm_eps(L2_NORM_EPS)
    if blocks > len(kinds):
        writer.add_nextn_predict_layers(blocks - len(kinds))
    writer.add_ssm_conv_kernel(linear["short_conv_kernel_size"])
    writer.add_kda_head_dim(linear["head_dim"])
    if linear.get("gate_lower_bound") is not None:
        writer.add_kda_gate_lower_bound(linear["gate_lower_bound"])
    rank = hparams["kv_lora_rank"]
    writer.add_q_lora_rank(hparams["q_lora_rank"])
    writer.add_kv_lora_rank(rank)
    writer.add_rope_dimension_count(0)
    writer.add_key_length(rank)
    writer.add_value_length(rank)
    writer.add_key_length_mla(hparams["qk_nope_head_dim"])
    writer.add_value_length_mla(hparams["v_head_dim"])
    writer.add_indexer_head_count(hparams["index_n_heads"])
    writer.add_indexer_key_length(hparams["index_head_dim"])
    writer.add_indexer_top_k(hparams["index_topk"])
    writer.add_indexer_kpool(hparams["index_kpool"])
    writer.add_indexer_kpool_select_tail(hparams.get("index_kpool_always_select_tail", True))
    if hparams.get("indexer_types") is not None:
        writer.add_indexer_types([kind == "full" for kind in hparams["indexer_types"]])
    writer.add_hyper_connection_count(hparams["hc_mult"])
    writer.add_hyper_connection_sinkhorn_iterations(hparams["hc_sinkhorn_iters"])
    writer.add_hyper_connection_epsilon(hparams["hc_eps"])
    writer.add_leading_dense_block_count(hparams["first_k_dense_replace"])
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_expert_shared_count(hparams["n_shared_experts"])
    writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
    writer.add_expert_weights_norm(hparams["norm_topk_prob"])
    if (limit := hparams.get("swiglu_limit")) is not None:
        writer.add_swiglu_clamp_exp([limit] * blocks)
        writer.add_swiglu_clamp_shexp([limit] * blocks)


def first_layer_kv_heads(hparams: dict) -> int:
    """GGUFPart.first_kv_heads: the first layer's in the file (0 for a recurrent layer, 1 for latent attention as
    MQA), which llama-quantize's mixes choose by."""
    return 0 if hparams["layer_types"][0] == LINEAR else 1


GLM5_NEXT_GGUF = GGUFPart(
    "GLM5_NEXT",
    hyperparameters=glm5_next_hyperparameters,
    check_config=glm5_next_checked,
    as_the_converter_reads=glm5_next_as_the_converter_reads,
    vocabulary="bpe",
    special_tokens=GLM_SPECIAL_TOKENS,
    rearranged=kimi_linear_tensors,
    renames=(
        (r"\.dt_bias$", ".dt_proj.bias"),
        # (the converter's: the Hub's names without `.weight` with it)
        (r"\.(hc_(?:attn|ffn)_(?:fn|base|scale)|index_kpool_compress_(?:ape|gate))$", r".\1.weight"),
    ),
    first_kv_heads=first_layer_kv_heads,
    extra_blocks="num_nextn_predict_layers",
    # (the hyper-connections' mixing matrices and the pools' parameters, as the converter keeps them exact; what
    # llama-quantize leaves, and quantizes to Q8_0 at least, for glm5-next)
    kept_in_f32=("hc_attn_", "hc_ffn_", "indexer_compressor_"),
    left_by_llama_quantize=(
        "hc_",
        "indexer.attn_q_b",
        "indexer.attn_k",
        "indexer.proj",
        "indexer_compressor_",
        "ssm_f_a.weight",
        "ssm_f_b.weight",
        "ssm_g_a.weight",
        "ssm_g_b.weight",
        "ssm_beta.weight",
        "attn_kv_a_mqa.weight",
        "attn_k_b.weight",
        "attn_v_b.weight",
    ),
    q8_0_or_more=("attn_q_a", "attn_q_b", "nextn.eh_proj"),
)


def glm5v_sizes(vision: dict, where: Path) -> dict:
    """GLM-4.1V's, and what llama.cpp's glm5v takes otherwise: SiLU alone (its SwiGLU, clamped)."""
    if vision.get("hidden_act", "silu") != "silu":
        raise ConfigMismatchError(
            f"{where}: vision_config's hidden_act is {vision['hidden_act']!r}, and llama.cpp's glm5v runs SiLU: it "
            "would compute other image features; serve this model with transformers or vLLM"
        )
    return glm4v_sizes(vision, where)


def glm5v_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The converter's Glm5NextVisionModel's: GLM-4.1V's, the patches merged, the SwiGLU's clamp, and the image
    processor's least and most tokens as pixels of one frame, where it names them."""
    glm4v_projector_keys(writer, hparams, vision, processor)
    writer.add_vision_spatial_merge_size(int(vision.get("spatial_merge_size", 2)))
    if vision.get("swiglu_limit") is not None:
        writer.add_vision_swiglu_clamp(float(vision["swiglu_limit"]))
    pixels = (int(processor.get("patch_size", 14)) * int(processor.get("merge_size", 2))) ** 2
    if processor.get("min_image_tokens") is not None:
        writer.add_vision_min_pixels(int(processor["min_image_tokens"]) * pixels)
    if processor.get("max_image_tokens") is not None:
        writer.add_vision_max_pixels(int(processor["max_image_tokens"]) * pixels)


GLM5V_MMPROJ = replace(GLM4V_MMPROJ, projector="GLM5V", sizes=glm5v_sizes, projector_keys=glm5v_projector_keys)

FAMILIES = (
    Family(
        "GLM-5-Next",
        "glm5_next",
        "Glm5NextForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's GLM-5-Next layout (delta attention, hyper-connections) is not mapped yet"),
        **no_trainer_model("GLM-5-Next"),
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=GLM5_NEXT_GGUF,
        mmproj=GLM5V_MMPROJ,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="glm5-next")},
    ),
)

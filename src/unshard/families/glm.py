"""GLM-4 (`Glm4ForCausalLM`, GLM-4-0414): grouped-query attention with q/k/v biases and rotary embeddings on half of
each head (GPT-J's pairs, as llama.cpp turns them), norms after attention and after the MLP, gate and up fused in one
tensor; llama.cpp's glm4.

GLM (`GlmForCausalLM`, GLM-4-9B-chat-hf): GLM-4's layout without the norms after attention and the MLP; llama.cpp's
chatglm, whose header the converter writes from ChatGLM's own keys (its rope base 10000 times `rope_ratio`).

GLM-4.5 and GLM-4.6 (`Glm4MoeForCausalLM`): grouped-query attention with q/k/v biases, optional q/k norms and
rotary embeddings on part of each head, then DeepSeek-V3's MoE block (deepseek.py): dense first layers, a sigmoid
router with an expert bias, routed and shared experts; llama.cpp's glm4moe, whose file has room for the MTP layers
the config counts (llama.cpp loads a file without them: a trained checkpoint has none, as transformers drops them).

GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`): DeepSeek-V3's latent attention and MoE block with GLM's vocabulary and an MTP
layer; llama.cpp's deepseek2 as for DeepSeek-V3, with room for the MTP layers as for GLM-4.5.

GLM-4.1V (`Glm4vForConditionalGeneration`): GLM-4's text model with M-RoPE (the head's rotary half by time, height
and width), which llama.cpp computes in NeoX's halves: q's and k's rotary rows reordered so, as the converter does; a
tower of Qwen2-VL's patches with learned positions, merged 2 x 2 by a convolution into a SwiGLU projector, as the
mmproj file of llama.cpp's glm4v.

Solar Open (`SolarOpenForCausalLM`, Upstage's): GLM-4.5's MoE block in every layer, without q and k norms, rotary
over whole heads; llama.cpp's glm4moe with Solar Open's special tokens, as the converter writes it."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, ConfigMismatchError
from ..names import megatron_rules as m
from .deepseek import (
    MEGATRON_SIGMOID_MOE,
    MEGATRON_V3,
    deepseek2_hyperparameters,
    latent_kv,
    latent_query_checked,
    sigmoid_moe_config,
)
from .gguf_hooks import (
    GATING_KEYS,
    first_of,
    gguf_py,
    gguf_quiet,
    mmproj_model_forced_type,
    rope_parameters,
    text_hyperparameters,
    with_leading_dense_layers,
)
from .llama import TEXT_ONLY
from .parts import (
    DEFAULT_FUSED_SIBLINGS,
    NO_META_NAMES,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MegatronRules,
    MmprojPart,
    Rearrangement,
    Unsupported,
    multimodal_family,
    no_trainer_model,
    one_kv_head,
)
from .vlm import MEGATRON, NO_MOE, qwen2vl_sizes, qwen3vl_vision_name, qwen3vl_vision_split


def _config(args: dict[str, Any]) -> dict[str, Any]:
    return {
        "attention_bias": True,
        "use_qk_norm": bool(args.get("qk_layernorm")),
        "partial_rotary_factor": args.get("rotary_percent", 1.0),
        # (the folder has no MTP layers, as the reader leaves them out; said, as transformers 5 would count one)
        "num_nextn_predict_layers": 0,
        **sigmoid_moe_config(args),
    }


def _solar_open_config(args: dict[str, Any]) -> dict[str, Any]:
    """Solar Open's config.json keys from Megatron-LM's args: GLM-4.5's MoE block in every layer (its config has no
    dense first layers), Llama's attention (no biases, no q/k norms: its signature), rotary over whole heads."""
    moe = sigmoid_moe_config(args)
    if moe.pop("first_k_dense_replace"):
        raise CheckpointError(
            f"the args' moe_layer_freq {args.get('moe_layer_freq')!r} has dense layers, which transformers' Solar Open "
            "(experts in every layer) cannot hold"
        )
    return {"attention_bias": False, "partial_rotary_factor": 1.0, **moe}


# the special tokens the converter's GLM-4 vocabulary sets by their text (over tokenizer_config.json's), in its order
GLM4_SPECIAL_TOKENS = (
    ("eos", "<|endoftext|>"),
    ("eot", "<|user|>"),
    ("unk", "<|endoftext|>"),
    ("bos", "<|endoftext|>"),
)


def glm4_hyperparameters(
    writer, hparams: dict, ftype, blocks: int, folder: Path, expert_groups: bool = False, rotated: float = 0.5
) -> None:
    """The converter's Glm4Model's: its TextModel's, then the rotary part of a head (`rotated` where the config says
    nothing: GLM's half)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=expert_groups)
    head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    writer.add_rope_dimension_count(int(head * rope_parameters(hparams)[0].get("partial_rotary_factor", rotated)))


def chatglm_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's ChatGLMModel's, its own: the context as ChatGLM's `seq_length` says, else the embedding's width
    (as it does); the widths, blocks and heads; the norms' epsilon as ChatGLM's `layernorm_epsilon` says, else 1e-5;
    the rotary part of a head (half where the config says nothing), no BOS added, the rope base 10000 times
    `rope_ratio`."""
    width, heads = hparams["hidden_size"], hparams["num_attention_heads"]
    writer.add_context_length(hparams.get("seq_length", width))
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(hparams.get("ffn_hidden_size", hparams.get("intermediate_size", 4 * width)))
    writer.add_block_count(blocks)
    writer.add_head_count(heads)
    writer.add_head_count_kv(hparams.get("multi_query_group_num", hparams.get("num_key_value_heads", heads)))
    writer.add_layer_norm_rms_eps(hparams.get("layernorm_epsilon", 1e-5))
    writer.add_file_type(ftype)
    rotated = rope_parameters(hparams)[0].get("partial_rotary_factor", 0.5)
    writer.add_rope_dimension_count(int(hparams.get("attention_dim", width // heads) * rotated))
    writer.add_add_bos_token(False)
    writer.add_rope_freq_base(10000 * hparams.get("rope_ratio", 1))


def chatglm_checked(hparams: dict, where: Path) -> list[str]:
    """GLM as llama.cpp's chatglm computes it: heads of the embedding's share (the converter writes no head width),
    plain rope at the base the converter writes (10000 times `rope_ratio`, whatever rope_theta says). Its norms'
    epsilon, which the converter takes from ChatGLM's `layernorm_epsilon` alone (else 1e-5), is noted where
    transformers' differs: GLM-4-9B-chat-hf's 1.5625e-07 against 1e-5 changes little but small activations."""
    heads, rope = hparams["hidden_size"] // hparams["num_attention_heads"], rope_parameters(hparams)[0]
    if hparams.get("head_dim", heads) != heads:
        raise ConfigMismatchError(
            f"{where}: head_dim is {hparams['head_dim']}, not hidden_size / num_attention_heads ({heads}), which "
            "llama.cpp's chatglm takes (the converter writes no head width); serve this model with transformers or vLLM"
        )
    base = 10000 * hparams.get("rope_ratio", 1)
    if rope.get("rope_type", "default") != "default" or rope.get("rope_theta", 10000) != base:
        raise ConfigMismatchError(
            f"{where}: rope is {rope.get('rope_type', 'default')} at base {rope.get('rope_theta')}, and llama.cpp's "
            f"chatglm turns plain rope at {base} (10000 times rope_ratio, as the converter writes it): it would "
            "compute another model; serve this one with transformers or vLLM"
        )
    eps, written = hparams.get("rms_norm_eps"), hparams.get("layernorm_epsilon", 1e-5)
    if eps is None or eps == written:
        return []
    return [
        f"llama.cpp's chatglm norms at epsilon {written:g}, as the converter writes it (ChatGLM's layernorm_epsilon), "
        f"and transformers at rms_norm_eps {eps:g}: they agree but where activations are small"
    ]


def glm4moe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path, rotated: float = 0.5) -> None:
    """The converter's Glm4MoeModel's: its TextModel's (with the expert groups), the rotary part of a head (half
    where the config says nothing), the experts' counts and width, the dense first layers, sigmoid gating, the
    routing's scale and renormalisation, the MTP layers' count."""
    glm4_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=True, rotated=rotated)
    for key, add in (  # (the routed experts' count is the TextModel's, from n_routed_experts)
        ("moe_intermediate_size", writer.add_expert_feed_forward_length),
        ("n_shared_experts", writer.add_expert_shared_count),
        ("first_k_dense_replace", writer.add_leading_dense_block_count),
    ):
        if hparams.get(key) is not None:
            add(hparams[key])
    writer.add_expert_gating_func(gguf_py().ExpertGatingFuncType.SIGMOID)
    for key, add in (
        ("routed_scaling_factor", writer.add_expert_weights_scale),
        ("norm_topk_prob", writer.add_expert_weights_norm),
        ("num_nextn_predict_layers", writer.add_nextn_predict_layers),
    ):
        if hparams.get(key) is not None:
            add(hparams[key])


def glm4moelite_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Glm4MoeLiteModel's: DeepSeek-V2's, then the MTP layers' count where the config has some.
    transformers reads which layers are dense from mlp_layer_types, the converter from first_k_dense_replace (which
    the Hub's config.json has too, and a config made by transformers lacks): the count of leading dense layers is
    mlp_layer_types', the only layout llama.cpp's deepseek2 runs."""
    hparams = with_leading_dense_layers(hparams, folder / "config.json", "deepseek2")
    deepseek2_hyperparameters(writer, hparams, ftype, blocks, folder)
    if hparams.get("num_nextn_predict_layers"):
        writer.add_nextn_predict_layers(hparams["num_nextn_predict_layers"])


def glm_dsa_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's GlmMoeDsaModel's: DeepSeek-V2's (the dense first layers as transformers reads them, from
    mlp_layer_types), the rotary part of the rope dimensions, the MTP layers' count where the config has one, then the
    sparse attention's indexer: its heads, their width, how many tokens it keeps, which layers' indexers are full
    (gguf-py 0.19 names no key for them: llama.cpp's name)."""
    hparams = with_leading_dense_layers(hparams, folder / "config.json", "glm-dsa")
    deepseek2_hyperparameters(writer, hparams, ftype, blocks, folder)
    rotated = rope_parameters(hparams)[0].get("partial_rotary_factor", 1.0)
    with gguf_quiet():  # (written again, as the converter does)
        writer.add_rope_dimension_count(int(hparams["qk_rope_head_dim"] * rotated))
    if hparams.get("num_nextn_predict_layers") is not None:
        writer.add_nextn_predict_layers(hparams["num_nextn_predict_layers"])
    writer.add_indexer_head_count(hparams["index_n_heads"])
    writer.add_indexer_key_length(hparams["index_head_dim"])
    writer.add_indexer_top_k(hparams["index_topk"])
    if hparams.get("indexer_types") is not None:
        writer.add_array(
            f"{writer.arch}.attention.indexer.types", [kind == "full" for kind in hparams["indexer_types"]]
        )


def glm_dsa_checked(hparams: dict, where: Path) -> None:
    """DeepSeek-V2's latent query, and the sigmoid routing transformers' GLM-5 computes whatever the config says (and
    llama.cpp's glm-dsa where the config names no gating function)."""
    latent_query_checked(hparams, where)
    gating = first_of(hparams, *GATING_KEYS)
    if gating not in (None, "sigmoid"):
        raise ConfigMismatchError(
            f"{where}: the experts' gating function is {gating!r}, and transformers' GLM-5 routes by a sigmoid "
            "whatever the config says (llama.cpp would follow the config); fix or remove it"
        )


def glm4v_checked(hparams: dict, where: Path) -> None:
    """transformers' GLM-4.1V rotates whole heads where the config names no partial rotary factor, the converter
    (and so llama.cpp) half of each."""
    if "partial_rotary_factor" not in rope_parameters(hparams)[1]:
        raise ConfigMismatchError(
            f"{where}: text_config's rope_parameters name no partial_rotary_factor: transformers' GLM-4.1V then "
            "rotates whole heads and llama.cpp's converter half of each; state it (GLM-4.1V's is 0.5)"
        )


def glm4v_neox_rows(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """With M-RoPE, q's and k's rows (weight and bias) in each head's rotary part as NeoX's halves (the even rows,
    then the odd), as the converter's Glm4Model reorders them: llama.cpp's M-RoPE turns halves, GLM's pairs."""
    rope = rope_parameters(hparams)[1]
    if "mrope_section" not in rope or not name.endswith(
        ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")
    ):
        return None
    head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    rotary = int(head * rope["partial_rotary_factor"])
    return Rearrangement({name: shape}, partial(neox_halves, head, rotary), rows_per_band=head)


def neox_halves(head: int, rotary: int, band) -> tuple:
    """A band of whole heads, each head's first `rotary` rows as their even rows, then their odd."""
    heads = band.reshape(-1, head, *band.shape[1:])
    turned = heads[:, :rotary]
    return (np.concatenate([turned[:, 0::2], turned[:, 1::2], heads[:, rotary:]], axis=1).reshape(band.shape),)


def glm4v_sizes(vision: dict, where: Path) -> dict:
    """Qwen2-VL's sizes (the image as the config says), refusing what llama.cpp's glm4v takes otherwise: it merges
    2 x 2 patches and turns the tower's rope at 10000, and knows SiLU and GELU only."""
    merge, act = vision.get("spatial_merge_size", 2), vision.get("hidden_act", "silu")
    theta = (vision.get("rope_parameters") or {}).get("rope_theta", 10000)
    for wrong, why in (
        (merge != 2, f"spatial_merge_size is {merge}, and llama.cpp's glm4v merges 2 x 2 patches"),
        (theta != 10000, f"rope_theta is {theta}, and llama.cpp's glm4v turns the tower's rope at 10000"),
        (act not in ("silu", "gelu"), f"hidden_act is {act!r}, and llama.cpp's glm4v runs SiLU or GELU"),
    ):
        if wrong:
            raise ConfigMismatchError(
                f"{where}: vision_config's {why}: it would compute other image features; serve this model with "
                "transformers or vLLM"
            )
    return qwen2vl_sizes(vision, where)


def glm4v_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The converter's Glm4VVisionModel's: the activation, the tower's norm epsilon."""
    if vision.get("hidden_act", "silu") == "gelu":
        writer.add_vision_use_gelu(True)
    else:
        writer.add_vision_use_silu(True)
    writer.add_vision_attention_layernorm_eps(vision.get("rms_norm_eps", 1e-5))


def glm4v_vision_split(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """Qwen3-VL's tower (its Conv3D patch embedding as two 2-D ones, its bias, qkv fused); the patch merger as gguf-py
    maps GLM-4.1V's names."""
    return None if name.startswith("visual.merger.") else qwen3vl_vision_split(name, shape, vision)


# GLM-4.1V's and GLM-4.5V's tower and projector, as the converter's Glm4VVisionModel writes them
GLM4V_MMPROJ = MmprojPart(
    "GLM4V",
    r"^(?:model\.)?visual\.",
    glm4v_sizes,
    glm4v_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=qwen3vl_vision_name,
    rearranged=glm4v_vision_split,
)


# the special tokens the converter's GLM vocabulary sets by their text (over tokenizer_config.json's)
GLM_SPECIAL_TOKENS = (("bos", "[gMASK]"), ("eot", "<|user|>"), ("unk", "<|endoftext|>"), ("eom", "<|observation|>"))
# and its Solar Open vocabulary
SOLAR_OPEN_SPECIAL_TOKENS = (
    ("eos", "<|endoftext|>"),
    ("eot", "<|endoftext|>"),
    ("unk", "<unk>"),
    ("bos", "<|startoftext|>"),
)
# GLM-4.7-Flash's text model, as llama.cpp's deepseek2 with GLM's vocabulary and room for the MTP layers (GLM-5's too)
GLM_LATENT = GGUFPart(
    "DEEPSEEK2",
    hyperparameters=glm4moelite_hyperparameters,
    vocabulary="bpe",
    rearranged=latent_kv,
    first_kv_heads=one_kv_head,
    special_tokens=GLM_SPECIAL_TOKENS,
    extra_blocks="num_nextn_predict_layers",
)
# GLM-4.1V's text model (GLM-OCR's too): GLM-4's, M-RoPE's rows as the converter reorders them
GLM4V_TEXT = GGUFPart(
    "GLM4",
    hyperparameters=glm4_hyperparameters,
    check_config=glm4v_checked,
    vocabulary="bpe",
    special_tokens=GLM4_SPECIAL_TOKENS,
    rearranged=glm4v_neox_rows,
)
FAMILIES = (
    Family(
        "GLM-4",
        "glm4",
        "Glm4ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's GLM-4 dense layout (norms after attention and the MLP) is not mapped yet"),
        **no_trainer_model("GLM-4"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),  # (gate and up are one tensor already)
        gguf=GGUFPart(
            "GLM4",
            hyperparameters=glm4_hyperparameters,
            vocabulary="bpe",
            special_tokens=GLM4_SPECIAL_TOKENS,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "GLM",
        "glm",
        "GlmForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's GLM layout (rope on half of each head, GPT-J's pairs) is not mapped yet"),
        **no_trainer_model("GLM"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),  # (gate and up are one tensor already)
        gguf=GGUFPart(
            "CHATGLM",
            hyperparameters=chatglm_hyperparameters,
            check_config=chatglm_checked,
            vocabulary="bpe",
            special_tokens=(("eos", "<|endoftext|>"), ("eot", "<|user|>"), ("unk", "<|endoftext|>")),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "GLM-4.1V",
        "glm4v",
        "Glm4vForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        **no_trainer_model("GLM-4.1V"),
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        gguf=GLM4V_TEXT,
        mmproj=GLM4V_MMPROJ,
        moe_layout=NO_MOE,
    ),
    multimodal_family(
        "GLM-OCR",
        "glm_ocr",
        "GlmOcrForConditionalGeneration",
        GLM4V_TEXT,
        GLM4V_MMPROJ,
        "GLM-4.1V's tower without learned positions, q and k normed",
    ),
    Family(
        "GLM-4.5",
        "glm4_moe",
        "Glm4MoeForCausalLM",
        tensors=NO_TABLE,
        megatron=MegatronRules(
            {**m.COMMON, **MEGATRON_SIGMOID_MOE, **m.MTP_LAYER},
            m.Signature(
                qkv_bias=True,
                qk_norm=None,
                experts=True,
                shared_experts=True,
                sigmoid_router=True,
                partial_rotary=None,
            ),
            _config,
        ),
        meta_names=NO_META_NAMES,
        fused_siblings=(("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj")),
        gguf=GGUFPart(
            "GLM4_MOE",
            hyperparameters=glm4moe_hyperparameters,
            vocabulary="bpe",
            special_tokens=GLM_SPECIAL_TOKENS,
            extra_blocks="num_nextn_predict_layers",
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={
            "megatron_legacy": "partial rotary, dense first layers; MTP layers as the Hub holds them",
            "megatron_dist": "partial rotary, dense first layers; MTP layers as the Hub holds them",
            "to_megatron": "partial rotary, dense first layers; the Hub's MTP layers as megatron-core's",
        },
    ),
    Family(
        "GLM-4.5V",
        "glm4v_moe",
        "Glm4vMoeForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        **no_trainer_model("GLM-4.5V"),
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        # (its M-RoPE turns NeoX's halves, as llama.cpp's: no rows reordered)
        gguf=GGUFPart(
            "GLM4_MOE",
            hyperparameters=glm4moe_hyperparameters,
            vocabulary="bpe",
            special_tokens=GLM_SPECIAL_TOKENS,
        ),
        mmproj=GLM4V_MMPROJ,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
    Family(
        "GLM-5",
        "glm_moe_dsa",
        "GlmMoeDsaForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's GLM-5 layout (its sparse attention's indexer) is not mapped yet"),
        **no_trainer_model("GLM-5"),
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=replace(GLM_LATENT, arch="GLM_DSA", hyperparameters=glm_dsa_hyperparameters, check_config=glm_dsa_checked),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={
            "quantize": "not compared with llm-compressor, whose pinned transformers (5.17) cannot read GLM-5's config"
        },
    ),
    Family(
        "Solar Open",
        "solar_open",
        "SolarOpenForCausalLM",
        tensors=NO_TABLE,
        megatron=MegatronRules(
            {**m.COMMON, **MEGATRON_SIGMOID_MOE},
            m.Signature(experts=True, shared_experts=True, sigmoid_router=True),
            _solar_open_config,
        ),
        **no_trainer_model("Solar Open"),
        fused_siblings=(("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj")),
        gguf=GGUFPart(
            "GLM4_MOE",
            # (rotary over whole heads where the config says nothing, as transformers' Solar Open turns it)
            hyperparameters=partial(glm4moe_hyperparameters, rotated=1.0),
            vocabulary="bpe",
            special_tokens=SOLAR_OPEN_SPECIAL_TOKENS,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
    Family(
        "GLM-4.7-Flash",
        "glm4_moe_lite",
        "Glm4MoeLiteForCausalLM",
        tensors=NO_TABLE,
        # (DeepSeek-V3's layers under DeepSeek-V3's names: Megatron-LM's args describe a DeepSeek-V3, which computes it)
        megatron=MegatronRules(MEGATRON_V3, None, read_as="a DeepSeek-V3"),
        **no_trainer_model("GLM-4.7-Flash"),
        notes={
            "megatron_legacy": "with --config-from (the args describe a DeepSeek-V3, which it is)",
            "megatron_dist": "with --config-from (the args describe a DeepSeek-V3, which it is)",
        },
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=GLM_LATENT,
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)

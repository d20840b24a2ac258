"""GLM-4 (`Glm4ForCausalLM`, GLM-4-0414): grouped-query attention with q/k/v biases and rotary embeddings on half of
each head (GPT-J's pairs, as llama.cpp turns them), norms after attention and after the MLP, gate and up fused in one
tensor; llama.cpp's glm4.

GLM-4.5 and GLM-4.6 (`Glm4MoeForCausalLM`): grouped-query attention with q/k/v biases, optional q/k norms and
rotary embeddings on part of each head, then DeepSeek-V3's MoE block (deepseek.py): dense first layers, a sigmoid
router with an expert bias, routed and shared experts; llama.cpp's glm4moe, whose file has room for the MTP layers
the config counts (llama.cpp loads a file without them: a trained checkpoint has none, as transformers drops them).

GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`): DeepSeek-V3's latent attention and MoE block with GLM's vocabulary and an MTP
layer; llama.cpp's deepseek2 as for DeepSeek-V3, with room for the MTP layers as for GLM-4.5.

Solar Open (`SolarOpenForCausalLM`, Upstage's): GLM-4.5's MoE block in every layer, without q and k norms, rotary
over whole heads; llama.cpp's glm4moe with Solar Open's special tokens, as the converter writes it."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from ..names import megatron_rules as m
from .deepseek import MEGATRON_SIGMOID_MOE, deepseek2_hyperparameters, latent_kv, sigmoid_moe_config
from .gguf_hooks import gguf_py, rope_parameters, text_hyperparameters, with_leading_dense_layers
from .llama import TEXT_ONLY
from .parts import (
    NO_META_NAMES,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MegatronRules,
    Unsupported,
    no_trainer_model,
)


def _config(args: dict[str, Any]) -> dict[str, Any]:
    return {
        "attention_bias": True,
        "use_qk_norm": bool(args.get("qk_layernorm")),
        "partial_rotary_factor": args.get("rotary_percent", 1.0),
        # (the folder has no MTP layers, as the reader leaves them out; said, as transformers 5 would count one)
        "num_nextn_predict_layers": 0,
        **sigmoid_moe_config(args),
    }


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


# the special tokens the converter's GLM vocabulary sets by their text (over tokenizer_config.json's)
GLM_SPECIAL_TOKENS = (("bos", "[gMASK]"), ("eot", "<|user|>"), ("unk", "<|endoftext|>"), ("eom", "<|observation|>"))
# and its Solar Open vocabulary
SOLAR_OPEN_SPECIAL_TOKENS = (
    ("eos", "<|endoftext|>"),
    ("eot", "<|endoftext|>"),
    ("unk", "<unk>"),
    ("bos", "<|startoftext|>"),
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
        "GLM-4.5",
        "glm4_moe",
        "Glm4MoeForCausalLM",
        tensors=NO_TABLE,
        megatron=MegatronRules(
            {**m.COMMON, **MEGATRON_SIGMOID_MOE},
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
            "megatron_legacy": "partial rotary, dense first layers; MTP layers are left out",
            "megatron_dist": "partial rotary, dense first layers; MTP layers are left out",
        },
    ),
    Family(
        "Solar Open",
        "solar_open",
        "SolarOpenForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Solar Open layout is not mapped yet"),
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
        megatron=Unsupported("Megatron's GLM-4.7-Flash (latent attention with GLM's MoE) is not mapped yet"),
        **no_trainer_model("GLM-4.7-Flash"),
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=GGUFPart(
            "DEEPSEEK2",
            hyperparameters=glm4moelite_hyperparameters,
            vocabulary="bpe",
            rearranged=latent_kv,
            one_kv_head=True,
            special_tokens=GLM_SPECIAL_TOKENS,
            extra_blocks="num_nextn_predict_layers",
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)

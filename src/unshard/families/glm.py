"""GLM-4 (`Glm4ForCausalLM`, GLM-4-0414): grouped-query attention with q/k/v biases and rotary embeddings on half of
each head (GPT-J's pairs, as llama.cpp turns them), norms after attention and after the MLP, gate and up fused in one
tensor; llama.cpp's glm4.

GLM-4.5 and GLM-4.6 (`Glm4MoeForCausalLM`): grouped-query attention with q/k/v biases, optional q/k norms and
rotary embeddings on part of each head, then DeepSeek-V3's MoE block (deepseek.py): dense first layers, a sigmoid
router with an expert bias, routed and shared experts; llama.cpp's glm4moe, whose file has room for the MTP layers
the config counts (llama.cpp loads a file without them: a trained checkpoint has none, as transformers drops them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..names import megatron_rules as m
from .deepseek import MEGATRON_SIGMOID_MOE, sigmoid_moe_config
from .gguf_hooks import gguf_py, rope_parameters, text_hyperparameters
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


def glm4_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path, expert_groups: bool = False) -> None:
    """The converter's Glm4Model's: its TextModel's, then the rotary part of a head (half where the config says
    nothing)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=expert_groups)
    head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    writer.add_rope_dimension_count(int(head * rope_parameters(hparams)[0].get("partial_rotary_factor", 0.5)))


def glm4moe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Glm4MoeModel's: its TextModel's (with the expert groups), the rotary part of a head (half
    where the config says nothing), the experts' counts and width, the dense first layers, sigmoid gating, the
    routing's scale and renormalisation, the MTP layers' count."""
    glm4_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=True)
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


# the special tokens the converter's GLM vocabulary sets by their text (over tokenizer_config.json's)
GLM_SPECIAL_TOKENS = (("bos", "[gMASK]"), ("eot", "<|user|>"), ("unk", "<|endoftext|>"), ("eom", "<|observation|>"))
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
)

"""Qwen2-MoE and Qwen3-MoE: Qwen2's and Qwen3's attention, each layer's MLP as experts `mlp.experts.E` behind a
router (Qwen2-MoE adds a shared expert and its gate); llama.cpp's qwen2moe and qwen3moe with the experts stacked;
what merge-moe assembles as Qwen MoE (from Llama, Mistral or Qwen2, one shared expert) or Qwen3 MoE (from Qwen3)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from ..names import megatron_rules as m
from ..names.meta_rules import TORCHTITAN_ROUTED_EXPERTS, Zeros
from .gguf_hooks import qwen2moe_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import INTERMEDIATE, NO_META_NAMES, NO_TABLE, Family, GGUFPart, MegatronRules, MoELayout
from .qwen import TORCHTITAN_QWEN3, TORCHTITAN_QWEN3_BEFORE_0_3

L = m.L
MEGATRON_MOE = {
    **m.ROUTED_EXPERTS,
    "decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight": (
        m.GATE_UP,
        L + "mlp.shared_expert.gate_proj.weight",
        L + "mlp.shared_expert.up_proj.weight",
    ),
    "decoder.layers.{i}.mlp.shared_experts.linear_fc2.weight": L + "mlp.shared_expert.down_proj.weight",
    "decoder.layers.{i}.mlp.shared_experts.gate_weight": L + "mlp.shared_expert_gate.weight",
}


def _config(args: dict) -> dict:
    return m.moe_config(
        args,
        num_experts=args["num_experts"],
        moe_intermediate_size=args.get("moe_ffn_hidden_size"),
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def routing_checked(arch_name: str, renormalised: bool):
    """The config's routing, where llama.cpp computes the model as transformers does: Qwen2-MoE's top experts'
    weights as they are, Qwen3-MoE's renormalised, every layer a MoE one."""

    def check(hparams: dict, where: Path) -> None:
        if bool(hparams.get("norm_topk_prob")) != renormalised:
            raise ConfigMismatchError(
                f"{where}: norm_topk_prob is {hparams.get('norm_topk_prob')}, but llama.cpp's "
                f"{arch_name} {'always' if renormalised else 'never'} renormalises "
                "the chosen experts' weights and would compute another model; serve this one "
                "with transformers or vLLM"
            )
        if hparams.get("mlp_only_layers") or hparams.get("decoder_sparse_step", 1) != 1:
            raise ConfigMismatchError(
                f"{where}: some layers are dense (mlp_only_layers, decoder_sparse_step), which "
                f"llama.cpp's {arch_name} does not run; serve this model with "
                "transformers or vLLM"
            )

    return check


def _gguf(arch: str, arch_name: str, renormalised: bool) -> GGUFPart:
    # (the vocabulary from tokenizer.json alone, as the converter's Qwen MoE models read it)
    return GGUFPart(
        arch,
        hyperparameters=qwen2moe_hyperparameters,
        check_config=routing_checked(arch_name, renormalised),
        vocabulary="bpe",
    )


SAME = {p: p for p in ("gate_proj", "up_proj", "down_proj")}
# torchtitan's Qwen3 MoE: Qwen3's attention and norms, its grouped experts and router; the load-balancing bias it
# routes by (when trained with load_balance_coeff) has no place in transformers' Qwen3-MoE, whose routing has none:
# left out when read, as torchtitan's own Qwen3StateDictAdapter drops it; zeros when written (torchtitan starts so)
TORCHTITAN_QWEN3_MOE = {
    **TORCHTITAN_QWEN3,
    **TORCHTITAN_ROUTED_EXPERTS,
    "layers.{i}.moe.expert_bias_E": Zeros(
        L + "mlp.gate.weight",
        "torchtitan's load-balancing expert bias (transformers' Qwen3-MoE routes without one, as torchtitan's "
        "own Qwen3StateDictAdapter drops it)",
    ),
}

FAMILIES = (
    Family(
        "Qwen2-MoE",
        "qwen2_moe",
        "Qwen2MoeForCausalLM",
        tensors=NO_TABLE,
        megatron=MegatronRules(
            {**m.COMMON, **MEGATRON_MOE}, m.Signature(qkv_bias=True, experts=True, shared_experts=True), _config
        ),
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=_gguf("QWEN2MOE", "qwen2moe", False),
        mmproj=TEXT_ONLY,
        moe_layout=MoELayout(
            "Qwen MoE",
            "Qwen2MoeConfig",
            ("llama", "mistral", "qwen2"),
            1,
            "mlp.experts.{e}.{part}.weight",
            SAME,
            "mlp.gate.weight",
            "num_experts",
            {
                "decoder_sparse_step": 1,
                "norm_topk_prob": True,
                "sliding_window": None,
                "use_sliding_window": False,
                "shared_expert_intermediate_size": INTERMEDIATE,
                "moe_intermediate_size": INTERMEDIATE,
            },
            "mlp.shared_expert.{part}.weight",
            "mlp.shared_expert_gate.weight",
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        ),
    ),
    Family(
        "Qwen3-MoE",
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        tensors=NO_TABLE,
        megatron=MegatronRules({**m.COMMON, **MEGATRON_MOE}, m.Signature(qk_norm=True, experts=True), _config),
        meta_names={**TORCHTITAN_QWEN3_MOE, **TORCHTITAN_QWEN3_BEFORE_0_3},
        torchtitan_names=TORCHTITAN_QWEN3_MOE,
        fused_siblings=SIBLINGS,
        gguf=_gguf("QWEN3MOE", "qwen3moe", True),
        mmproj=TEXT_ONLY,
        moe_layout=MoELayout(
            "Qwen3 MoE",
            "Qwen3MoeConfig",
            ("qwen3",),
            0,
            "mlp.experts.{e}.{part}.weight",
            SAME,
            "mlp.gate.weight",
            "num_experts",
            {"decoder_sparse_step": 1, "norm_topk_prob": True, "moe_intermediate_size": INTERMEDIATE},
        ),
    ),
)

"""A Megatron-LM checkpoint in its `torch_dist` format (`--to megatron`): what `megatron.core.dist_checkpointing.load`
reads into a model built at any tensor, pipeline and virtual-pipeline parallelism (--tp/--pp/--vpp say what the args
record; the tensors do not depend on them but for the vocabulary's padding).

    OUT/latest_checkpointed_iteration.txt   "release", as Megatron-LM's own converters write it (its loader takes
                                            iteration 0 for an error; release is loaded as the run's start)
    OUT/release/                            the dist checkpoint: .metadata and .distcp files (sinks/dcp.py),
                                            common.pt (Megatron-LM's args, checkpoint_version, iteration),
                                            metadata.json (the torch_dist backend)
    OUT/huggingface/                        the model's config and tokenizer, as verl keeps them beside its
                                            Megatron checkpoints (the way back to a Hugging Face folder reads it)

The tensors are megatron-core's sharded state dict for a GPTModel of the family (names.megatron_rules.to_megatron):
a layer's tensors stacked on a first axis, q, k and v fused per query group, gate and up as one fc1, the vocabulary
padded with zero rows to a multiple of --make-vocab-size-divisible-by times the TP size, as Megatron-LM pads it.
Each Hugging Face tensor goes in as chunks (boxes of the dist tensors), so memory is a chunk, not the model; a
`_extra_state` object (None) for each linear layer, as megatron-core's layers save theirs.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import families
from ..errors import CheckpointError, UnshardError
from ..families.gguf_hooks import first_of, rope_parameters
from ..families.parts import Unsupported
from ..names import megatron_rules, mtp_layers
from ..types import FormatRequest, Plan
from .dcp import DCPFolder, Piece, chunked, model_config, write_metadata
from .hf_folder import copy_model_files

SUMMARY_KEY = "megatron"
VERL = "verl-megatron"  # (--to: verl's layout of the same checkpoint)
RELEASE = "release"
TRACKER = "latest_checkpointed_iteration.txt"
# The linear layers of megatron-core's GPT layer (attention's, the MLP's, each expert's and a shared expert's), each
# saving an `_extra_state` (local spec: None; Transformer Engine's: its FP8 state, which it starts afresh from None)
# (and an MTP layer's, its projection's too)
LINEAR_WEIGHT = re.compile(r"^((?:decoder|mtp)\.layers\..*\.(?:linear_[a-z0-9_]+|eh_proj))\.weight$")


def plan_sink(request: FormatRequest) -> MegatronFolder:
    options = request.options
    flag = f"--to {options.to}"
    if options.quantize or options.gguf:
        raise UnshardError(f"{flag} writes the weights as they are: leave out --quantize and --gguf-type")
    if request.separate_adapter:
        raise UnshardError(f"{request.where}: {flag} writes the model's weights only: use --lora merge")
    config = model_config(request, flag)
    family = families.by_model_type(config.get("model_type"))
    rules = family.megatron_out if family is not None else Unsupported("not a family unshard knows")
    if isinstance(rules, Unsupported):
        what = family.name if family is not None else f"model_type {config.get('model_type')!r}"
        raise UnshardError(f"{request.where}: {flag}: {what}: {rules.reason}; `unshard families` says which")
    signature = rules.signature
    moe = moe_args(config, signature, options, request.where)
    _check_parallelism(config, moe, options, request.where)
    tp, divisible = options.tp, options.vocab_divisible
    dims = megatron_rules.shapes_from_config(config)
    padded = -(-dims.vocab // (divisible * tp)) * divisible * tp
    shapes = {o.name: o.shape for g in request.groups.values() for o in g.outputs}
    mtp = _mtp_layers(request, rules.rules, config, shapes, flag)
    placed = _placed(rules, config, moe, shapes, dims, padded, request.where)
    tied = "lm_head.weight" not in shapes
    dist_shapes, stacked = {}, {}
    for group in request.groups.values():
        outputs = []
        for output in group.outputs:
            where = placed[output.name]
            for key in (where.key, *where.also):
                dist_shapes[key], stacked[key] = where.shape, where.stacked
            boxes = [Piece(where.key, start, rows, offsets) for start, rows, offsets in where.boxes]
            zeros = [(where.key, offsets, shape) for offsets, shape in where.zeros]
            outputs.append(chunked(output, boxes, zeros=zeros, also=where.also, turn=where.turn))
        group.outputs = outputs
    try:
        own = rules.args(config)
    except CheckpointError as e:
        raise UnshardError(f"{request.where}: {flag}: {family.name}: {e}") from None
    args = {**moe, **megatron_args(config, shapes, options, padded, tied, request.dtype, request.where, own)}
    args["mtp_num_layers"] = mtp or None
    if options.to == VERL:
        return VerlMegatronFolder(args, dist_shapes, stacked)
    return MegatronFolder(args, dist_shapes, stacked)


def _mtp_layers(request: FormatRequest, rules: dict, config: dict, shapes: dict, flag: str) -> int:
    """How many MTP layers the outputs hold (the layers past the model's, as the Hub's DeepSeek-V3 holds them:
    names.mtp_layers); their copies of the embedding and head, which megatron-core's share with the model, dropped
    from the plan, unread. A family whose table maps none: one line."""
    layers = config["num_hidden_layers"]
    found = mtp_layers.layers_past(shapes, layers)
    if found and not megatron_rules.has_mtp_layers(rules):
        raise UnshardError(
            f"{request.where}: {flag}: the tensors of layers past num_hidden_layers ({layers}) have no place in "
            "megatron-core's model of this family yet: convert a folder without them"
        )
    for name in mtp_layers.shared_copies(shapes, layers):
        del shapes[name]
    mtp_layers.drop_shared_copies(request.groups, layers)
    return len(found)


def _placed(rules, config: dict, moe: dict, shapes: dict, dims, padded: int, where: str) -> dict:
    """Each output's place (names.megatron_rules.to_megatron): the model's layers stacked where they are alike (dense
    layers before MoE ones make megatron-core key each layer on its own), MTP layers keyed on their own."""
    layers = config["num_hidden_layers"]
    alike = layers if moe.get("moe_layer_freq", 1) == 1 else None
    latent = bool(rules.signature.latent_attention)
    past = mtp_layers.names_past(shapes, layers)
    model = {name: shape for name, shape in shapes.items() if name not in past}
    placed = megatron_rules.to_megatron(rules.rules, model, dims, padded, alike, where, latent=latent)
    if past:
        mtp = megatron_rules.to_megatron(rules.rules, {n: shapes[n] for n in past}, dims, padded, None, where, latent)
        for name, place in mtp.items():
            keys = [megatron_rules.layer_as_mtp(key, layers) for key in (place.key, *place.also)]
            placed[name] = replace(place, key=keys[0], also=tuple(keys[1:]))
    return placed


def _check_parallelism(config: dict[str, Any], moe: dict[str, Any], options, where: str) -> None:
    """A model megatron-core can build at this parallelism: heads, query groups and the MLP split evenly over TP,
    layers over the pipeline's stages, experts over EP and each expert's rows over ETP."""
    stages = options.pp * (options.vpp or 1)
    for what, size, parts, flag in (
        ("attention heads", config["num_attention_heads"], options.tp, "--tp"),
        ("query groups", config.get("num_key_value_heads") or config["num_attention_heads"], options.tp, "--tp"),
        ("MLP rows", _dense_width(config, where), options.tp, "--tp"),
        ("layers", config["num_hidden_layers"], stages, "--pp times --vpp"),
        ("experts", moe.get("num_experts") or options.ep, options.ep, "--ep"),
        ("experts' rows", moe.get("moe_ffn_hidden_size") or options.etp, options.etp, "--etp"),
    ):
        if parts < 1 or size % parts:
            raise UnshardError(
                f"{where}: --to {options.to}: {size} {what} do not split over {flag} {parts}; choose another"
            )


def _dense_width(config: dict[str, Any], where: str) -> int:
    """A dense MLP's width (--ffn-hidden-size); a model with experts in every layer and no dense width in its config
    (Solar Open's) gets its experts' width, which Megatron-LM then builds no layer of."""
    width = config.get("intermediate_size") or config.get("moe_intermediate_size")
    if not width:
        raise UnshardError(f"{where}: the config gives no MLP width (intermediate_size or moe_intermediate_size)")
    return width


def moe_args(config: dict[str, Any], signature, options, where: str) -> dict[str, Any]:
    """Megatron-LM's MoE arguments for a model of experts (none for a dense one): the experts, how many a token
    goes to and how their weights are normalised, their width and a shared expert's, the dense layers among them;
    for a sigmoid router with an expert bias (GLM-4.5), its scaling and expert groups."""
    experts = first_of(config, "num_local_experts", "num_experts", "n_routed_experts")
    if not experts:
        return {}
    layers, flag = config["num_hidden_layers"], f"--to {options.to}"
    dense = set(config.get("mlp_only_layers") or ()) | set(range(config.get("first_k_dense_replace") or 0))
    if config.get("decoder_sparse_step", 1) != 1:
        raise UnshardError(f"{where}: {flag}: decoder_sparse_step is not written into Megatron-LM's args yet")
    width = first_of(config, "moe_intermediate_size", "intermediate_size")
    topk = config.get("num_experts_per_tok", 2)
    shared = config.get("shared_expert_intermediate_size") or (config.get("n_shared_experts") or 0) * width
    args = {
        "num_experts": experts,
        "moe_router_topk": topk,
        "moe_ffn_hidden_size": width,
        "moe_shared_expert_intermediate_size": shared or None,
        "moe_shared_expert_gate": bool(config.get("shared_expert_intermediate_size")),  # (Qwen2-MoE's is gated)
        "moe_layer_freq": [int(layer not in dense) for layer in range(layers)] if dense else 1,
        "moe_grouped_gemm": False,
        "expert_model_parallel_size": options.ep,
        "expert_tensor_parallel_size": options.etp,
    }
    if not signature.sigmoid_router:
        # (Megatron's default, top-k then softmax, renormalises the chosen experts' weights; softmax first does not)
        return {
            **args,
            "moe_router_score_function": "softmax",
            "moe_router_pre_softmax": not config.get("norm_topk_prob", True),
            "moe_router_enable_expert_bias": False,
            "moe_router_topk_scaling_factor": None,
            "moe_router_num_groups": None,
            "moe_router_group_topk": None,
        }
    if bool(config.get("norm_topk_prob", True)) != (topk > 1):
        raise UnshardError(
            f"{where}: {flag}: norm_topk_prob is {config.get('norm_topk_prob')}, but Megatron renormalises the "
            "chosen experts' sigmoid scores whenever it picks more than one, and would compute another model"
        )
    groups = config.get("n_group") or 1
    return {
        **args,
        "moe_router_score_function": "sigmoid",
        "moe_router_pre_softmax": True,  # (as DeepSeek's scripts set it; a sigmoid router does not read it)
        "moe_router_enable_expert_bias": True,
        "moe_router_topk_scaling_factor": config.get("routed_scaling_factor") or None,
        "moe_router_num_groups": groups if groups > 1 else None,
        "moe_router_group_topk": config.get("topk_group") if groups > 1 else None,
    }


def megatron_args(
    config: dict, shapes: dict, options, padded: int, tied: bool, dtype, where: str, own: dict[str, Any]
) -> dict[str, Any]:
    """Megatron-LM's arguments for this model (its argument names), as its pretrain_gpt.py would hold them: what
    its checkpoint loader compares with the run's, and what a converter reads back; the family's `own` over them
    (latent attention's, which says its rotary embedding itself)."""
    heads = config["num_attention_heads"]
    groups = config.get("num_key_value_heads") or heads
    rope = rope_parameters(config)[1]
    # (latent attention says its rotary embedding itself: its own args' rope_type)
    scaling = {} if "rope_type" in own else rope_scaling_args(rope, f"{where}: --to {options.to}")
    return {
        "num_layers": config["num_hidden_layers"],
        "hidden_size": config["hidden_size"],
        "ffn_hidden_size": _dense_width(config, where),
        "num_attention_heads": heads,
        "group_query_attention": groups != heads,
        "num_query_groups": groups,
        "kv_channels": config.get("head_dim") or config["hidden_size"] // heads,
        "max_position_embeddings": config.get("max_position_embeddings"),
        "seq_length": config.get("max_position_embeddings"),
        "normalization": "RMSNorm",
        "norm_epsilon": config.get("rms_norm_eps", 1e-6),
        "swiglu": True,
        "add_bias_linear": False,
        # (from the tensors: a family may come with and without them, as GLM-4.5's q/k norms)
        "add_qkv_bias": any(name.endswith("self_attn.q_proj.bias") for name in shapes),
        "qk_layernorm": any(name.endswith("self_attn.q_norm.weight") for name in shapes),
        "position_embedding_type": "rope",
        "rotary_base": rope.get("rope_theta", 10000),
        "rotary_percent": rope.get("partial_rotary_factor", 1.0),
        "rotary_interleaved": False,
        "untie_embeddings_and_output_weights": not tied,
        "tensor_model_parallel_size": options.tp,
        "pipeline_model_parallel_size": options.pp,
        "virtual_pipeline_model_parallel_size": options.vpp,
        "make_vocab_size_divisible_by": options.vocab_divisible,
        "vocab_size": config["vocab_size"],
        "padded_vocab_size": padded,
        "params_dtype": dtype.name,
        "bf16": dtype.name == "bfloat16",
        "fp16": dtype.name == "float16",
        "ckpt_format": "torch_dist",
        "use_dist_ckpt": True,
        "iteration": 0,
        **scaling,
        **own,
    }


def rope_scaling_args(rope: dict[str, Any], refused: str) -> dict[str, Any]:
    """Megatron's args of the rotary embedding's scaling: Llama 3.1's (Megatron-LM's --use-rope-scaling, its factor);
    YaRN's (--position-embedding-type yarn and the yarn_* settings megatron-core's GPTModel reads, as
    sources/megatron_hf.yarn_config reads them back: mscale and mscale_all_dim only where transformers divides by
    them, both given); another scaling is refused (`refused`: who says so) rather than written as none."""
    kind = rope.get("rope_type") or "default"
    if kind == "default":
        return {}
    if kind == "llama3":
        return {"use_rope_scaling": True, "rope_scaling_factor": rope.get("factor", 8.0)}
    if kind != "yarn":
        raise UnshardError(f"{refused}: rope scaling of type {kind!r} is not written into Megatron-LM's args yet")
    if rope.get("attention_factor") is not None:
        raise UnshardError(f"{refused}: YaRN's attention_factor has no place in Megatron-LM's args")
    both = bool(rope.get("mscale") and rope.get("mscale_all_dim"))
    return {
        "position_embedding_type": "yarn",
        "yarn_rotary_scaling_factor": rope["factor"],
        "yarn_original_max_position_embeddings": rope["original_max_position_embeddings"],
        "yarn_beta_fast": float(rope.get("beta_fast") or 32),
        "yarn_beta_slow": float(rope.get("beta_slow") or 1),
        "yarn_mscale": rope["mscale"] if both else None,
        "yarn_mscale_all_dim": rope["mscale_all_dim"] if both else None,
        "yarn_correction_range_round_to_int": bool(rope.get("truncate", True)),
    }


class MegatronFolder(DCPFolder):
    """The Megatron-LM checkpoint as an output format: the DCP folder in release/, and what Megatron-LM keeps around
    it."""

    folder = f"{RELEASE}/"

    def __init__(self, args: dict[str, Any], shapes: dict[str, tuple[int, ...]], stacked: dict[str, int]):
        super().__init__("megatron", shapes)
        self.args, self.stacked = args, stacked  # (each dist tensor's leading axes that stack layers or experts)

    def finish(self, plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None):
        import torch

        args = argparse.Namespace(**{**self.args, "params_dtype": getattr(torch, self.args["params_dtype"])})
        files = self._dist_checkpoint(plan, folder, {"args": args, "checkpoint_version": 3.0, "iteration": 0})
        (folder / TRACKER).write_text(RELEASE)
        return [*files, TRACKER, *self._model_files(plan, folder, "huggingface")], []

    def _dist_checkpoint(self, plan: Plan, folder: Path, common: dict[str, Any]) -> list[str]:
        """Around the tensors of `self.folder`: `.metadata` and the linear layers' `_extra_state` objects, common.pt
        (`common`: what is not sharded) and metadata.json (the backends). The files written."""
        import torch

        dist = folder / self.folder
        dist.mkdir(parents=True, exist_ok=True)
        empty = io.BytesIO()
        torch.save([None], empty)  # (megatron-core saves a list of each object's values)
        objects = {f"{key}/shard_{at}": empty.getvalue() for key, at in self._extra_states()}
        written = write_metadata(plan, dist, self.shapes, objects)
        torch.save(common, dist / "common.pt")
        backend = {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
        (dist / "metadata.json").write_text(
            json.dumps({**backend, "common_backend": "torch", "common_backend_version": 1})
        )
        return [f"{self.folder}{name}" for name in (*written, "common.pt", "metadata.json")]

    def _extra_states(self) -> list[tuple[str, str]]:
        """(key, place) of each linear layer's `_extra_state` object, one per layer (and expert) its weight stacks:
        `decoder.layers.mlp.experts.experts.linear_fc1._extra_state` at `3.1_4.8`, layer 3 of 4, expert 1 of 8."""
        found = []
        for key, shape in self.shapes.items():
            if match := LINEAR_WEIGHT.match(key):
                stacked = shape[: self.stacked[key]] or (1,)  # (a layer keyed on its own: its one object, 0 of 1)
                for at in itertools.product(*map(range, stacked)):
                    place = f"{'.'.join(map(str, at))}_{'.'.join(map(str, stacked))}"
                    found.append((f"{match.group(1)}._extra_state", place))
        return found

    def _model_files(self, plan: Plan, folder: Path, where: str) -> list[str]:
        """The model's config and tokenizer in `where`, as verl keeps them beside its checkpoints."""
        (folder / where).mkdir(parents=True)
        copied = copy_model_files(plan.config_folder, folder / where, plan.dtype.name, plan.config_updates)
        return [f"{where}/{name}" for name in copied]

    layout = "Megatron-LM torch_dist"
    described = "a Megatron-LM torch_dist checkpoint (release/)"
    resuming = "the optimizer starts afresh; load with --finetune or --no-load-optim --no-load-rng"

    def notes(self) -> list[str]:
        a = self.args
        return [
            f"{self.described} for TP {a['tensor_model_parallel_size']}, PP {a['pipeline_model_parallel_size']}: "
            f"the vocabulary padded to {a['padded_vocab_size']}; the model's weights only ({self.resuming})"
        ]

    def summary(self) -> dict[str, Any]:
        a = self.args
        return {
            SUMMARY_KEY: {
                "layout": self.layout,
                "tp": a["tensor_model_parallel_size"],
                "pp": a["pipeline_model_parallel_size"],
                "vpp": a["virtual_pipeline_model_parallel_size"],
                "padded_vocab_size": a["padded_vocab_size"],
            }
        }

    def card(self) -> tuple[list[str], list[str]]:
        return ["megatron"], []


class VerlMegatronFolder(MegatronFolder):
    """verl's layout of the same checkpoint (`--to verl-megatron`), as its MegatronCheckpointManager saves an actor
    (layout v2, mbridge off): the dist checkpoint in actor/model/dist_ckpt with nothing in common.pt (verl keeps no
    Megatron-LM args), the Hugging Face config and tokenizer in actor/model/huggingface, and the TransformerConfig's
    model and parallelism fields in actor/transformer_config.json. OUT is a run's global_step_N/."""

    folder = "actor/model/dist_ckpt/"

    def finish(self, plan: Plan, folder: Path, digests: dict[str, str | None], extra_files: dict[str, str] | None):
        files = self._dist_checkpoint(plan, folder, {})
        config = "actor/transformer_config.json"
        (folder / config).write_text(json.dumps(transformer_config(self.args), indent=2))
        return [*files, config, *self._model_files(plan, folder, "actor/model/huggingface")], []

    layout = described = "verl's Megatron checkpoint (actor/model/dist_ckpt)"
    resuming = "resume with checkpoint.load_contents=[model]: the optimizer starts afresh"

    def card(self) -> tuple[list[str], list[str]]:
        return ["megatron", "verl"], []


def transformer_config(args: dict[str, Any]) -> dict[str, Any]:
    """The fields of megatron-core's TransformerConfig that the model and its parallelism decide, under its names, as
    verl writes the config it trained with (which its loader does not read back: it builds the model from its own)."""
    return {
        "tensor_model_parallel_size": args["tensor_model_parallel_size"],
        "pipeline_model_parallel_size": args["pipeline_model_parallel_size"],
        "virtual_pipeline_model_parallel_size": args["virtual_pipeline_model_parallel_size"],
        "expert_model_parallel_size": args.get("expert_model_parallel_size", 1),
        "num_layers": args["num_layers"],
        "hidden_size": args["hidden_size"],
        "ffn_hidden_size": args["ffn_hidden_size"],
        "num_attention_heads": args["num_attention_heads"],
        "num_query_groups": args["num_query_groups"],
        "kv_channels": args["kv_channels"],
        "normalization": args["normalization"],
        "layernorm_epsilon": args["norm_epsilon"],
        "gated_linear_unit": args["swiglu"],
        "add_bias_linear": args["add_bias_linear"],
        "add_qkv_bias": args["add_qkv_bias"],
        "qk_layernorm": args["qk_layernorm"],
        "rotary_interleaved": args["rotary_interleaved"],
        "params_dtype": f"torch.{args['params_dtype']}",
        "bf16": args["bf16"],
        "fp16": args["fp16"],
        "mtp_num_layers": args.get("mtp_num_layers"),
    }


def summary_lines(summary: dict[str, Any]) -> list[str]:
    vpp = f", VPP {summary['vpp']}" if summary["vpp"] else ""
    return [
        f"output: {summary['layout']}, TP {summary['tp']}, PP {summary['pp']}{vpp}, vocabulary padded to "
        f"{summary['padded_vocab_size']}"
    ]

"""The tensors of a dense decoder family written down as data (a TensorTable), and what a config's model holds
by it. The families' tables are theirs (families/llama.py, ...); the pieces they are made of are here.

A model's first conversion asks transformers which tensors the config's model holds (hf_names):
importing torch and transformers' model code takes 3-4 s, longer than writing a 2 GB model. For the
families with a table the answer is the table, with no import. It only ever speeds things up: a config
field the table does not list, a transformers release it was not checked against, or a checkpoint
that does not fit its answer all go to transformers as before. tests/test_dense_families.py compares
the tables with transformers' own answer across configs of every family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import known

# The transformers major releases the table was compared with (and none installed: then the table
# is the only check there is).
CHECKED_WITH = ("5.",)

# Config fields that add, drop or resize no tensor of these models: ids, bookkeeping, rotary
# embedding and attention-window settings, dropout, initialisation, generation leftovers.
INERT = frozenset(
    {
        "_name_or_path",
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "use_cache",
        "initializer_range",
        "hidden_act",
        "rms_norm_eps",
        "attention_dropout",
        "max_position_embeddings",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "pretraining_tp",
        "use_mrope",
        "hidden_activation",
        "cache_implementation",
        "query_pre_attn_scalar",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "rope_local_base_freq",
        "sliding_window_pattern",
        "_sliding_window_pattern",
        "use_bidirectional_attention",
        "resid_pdrop",
        "embd_pdrop",
        "original_max_position_embeddings",
        "partial_rotary_factor",
    }
)

# Tensors of every decoder layer: name -> shape, each dimension a sum of products of config fields
# and numbers (see _derived).
LAYER = {
    "self_attn.q_proj.weight": ("num_attention_heads*head_dim", "hidden_size"),
    "self_attn.k_proj.weight": ("num_key_value_heads*head_dim", "hidden_size"),
    "self_attn.v_proj.weight": ("num_key_value_heads*head_dim", "hidden_size"),
    "self_attn.o_proj.weight": ("hidden_size", "num_attention_heads*head_dim"),
    "mlp.gate_proj.weight": ("intermediate_size", "hidden_size"),
    "mlp.up_proj.weight": ("intermediate_size", "hidden_size"),
    "mlp.down_proj.weight": ("hidden_size", "intermediate_size"),
    "input_layernorm.weight": ("hidden_size",),
    "post_attention_layernorm.weight": ("hidden_size",),
}
QKV_BIAS = {
    "self_attn.q_proj.bias": ("num_attention_heads*head_dim",),
    "self_attn.k_proj.bias": ("num_key_value_heads*head_dim",),
    "self_attn.v_proj.bias": ("num_key_value_heads*head_dim",),
}
ATTENTION_BIAS = {**QKV_BIAS, "self_attn.o_proj.bias": ("hidden_size",)}
MLP_BIAS = {
    "mlp.gate_proj.bias": ("intermediate_size",),
    "mlp.up_proj.bias": ("intermediate_size",),
    "mlp.down_proj.bias": ("hidden_size",),
}
QK_NORM = {"self_attn.q_norm.weight": ("head_dim",), "self_attn.k_norm.weight": ("head_dim",)}
# Phi-3 holds q, k and v in one projection, and the MLP's gate and up in another (declared after o_proj:
# the table keeps each model's order, which --quantize's list of layers left unquantized follows).
FUSED_LAYER = {
    "self_attn.o_proj.weight": ("hidden_size", "num_attention_heads*head_dim"),
    "self_attn.qkv_proj.weight": ("num_attention_heads*head_dim+2*num_key_value_heads*head_dim", "hidden_size"),
    "mlp.gate_up_proj.weight": ("2*intermediate_size", "hidden_size"),
    **{
        name: dims
        for name, dims in LAYER.items()
        if name not in {f"self_attn.{p}_proj.weight" for p in "qkvo"} | {"mlp.gate_proj.weight", "mlp.up_proj.weight"}
    },
}
FEEDFORWARD_NORMS = {
    "pre_feedforward_layernorm.weight": ("hidden_size",),
    "post_feedforward_layernorm.weight": ("hidden_size",),
}

# Sizes every family reads, with the value the config class gives one the config leaves out: a
# number, another field, a//b; None: the config must say it.
SIZES = {
    "vocab_size": None,
    "hidden_size": None,
    "intermediate_size": None,
    "num_hidden_layers": None,
    "num_attention_heads": None,
    "num_key_value_heads": "num_attention_heads",
    "head_dim": "hidden_size//num_attention_heads",
}
# What a size set to null becomes, where the config class derives it (`nullable` says where).
WHEN_NULL = {"num_key_value_heads": "num_attention_heads", "head_dim": "hidden_size//num_attention_heads"}


@dataclass(frozen=True)
class TensorTable:
    architecture: str  # the causal LM class whose tensors these are
    sizes: dict[str, Any]  # field -> its value when left out (see SIZES)
    layer: dict[str, tuple[str, ...]]  # tensors of each layer, whatever the flags
    flags: dict[str, tuple[bool, dict[str, tuple[str, ...]]]]  # boolean field -> (default, layer tensors it adds)
    nullable: tuple[str, ...] = ("num_key_value_heads",)  # sizes a null sets to WHEN_NULL's value
    heads_divide_hidden: bool = False  # the config class refuses a hidden_size not divisible by the heads
    tie_default: bool = False
    pad_token_default: int | None = None  # the padding index of the embedding, when the config has none


def _installed_transformers_checked() -> bool:
    version = known.transformers_version()
    return version is None or version.startswith(CHECKED_WITH)


def settings(family: TensorTable, config: dict, updates: dict | None = None) -> dict[str, Any] | None:
    """The settings (every size and flag) of a config the table covers, else None."""
    if updates or not _installed_transformers_checked():
        return None
    if config.get("architectures") not in (None, [family.architecture]):
        return None
    if not set(config) <= INERT | set(family.sizes) | set(family.flags) | {"tie_word_embeddings"}:
        return None  # a field the table does not know may change the tensors (quantization_config, auto_map...)
    values: dict[str, Any] = {}
    for field, default in family.sizes.items():
        value = config.get(field, default)
        if field in config and value is None and field in family.nullable:
            value = _derived(WHEN_NULL[field], values)
        elif field not in config and isinstance(default, str):
            value = _derived(default, values)
        if type(value) is not int or value < 1:
            return None
        values[field] = value
    for field, (default, _) in family.flags.items():
        values[field] = config.get(field, default)
        if type(values[field]) is not bool:
            return None
    values["tie_word_embeddings"] = config.get("tie_word_embeddings", family.tie_default)
    if type(values["tie_word_embeddings"]) is not bool:
        return None
    if family.heads_divide_hidden and values["hidden_size"] % values["num_attention_heads"]:
        return None
    pad = config.get("pad_token_id", family.pad_token_default)
    if isinstance(pad, int) and not -values["vocab_size"] <= pad < values["vocab_size"]:
        return None  # the embedding's padding_idx: torch refuses to build the model
    layer_types = config.get("layer_types")
    if layer_types is not None and (
        len(layer_types) != values["num_hidden_layers"]
        or not set(layer_types) <= {"full_attention", "sliding_attention"}
    ):
        return None
    return values


def tensors(
    family: TensorTable, config: dict, updates: dict | None = None
) -> tuple[dict[str, tuple[int, ...]], set[str]] | None:
    """(name -> shape of the model's state dict, the names tied to another tensor) for a config the
    table covers; None for any other, which transformers then answers."""
    values = settings(family, config, updates)
    if values is None:
        return None
    per_layer = dict(family.layer)
    for field, (_, added) in family.flags.items():
        if values[field]:
            per_layer.update(added)
    shape = lambda dims: tuple(_derived(d, values) for d in dims)  # noqa: E731
    state = {"model.embed_tokens.weight": shape(("vocab_size", "hidden_size"))}
    for i in range(values["num_hidden_layers"]):
        state.update({f"model.layers.{i}.{name}": shape(dims) for name, dims in per_layer.items()})
    state["model.norm.weight"] = shape(("hidden_size",))
    state["lm_head.weight"] = shape(("vocab_size", "hidden_size"))
    return state, ({"lm_head.weight"} if values["tie_word_embeddings"] else set())


def _derived(expression: str, values: dict[str, int]) -> int:
    """A floor division of two fields (`a//b`), or a sum of products of fields and numbers (`a*b+2*c`)."""
    if "//" in expression:
        numerator, denominator = expression.split("//")
        return values[numerator] // values[denominator]
    total = 0
    for term in expression.split("+"):
        product = 1
        for factor in term.split("*"):
            product *= int(factor) if factor.isdigit() else values[factor]
        total += product
    return total


def linear(in_memory: dict[str, tuple[int, ...]]) -> list[str]:
    """The weights of the Linear layers among a table model's tensors, in the model's order: every matrix
    but the embedding (compared with transformers' modules in the tests)."""
    return [name for name, shape in in_memory.items() if len(shape) == 2 and name != "model.embed_tokens.weight"]

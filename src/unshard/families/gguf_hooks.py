"""The pieces a family's GGUF hooks (families/<family>.py, its GGUFPart) are written with, and the GGUF sink with
them: gguf-py (llama.cpp's own Python library), rope's parameters as the converter reads them, the hyper-parameters
of the converter's TextModel, the query scale llama.cpp assumes, the special vocabulary."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ConfigMismatchError, UnshardError, read_json
from ..model_files import unreadable_model_files


def gguf_py():
    try:
        import gguf
    except ImportError:
        raise UnshardError("GGUF output needs the gguf package: pip install 'unshard[gguf]'") from None
    logger = logging.getLogger("gguf")
    if logger.level < logging.WARNING:  # (it says at INFO which endianness each file has; gguf_quiet's level stays)
        logger.setLevel(logging.WARNING)
    return gguf


def tensor_name_map(arch, blocks: int):
    """gguf-py's map of Hugging Face names to llama.cpp's for the architecture. Its TensorNameMap updates the table of
    block tensors' names its class shares with an architecture's own names, in place (Qwen4-Exp's indexer norms over
    Hy4's), which every later map in the process would take: the table is put back as it was."""
    table = gguf_py().TensorNameMap.block_mappings_cfg
    kept = dict(table)
    try:
        return gguf_py().get_tensor_name_map(arch, blocks)
    finally:
        table.clear()
        table.update(kept)


@contextmanager
def gguf_quiet():
    """gguf-py's warnings kept from the user where the converter's own steps make them (a key written twice, a special
    token it has no field for): setLevel, which clears the loggers' cached levels, as assigning `level` does not."""
    logger = logging.getLogger("gguf")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def first_of(hparams: dict, *keys: str) -> Any:
    """The value of the first of these keys the config has (as the converter's find_hparam)."""
    return next((hparams[key] for key in keys if key in hparams), None)


# a sliding layers' rope base, as releases' configs name it (the converter's keys for it)
LOCAL_ROPE_THETA = (
    "local_rope_theta",
    "rope_local_theta",
    "rope_theta_local",
    "swa_rope_theta",
    "rope_local_base_freq",
)


def rope_parameters(hparams: dict) -> tuple[dict, dict]:
    """The config's rope parameters as the converter reads them, and the global layers' (a model with rope of its
    own per kind of layer, as Gemma 3, keeps them under full_attention; the others have one set, into which the
    converter mirrors the config's rope_theta, partial_rotary_factor and original_max_position_embeddings, and
    `type` as `rope_type`, as transformers 4 wrote them, and a sliding layers' base under sliding_attention, as a
    release's config names it: dots3-note's swa_rope_theta)."""
    by_layer = dict(hparams.get("rope_parameters") or hparams.get("rope_scaling") or {})
    if "full_attention" not in by_layer and "sliding_attention" not in by_layer:
        if (local := first_of(hparams, *LOCAL_ROPE_THETA)) is not None:
            by_layer["sliding_attention"] = {"rope_theta": local}
        for key in ("rope_theta", "partial_rotary_factor", "original_max_position_embeddings"):
            if key not in by_layer and hparams.get(key) is not None:
                by_layer[key] = hparams[key]
        if "rope_type" not in by_layer and by_layer.get("type") is not None:
            by_layer["rope_type"] = by_layer["type"]
    return by_layer, dict(by_layer.get("full_attention", by_layer))


def turned_at_llama_cpp_base(hparams: dict, where: Path, arch: str) -> None:
    """Refuses a rope base other than 10000, which llama.cpp takes for an architecture whose converter writes none
    (StableLM's, GPT-NeoX's): it would compute another model."""
    theta = rope_parameters(hparams)[1].get("rope_theta", 10000)
    if theta != 10000:
        raise ConfigMismatchError(
            f"{where}: rope_theta is {theta}, and llama.cpp's {arch} turns rope at 10000: it would compute another "
            "model; serve this one with transformers or vLLM"
        )


def rotary_dimensions(hparams: dict, rope: dict) -> int:
    """The dimensions of a head that rope rotates (all but for a partial rotary factor)."""
    return int(rope.get("partial_rotary_factor", 1.0) * hparams["hidden_size"]) // hparams["num_attention_heads"]


# Rope types the converter writes as frequency factors of its own (a rope_freqs tensor, the family's `computed`)
# rather than in the header: Llama 3's, and Gemma 4's proportional rope on part of a global layer's heads
ROPE_BY_FACTORS = ("llama3", "proportional")


# The keys the converter's TextModel finds the MLP's width by, in its order (Command R MoE's dense layers' first)
MLP_WIDTH_KEYS = (
    "prefix_dense_intermediate_size",
    "dense_intermediate_size",
    "intermediate_size",
    "n_inner",
    "hidden_dim",
)


def text_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path, expert_groups: bool = False) -> None:
    """The converter's TextModel's: sizes, heads, rope (linear and YaRN scaling), norm epsilon, head width.
    expert_groups: the family routes as llama.cpp does by the config's expert groups and gating function (DeepSeek's
    routing); for the others such a setting is refused, as llama.cpp would route by it where transformers does not."""
    gguf = gguf_py()
    where = folder / "config.json"
    writer.add_block_count(blocks)
    # (the MLP's width: the first of these keys the config has, as the converter finds it, though its value be none)
    width = first_of(hparams, *MLP_WIDTH_KEYS)
    for value, add in (
        (hparams.get("max_position_embeddings"), writer.add_context_length),
        (hparams.get("hidden_size"), writer.add_embedding_length),
        (width, writer.add_feed_forward_length),
        (hparams.get("num_attention_heads"), writer.add_head_count),
        (hparams.get("num_key_value_heads"), writer.add_head_count_kv),
    ):
        if value is not None:
            add(value)
    if hparams.get("is_causal") is False:
        writer.add_causal_attention(False)
    rope_by_layer, rope = rope_parameters(hparams)
    rope_type = rope.get("rope_type")
    if rope_type == "linear" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope_type == "yarn" and rope.get("factor") is not None:
        if rope.get("original_max_position_embeddings") is None:
            raise ConfigMismatchError(
                f"{where}: YaRN rope scaling without original_max_position_embeddings, which "
                "llama.cpp needs; add the context the model was trained with to rope_parameters"
            )
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for value, add in (
            (rope.get("extrapolation_factor"), writer.add_rope_scaling_yarn_ext_factor),
            (rope.get("attention_factor", rope.get("attn_factor")), writer.add_rope_scaling_yarn_attn_factor),
            (rope.get("beta_fast"), writer.add_rope_scaling_yarn_beta_fast),
            (rope.get("beta_slow"), writer.add_rope_scaling_yarn_beta_slow),
        ):
            if value is not None:
                add(value)
    elif rope_type not in (None, "default") and rope_type.lower() not in ROPE_BY_FACTORS:
        raise ConfigMismatchError(
            f"{where}: rope type {rope_type!r} is not written as GGUF by unshard "
            "yet; write a folder and use llama.cpp's convert_hf_to_gguf.py"
        )
    if rope.get("mrope_section") is not None:  # (M-RoPE: the head's dimensions by time, height and width, padded to 4)
        writer.add_rope_dimension_sections([*rope["mrope_section"], 0, 0, 0, 0][:4])
    if rope.get("rope_theta") is not None:
        writer.add_rope_freq_base(rope["rope_theta"])
    if rope_by_layer.get("sliding_attention", {}).get("rope_theta") is not None:
        writer.add_rope_freq_base_swa(rope_by_layer["sliding_attention"]["rope_theta"])
    if (rms_norm_eps := first_of(hparams, "rms_norm_eps", "norm_eps")) is not None:
        writer.add_layer_norm_rms_eps(rms_norm_eps)
    if (norm_eps := first_of(hparams, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")) is not None:
        writer.add_layer_norm_eps(norm_eps)  # (a LayerNorm's: StarCoder 2's, StableLM's)
    if (experts := first_of(hparams, "num_local_experts", "num_experts", "n_routed_experts")) is not None:
        writer.add_expert_count(experts)
    if (used := first_of(hparams, "num_experts_per_tok", "num_experts_per_token", "top_k_experts")) is not None:
        writer.add_expert_used_count(used)
    if expert_groups:
        _expert_groups(writer, hparams, where)
    else:
        for key in ("n_group", "topk_group", *GATING_KEYS):  # (expert groups, gating other than softmax)
            if hparams.get(key) is not None:
                raise ConfigMismatchError(
                    f"{where}: {key} is set, an expert routing unshard does not write as GGUF for "
                    "this family yet; write a folder and use llama.cpp's convert_hf_to_gguf.py"
                )
    if hparams.get("head_dim") is not None:
        writer.add_key_length(hparams["head_dim"])
        writer.add_value_length(hparams["head_dim"])
    writer.add_file_type(ftype)


def qwen2moe_hyperparameters(
    writer, hparams: dict, ftype, blocks: int, folder: Path, expert_groups: bool = False
) -> None:
    """The converter's Qwen2MoeModel's, which its other MoE models build on: the TextModel's, then the experts' and
    a shared expert's widths."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups)
    if hparams.get("moe_intermediate_size") is not None:
        writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    if hparams.get("shared_expert_intermediate_size") is not None:
        writer.add_expert_shared_feed_forward_length(hparams["shared_expert_intermediate_size"])


def llama_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path, expert_groups: bool = False) -> None:
    """The converter's LlamaModel's: the TextModel's, then the vocabulary's size and the dimensions rope rotates (a
    whole head's)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups)
    writer.add_vocab_size(hparams["vocab_size"])
    writer.add_rope_dimension_count(hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"])


# the config keys the converter reads the experts' gating function from, the first set one
GATING_KEYS = (
    "score_function",
    "scoring_func",
    "score_func",
    "moe_router_activation",
    "moe_router_activation_func",
    "expert_selection_fn",
)


def sliding_three_in_four(blocks: int) -> list[str]:
    """layer_types of the layout llama.cpp assumes for Command R7B's and AFMoE's layers: a sliding window on three
    layers in four, the fourth global."""
    return ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(blocks)]


def with_leading_dense_layers(hparams: dict, where: Path, arch: str) -> dict:
    """The config with first_k_dense_replace as transformers computes it: from mlp_layer_types where the config has
    them (transformers reads which layers are dense from them, the converter counts first_k_dense_replace); a dense
    layer after a sparse one, which llama.cpp does not run, is one line."""
    kinds = hparams.get("mlp_layer_types")
    if kinds is None:
        return hparams
    dense = next((i for i, kind in enumerate(kinds) if kind != "dense"), len(kinds))
    if any(kind != "sparse" for kind in kinds[dense:]):
        raise ConfigMismatchError(
            f"{where}: mlp_layer_types has a dense layer after a sparse one, and llama.cpp's {arch} runs dense layers "
            "first only; serve this model with transformers or vLLM"
        )
    return {**hparams, "first_k_dense_replace": dense}


def routed_by_sigmoid(hparams: dict, where: Path) -> dict:
    """The config of a family whose transformers model routes by a sigmoid whatever its config.json says, as
    llama.cpp should route it: a config naming no gating function (transformers saves none: llama.cpp would take it
    for softmax, or for none) gets sigmoid; one naming another is one line."""
    gating = first_of(hparams, *GATING_KEYS)
    if gating is None:
        return {**hparams, "scoring_func": "sigmoid"}
    if gating != "sigmoid":
        raise ConfigMismatchError(
            f"{where}: the experts' gating function is {gating!r}, and transformers' {hparams.get('model_type')} "
            "routes by a sigmoid whatever the config says (llama.cpp would follow the config); fix or remove it"
        )
    return hparams


def _expert_groups(writer, hparams: dict, where: Path) -> None:
    """The experts' groups and gating function, as the converter's TextModel writes them."""
    gguf = gguf_py()
    if hparams.get("n_group") is not None:
        writer.add_expert_group_count(hparams["n_group"])
    if hparams.get("topk_group") is not None:
        writer.add_expert_group_used_count(hparams["topk_group"])
    gating = first_of(hparams, *GATING_KEYS)
    if gating is not None:
        functions = {"sigmoid": "SIGMOID", "softmax": "SOFTMAX", "sqrtsoftplus": "SQRTSOFTPLUS"}
        if gating not in functions:
            raise ConfigMismatchError(
                f"{where}: the experts' gating function {gating!r} is not one llama.cpp computes "
                f"({', '.join(functions)}); serve this model with transformers or vLLM"
            )
        writer.add_expert_gating_func(getattr(gguf.ExpertGatingFuncType, functions[gating]))


def check_query_scale(hparams: dict, arch_name: str, largest_blocks: int, where: Path) -> None:
    """llama.cpp scales Gemma's queries by 1/sqrt(head_dim), or 1/sqrt(hidden_size / heads) for the layer count of
    the 27B model, whatever query_pre_attn_scalar says: where they differ it would compute another model."""
    blocks = hparams["num_hidden_layers"]
    scale = (
        hparams["hidden_size"] // hparams["num_attention_heads"] if blocks == largest_blocks else hparams["head_dim"]
    )
    if hparams.get("query_pre_attn_scalar", scale) != scale:
        raise ConfigMismatchError(
            f"{where}: query_pre_attn_scalar is {hparams['query_pre_attn_scalar']}, but "
            f"llama.cpp's {arch_name} scales queries by 1/sqrt({scale}) and would compute another "
            "model; serve this one with transformers or vLLM"
        )


def special_vocab(folder: Path, **options):
    """gguf-py's SpecialVocab of the folder (special token ids, merges, chat template), which reads its files
    as UTF-8 and JSON: one of them that is neither is one line (--no-check lets such files through the plan)."""
    try:
        return gguf_py().SpecialVocab(folder, **options)
    except ValueError as e:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        path, why = next(iter(unreadable_model_files(folder)), (folder, str(e)[:200]))
        raise ConfigMismatchError(f"{path}: {why}; a GGUF file holds the tokenizer's files: fix or remove it") from None


def json_or_empty(path: Path) -> dict:
    return read_json(path, "fix or remove it", ConfigMismatchError) if path.is_file() else {}


def processor_config(folder: Path) -> dict[str, Any]:
    """The image processor's settings as the converter reads them: preprocessor_config.json, then
    processor_config.json over it (its image_processor's settings at the top)."""
    settings: dict[str, Any] = {}
    for name in ("preprocessor_config.json", "processor_config.json"):
        found = json_or_empty(folder / name)
        for nested in ("media_proc_cfg", "image_processor"):
            if isinstance(found.get(nested), dict):
                found = {**found, **found[nested]}
        settings.update(found)
    return settings


def pixel_bounds(processor: dict, where: Path) -> tuple[int, int]:
    """The image processor's smallest and largest images in pixels, which the converter writes into the mmproj file:
    the Hub's min_pixels and max_pixels, which transformers 5 saves as the size's shortest and longest edge."""
    size = processor.get("size") or {}
    smallest = processor.get("min_pixels", size.get("shortest_edge"))
    largest = processor.get("max_pixels", size.get("longest_edge"))
    if smallest is None or largest is None:
        raise ConfigMismatchError(
            f"{where}: the image processor names no min_pixels and max_pixels (nor the size's shortest and longest "
            "edge), which the mmproj file carries; pass --config-from the model's own folder"
        )
    return int(smallest), int(largest)


def fixed_in_code(where: Path, tower: str, graph: str, runs: dict[str, tuple[Any, Any]]) -> None:
    """One line where a tower's config says otherwise than llama.cpp's graph computes whatever the file says. runs:
    each setting's (value in the config, value in the graph's code)."""
    for key, (found, computed) in runs.items():
        if found != computed:
            raise ConfigMismatchError(
                f"{where}: the {tower} tower's {key} is {found}, and llama.cpp's {graph} computes {computed}; serve "
                "this model with transformers or vLLM"
            )


def mmproj_model_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's MmprojModel's types (families' MmprojPart.forced_type): the patch embedding and a patch merger
    in F16 in an f16 file, else F32; position embeddings in F32."""
    if ".patch_embd.weight" in name or ".patch_merger.weight" in name:
        return gguf.GGMLQuantizationType.F16 if file_type == "f16" else gguf.GGMLQuantizationType.F32
    if ".position_embd." in name:
        return gguf.GGMLQuantizationType.F32
    return None

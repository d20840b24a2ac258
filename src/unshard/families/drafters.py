"""Drafters for speculative decoding, as their trainers save them (transformers has no class of them, so their names
are kept as saved):
- vLLM's `speculators` (save_pretrained, their layers' config nested in `transformer_layer_config`), each with its own
  head over a draft vocabulary and the maps between it and the target's (d2t: each draft token's offset to its target
  id; t2d);
- SGLang's SpecForge (its export_to_hf's folder: a flat Llama or Qwen3 config, DFlash's settings in `dflash_config`).

The kinds:
- EAGLE-3 (Eagle3DraftModel; Eagle3Speculator in speculators' older releases; SpecForge's LlamaForCausalLMEagle3, its
  layer under `midlayer.`): one Llama layer whose attention reads the token's embedding beside a projection (fc) of
  three of the target's hidden states, with the target's embedding;
- DFlash (SpecForge's DFlashDraftModel) and DSpark (DSparkDraftModel; DSparkSpeculator): Qwen3 layers drafting a block
  of tokens at once from the target's hidden states (no embedding: the target's); DSpark's beside a Markov head (a
  bias by the previous token) and a confidence head;
- DFlash2 (speculators' DFlash2DraftModel): DFlash's layers, each sublayer between local convolutions of the block,
  and a candidate selector rescoring each position's top-k tokens by the one drafted before, over the target's
  vocabulary.

GGUF: as llama.cpp's converter writes them (EAGLE-3 by its LlamaModel switched to llama.cpp's eagle3; DFlash, DFlash2
and DSpark by its DFlashModel and DSparkModel, llama.cpp's dflash; DFlash2 as it reads its makers' form), given the
target's folder (its --target-model-dir: here --target-from, or the verifier the config names): the target's
vocabulary and sizes, d2t last as absolute target ids, t2d left out. llama.cpp runs a drafter beside its target
(llama-server's --model-draft)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import llama_hyperparameters
from .llama import llama_computed
from .parts import LLAMA_CPP_GGUF_PY, NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model
from .qwen import qwen_hyperparameters


def as_the_converter_reads(hparams: dict, where: Path) -> dict:
    """The config with its layer's nested in, as the converter merges `transformer_layer_config` over it."""
    return {**hparams, **(hparams.get("transformer_layer_config") or {})}


def eagle3_checked(hparams: dict, where: Path) -> list[str]:
    """Refuses what llama.cpp's eagle3 would not load or would compute otherwise: other than one Llama layer (a
    Qwen3 layer's q and k norms, biases), an activation other than SiLU, other than three target layers, a norm per
    target layer (fc_norm); of ModelOpt's settings (under eagle_config), EAGLE-1's drafter, other norms, parallel
    drafting; target layers named where the converter does not read them (_check_nested_capture_layers). Returns the
    notes of what it computes otherwise: past the first drafted token, and of ModelOpt's norms."""
    layer, nested = hparams.get("transformer_layer_config") or {}, hparams.get("eagle_config") or {}
    captured = hparams.get("eagle_aux_hidden_state_layer_ids") or nested.get("eagle_aux_hidden_state_layer_ids")
    why = None
    if layer.get("model_type", "llama") != "llama":
        why = f"its layer is {layer['model_type']}'s, and llama.cpp's eagle3 runs a Llama layer (no q and k norms)"
    elif hparams.get("num_hidden_layers") != 1:
        why = f"it has {hparams.get('num_hidden_layers')} layers, and llama.cpp's eagle3 runs one"
    elif hparams.get("hidden_act", "silu") != "silu":
        why = f"hidden_act is {hparams['hidden_act']!r}, and llama.cpp's eagle3 runs SiLU"
    elif hparams.get("attention_bias") or hparams.get("mlp_bias"):
        why = "its layer has biases, which llama.cpp's eagle3 has no place for"
    elif hparams.get("fc_norm"):
        why = "fc_norm is on (a norm per target layer), which llama.cpp's eagle3 does not apply"
    elif len(captured or [0, 0, 0]) != 3:
        why = "it reads other than three target layers, and llama.cpp's eagle3 reads exactly three"
    elif not nested.get("use_aux_hidden_state", True):
        why = "it is an EAGLE-1 drafter (use_aux_hidden_state off: no fc), and llama.cpp's eagle3 runs EAGLE-3's"
    elif not nested.get("use_last_layernorm", True) or nested.get("use_mtp_layernorm"):
        why = "its norms are not EAGLE-3's (use_last_layernorm off or use_mtp_layernorm on), which llama.cpp's runs"
    elif int(nested.get("parallel_draft_step") or 1) > 1:
        why = "it drafts in parallel (parallel_draft_step), and llama.cpp's eagle3 drafts one token a step"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: serve this drafter with vLLM or SGLang")
    _check_nested_capture_layers(hparams, where)
    notes = []
    if hparams.get("norm_output"):
        notes.append(
            "norm_output is on: the drafter was trained on its own normed states for the tokens it drafts after the "
            "first, and llama.cpp feeds back the states before the norm, so its drafts past the first token differ "
            "from vLLM's (the first is the same)"
        )
    if "use_input_layernorm_in_first_layer" in nested:  # (ModelOpt's export)
        notes.append(
            "ModelOpt's Hugging Face trainer norms the target's projected hidden states twice before the attention "
            "(its layer's input_layernorm, then hidden_norm), and llama.cpp's eagle3 norms them once (hidden_norm), as "
            "speculators and SpecForge train them: if this drafter was trained by it (not by ModelOpt's Megatron "
            "trainer), its drafts in llama.cpp differ from ModelOpt's (the target still verifies each one)"
        )
    if "sliding_attention" in (hparams.get("layer_types") or []):
        notes.append(
            f"llama.cpp's eagle3 attends over the whole context, where the drafter's layer keeps a window of "
            f"{hparams.get('sliding_window')} tokens: the same up to that length"
        )
    return notes


def _check_nested_capture_layers(hparams: dict, where: Path) -> None:
    """A drafter naming the target layers it was trained on under eagle_config alone (SpecForge's and ModelOpt's key,
    each the output of a layer, counted from 0), which the converter does not read: it takes the top-level
    eagle_aux_hidden_state_layer_ids, else 2, n/2 and n - 3 of the target's n layers, each the input of a layer.
    Where those are the drafter's (SpecForge's and ModelOpt's default layers), the file is the converter's and reads
    what it was trained on; otherwise one line giving the ids to add."""
    trained = (hparams.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if hparams.get("eagle_aux_hidden_state_layer_ids") is not None or not trained:
        return
    layers = hparams["target_config"]["num_hidden_layers"]
    wanted = [i + 1 for i in trained]
    if wanted != [2, layers // 2, layers - 3]:
        raise ConfigMismatchError(
            f"{where}: it names its target layers under eagle_config alone ({trained}), which llama.cpp's converter "
            f"does not read (it takes eagle_aux_hidden_state_layer_ids, else layers 2, n/2 and n-3 of the target's "
            f"{layers}, counted as inputs where eagle_config counts outputs), so the file would read other layers than "
            f'it was trained on: add "eagle_aux_hidden_state_layer_ids": {wanted} to config.json'
        )


def drafter_target(hparams: dict, where: Path, given: Path | None) -> Path:
    """The target's folder: the one given, else the verifier the config names, where that is a folder here or a model
    in the Hugging Face cache; one line where it is neither, or lacks a config or tokenizer."""
    named = ((hparams.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    folder = given or (_local_model(named) if named else None)
    if folder is None:
        said = (
            f"its verifier {named!r} is not a folder here nor a model in the Hugging Face cache"
            if named
            else ("its config names no verifier")
        )
        raise ConfigMismatchError(
            f"{where}: a drafter's GGUF file takes the vocabulary and sizes of the model it drafts for, and "
            f"{said}: pass --target-from DIR, the target model's folder"
        )
    if not (folder / "config.json").is_file() or not any(
        (folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model")
    ):
        raise ConfigMismatchError(
            f"{folder}: not a model folder with a config.json and a tokenizer, which a drafter's GGUF file takes "
            "from the model it drafts for; pass --target-from the target model's folder"
        )
    return folder


def _local_model(named: str) -> Path | None:
    """A verifier's folder: the path itself, or the Hugging Face cache's snapshot of a Hub model (no download)."""
    if Path(named).is_dir():
        return Path(named)
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(named, "config.json")
    except Exception:  # (not a Hub model's name)
        return None
    return Path(found).parent if isinstance(found, str) else None


def eagle3_opening_keys(writer, hparams: dict) -> None:
    """What the converter writes as it switches to eagle3, right after the architecture: the target layers whose
    hidden states the drafter reads (the config's, else the converter's choice of three of the target's), the
    target's width, and where the layer and fc apply their norms."""
    target = hparams["target_config"]
    layers = target["num_hidden_layers"]
    writer.add_target_layers(hparams.get("eagle_aux_hidden_state_layer_ids") or [2, layers // 2, layers - 3])
    writer.add_target_hidden_size(hparams.get("target_hidden_size") or target["hidden_size"])
    writer.add_norm_before_residual(bool(hparams.get("norm_before_residual", False)))
    writer.add_norm_before_fc(bool(hparams.get("norm_before_fc", False)))


def draft_to_target_ids(values: dict, hparams: dict, where: Path) -> dict:
    """d2t as the converter writes it: each draft token's target id (its offset plus its index), as int64; refused
    in one line where an id is outside the target's vocabulary or twice there, as the converter refuses it. t2d
    (the other way round), which llama.cpp does not read, is left out."""
    import numpy as np

    offsets = np.asarray(values["d2t"]).astype(np.int64).reshape(-1)
    ids = offsets + np.arange(offsets.size, dtype=np.int64)
    vocabulary = hparams["target_config"]["vocab_size"]
    if ((ids < 0) | (ids >= vocabulary)).any() or np.unique(ids).size != ids.size:
        raise ConfigMismatchError(
            f"{where}: d2t maps draft tokens outside the target's vocabulary of {vocabulary}, or two onto one: it "
            "is not this target's drafter; pass --target-from the model it was trained for"
        )
    return {"d2t": ids}


DSPARK_CLASSES = ("DSparkDraftModel", "DSparkSpeculator")
DFLASH2_CLASS = "DFlash2DraftModel"
# (DFlash2's local convolutions and candidate selector: speculators keeps their sizes at its config's top level)
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def _architecture(hparams: dict) -> str | None:
    return (hparams.get("architectures") or [None])[0]


def as_the_dflash_converter_reads(hparams: dict, where: Path) -> dict:
    """The config as the converter's DFlashModel reads it: a speculators drafter's layer config merged over it, and
    a DSpark drafter's settings (speculators' at the top, its target layers counted past the embedding) normalized into
    DFlash's `dflash_config` (SpecForge's form), as its DSparkModel normalizes them. Whether a DSpark drafter samples
    the anchor's position is decided first: by the config, else by its form (EAGLE-3-like exports do not).

    speculators' DFlash2 drafter is normalized the same way, its convolutions' and selector's sizes nested too: the
    converter's DFlashModel reads DFlash2 in that form alone (its makers'), and of speculators' it would write a file
    without them, which llama.cpp refuses to load."""
    anchor = hparams.get(
        "sample_from_anchor",
        "transformer_layer_config" not in hparams and "aux_hidden_state_layer_ids" not in hparams,
    )
    hparams = as_the_converter_reads(hparams, where)
    architecture = _architecture(hparams)
    if architecture not in (*DSPARK_CLASSES, DFLASH2_CLASS):
        return hparams
    if "aux_hidden_state_layer_ids" in hparams:
        nested = {
            "mask_token_id": hparams.get("mask_token_id"),
            "target_layer_ids": [i - 1 for i in hparams["aux_hidden_state_layer_ids"]],
        }
    else:
        nested = {key: hparams[key] for key in ("target_layer_ids", "mask_token_id") if key in hparams}
    if architecture == DFLASH2_CLASS:
        if "dflash_config" in hparams:  # (its makers' form: the converter's own)
            return hparams
        return {"dflash_config": {**nested, **{key: hparams[key] for key in DFLASH2_KEYS if key in hparams}}, **hparams}
    return {"dflash_config": nested, **hparams, "sample_from_anchor": anchor}


def dflash_checked(hparams: dict, where: Path) -> list[str]:
    """Refuses what the converter or llama.cpp's dflash does not take of a DSpark drafter: a Markov head other than
    the first-order one (vanilla), a draft vocabulary larger than the target's, a confidence head that reads the
    layers' states alone (llama.cpp's reads the Markov head's embedding beside them); of a DFlash one, DFlash2's
    convolutions and selector, which the converter reads under other names, and ModelOpt's heads (its DSpark and
    Domino drafters, exported under DFlash's name), which it does not read; of a DFlash2 one, what llama.cpp refuses
    to load or would draft otherwise (dflash2_refusal). Returns the notes of what llama.cpp computes otherwise."""
    nested = hparams.get("dflash_config") or {}
    architecture, why = _architecture(hparams), None
    if architecture == DFLASH2_CLASS:
        why = dflash2_refusal(hparams)
    elif architecture not in DSPARK_CLASSES:
        if "conv_kernel_size" in nested or "selector_rank" in nested:
            why = "it has DFlash2's local convolutions and candidate selector, and is named DFlash's (DFlashDraftModel)"
        elif (head := nested.get("projector_type") or "dflash") != "dflash":  # (ModelOpt's DSpark and Domino)
            why = (
                f"dflash_config's projector_type is {head!r}: a head beside DFlash's layers, under DFlash's name "
                "(DFlashDraftModel), which llama.cpp's converter reads as DFlash's alone"
            )
    elif (markov := hparams.get("markov_head_type", nested.get("markov_head_type", "vanilla"))) != "vanilla":
        why = f"markov_head_type is {markov!r}, and llama.cpp's dflash runs the vanilla Markov head"
    elif (hparams.get("draft_vocab_size") or 0) > hparams["vocab_size"]:
        why = f"draft_vocab_size {hparams['draft_vocab_size']} is larger than the vocabulary ({hparams['vocab_size']})"
    elif _confidence_head(hparams) and not hparams.get(
        "confidence_head_with_markov", nested.get("confidence_head_with_markov", False)
    ):
        why = "the confidence head reads the layers' states alone, and llama.cpp's reads the Markov head's beside them"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: serve this drafter with vLLM or SGLang")
    return _block_attention_notes(hparams)


def _block_attention_notes(hparams: dict) -> list[str]:
    """Where llama.cpp's dflash attends inside the drafted block otherwise than a speculators drafter was trained to:
    it attends one way in every layer (causally where the config says `is_causal`, else both ways), where speculators
    trains its window layers causally unless sliding_window_non_causal is on, and its other layers both ways."""
    if "sliding_window_non_causal" not in hparams:  # (not speculators' form: how it was trained is not said)
        return []
    windowed = [kind == "sliding_attention" for kind in hparams.get("layer_types") or []]
    trained_causal = [window and not hparams["sliding_window_non_causal"] for window in windowed]
    runs_causal = bool(hparams.get("is_causal", (hparams.get("dflash_config") or {}).get("causal", False)))
    if all(trained == runs_causal for trained in trained_causal):
        return []
    if all(trained_causal):
        trained = "causally"
        fix = ': add "is_causal": true to its config.json for llama.cpp to attend causally, as trained'
    elif any(trained_causal):
        trained, fix = "causally in its window layers and both ways in the others", ""
    else:
        trained, fix = "both ways", ""
    return [
        f"inside the drafted block its layers were trained attending {trained}, and llama.cpp's dflash attends "
        f"{'causally' if runs_causal else 'both ways'} in every layer: its drafts differ from vLLM's{fix}"
    ]


def dflash2_refusal(hparams: dict) -> str | None:
    """Why llama.cpp would not load a DFlash2 drafter or would draft otherwise, if it would: its convolutions' or
    selector's sizes missing, a width its selector's lattice of top-k candidates does not fit in (k(k + 1) values) or
    its channel groups do not divide, the anchor's position sampled (llama.cpp's DFlash drafts after the anchor)."""
    nested = hparams.get("dflash_config") or {}
    sizes = {key: int(nested.get(key) or 0) for key in DFLASH2_KEYS}
    width = hparams["hidden_size"]
    if min(sizes.values()) <= 0:
        return f"it lacks DFlash2's {', '.join(k for k, v in sizes.items() if v <= 0)}, which llama.cpp's dflash needs"
    if width % sizes["conv_group_size"]:
        return f"its width {width} is not a whole number of conv_group_size {sizes['conv_group_size']} channels"
    if width < (top := sizes["selector_top_k"]) * (top + 1):
        return (
            f"selector_top_k {top} takes a width of {top * (top + 1)} in llama.cpp's selector, and the drafter's is "
            f"{width}"
        )
    if hparams.get("sample_from_anchor"):
        return "it samples the anchor's position too, and llama.cpp's DFlash drafts the positions after it"
    return None


def _confidence_head(hparams: dict) -> bool:
    """Whether a DSpark drafter has a confidence head: speculators' config says so at the top; SpecForge's under
    dflash_config, else by the weight of its loss (a head trained with none is not built)."""
    nested = hparams.get("dflash_config") or {}
    trained = float(nested.get("confidence_head_alpha") or 0.0) > 0.0
    return bool(hparams.get("enable_confidence_head", nested.get("enable_confidence_head", trained)))


def dflash_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's DFlashModel's: its Qwen3 layers' header, then DFlash's from dflash_config (else the top): the
    rotary width, the values' scale, the block it drafts, the logits' scale and cap, the embedding's scale, the target
    layers it reads as their ids past the embedding, the window and the layers in it, whether it attends causally,
    and rotary sections of one where the target's rotary is multimodal; a DSpark drafter's then says whether it samples
    the anchor's position too and has a confidence head (its DSparkModel's)."""
    qwen_hyperparameters(writer, hparams, ftype, blocks, folder)
    nested = hparams.get("dflash_config") or {}
    head = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    if (partial := (hparams.get("rope_parameters") or {}).get("partial_rotary_factor")) is not None:
        writer.add_rope_dimension_count(int(head * partial))
    if nested.get("attention_value_scale") is not None:
        writer.add_attn_value_scale(float(nested["attention_value_scale"]))
    writer.add_block_size(nested.get("block_size", hparams.get("block_size", 16)))
    if "conv_kernel_size" in nested:  # (DFlash2's)
        writer.add_conv_kernel_size(int(nested["conv_kernel_size"]))
        writer.add_conv_group_size(int(nested["conv_group_size"]))
        writer.add_selector_rank(int(nested["selector_rank"]))
        writer.add_selector_top_k(int(nested["selector_top_k"]))
    for key, add in (
        ("output_multiplier", writer.add_logit_scale),
        ("final_logit_softcapping", writer.add_final_logit_softcapping),
        ("input_embedding_scale", writer.add_embedding_scale),
    ):
        value = nested.get(key, hparams.get(key))
        if value is not None and (key != "final_logit_softcapping" or float(value) > 0):
            add(float(value))
    if layers := nested.get("target_layer_ids", hparams.get("target_layer_ids", [])):
        writer.add_target_layers([i + 1 for i in layers])
    window = nested.get("swa_window_size") or hparams.get("sliding_window")
    if (hparams.get("use_sliding_window") or nested.get("use_swa")) and window:
        writer.add_sliding_window(window)
        kinds = hparams.get("layer_types") or []
        writer.add_sliding_window_pattern(
            [True] * blocks if nested.get("use_swa") else [kind == "sliding_attention" for kind in kinds]
        )
    if (causal := hparams.get("is_causal", nested.get("causal"))) is not None:
        writer.add_causal_attention(bool(causal))
    target = hparams["target_config"]
    if "mrope_section" in (target.get("rope_parameters") or target.get("rope_scaling") or {}):
        writer.add_rope_dimension_sections([head // 2, 0, 0, 0])
    if _architecture(hparams) in DSPARK_CLASSES:
        writer.add_sample_from_anchor(bool(hparams["sample_from_anchor"]))
        writer.add_has_confidence_head(_confidence_head(hparams))


def dflash_mask_token(writer, hparams: dict, folder: Path) -> None:
    """The token the drafter fills its block with, after the target's vocabulary, as the converter names it."""
    if (hparams.get("dflash_config") or {}).get("mask_token_id") is not None:
        writer.add_mask_token_id(int(hparams["dflash_config"]["mask_token_id"]))


EAGLE3 = GGUFPart(
    "EAGLE3",
    hyperparameters=llama_hyperparameters,
    opening_keys=eagle3_opening_keys,
    target=drafter_target,
    as_the_converter_reads=as_the_converter_reads,
    check_config=eagle3_checked,
    computed=llama_computed,
    permute_qk=True,
    llama_vocabulary=True,
    # (the converter's names: the layer's own under model.layers (SpecForge's midlayer the first), the norm of the
    # target's hidden states as a second attention norm, that of fc's input as the encoder's output norm, fc as itself)
    renames=(
        (r"^midlayer\.", "layers.0."),
        (r"^layers\.(\d+)\.hidden_norm\.", r"model.layers.\1.self_attn.norm."),
        (r"^input_norm\.", "model.hidden_norm."),
        (r"^(layers|embed_tokens|norm|fc)\.", r"model.\1."),
    ),
    written_last=r"^(d2t|t2d)$",
    last_from_tensors=draft_to_target_ids,
)

DFLASH = GGUFPart(
    "DFLASH",
    hyperparameters=dflash_hyperparameters,
    target=drafter_target,
    vocabulary_of_target=True,
    after_vocabulary=dflash_mask_token,
    as_the_converter_reads=as_the_dflash_converter_reads,
    check_config=dflash_checked,
    # (the converter's names: every one under model., the confidence head's projection as DSpark's conf_proj,
    # DFlash2's selector's codebooks as weights)
    renames=(
        (r"^confidence_head\.proj\.", "conf_proj."),
        (r"^(?!model\.|conf_proj\.)", "model."),
        (r"^(model\.candidate_selector\.\w+_codebook)$", r"\1.weight"),
    ),
    unnamed_special_tokens=("mask",),
    written_last=r"^(d2t|t2d)$",
    last_from_tensors=draft_to_target_ids,
)


def drafter_family(name: str, model_type: str, architecture: str, also: tuple[str, ...], kind: str, gguf: GGUFPart):
    """A drafter's family: its GGUF file (llama.cpp's arch `gguf.arch`, beside its target) and nothing else: no
    trainer of Megatron, torchtitan or torchtune has a model of it, llm-compressor quantizes none, it has no towers."""
    return Family(
        name,
        model_type,
        architecture,
        also=also,
        tensors=NO_TABLE,
        megatron=Unsupported(f"Megatron-LM trains no {kind}", applies=False),
        **no_trainer_model(kind),
        fused_siblings=Unsupported(
            "llm-compressor, the oracle of --quantize, quantizes transformers' models, and a drafter is none"
        ),
        gguf=gguf,
        mmproj=Unsupported("a drafter has no towers", applies=False),
        moe_layout=NOT_A_MOE_INPUT,
        notes={
            "gguf": LLAMA_CPP_GGUF_PY.format(arch=gguf.arch.lower()) + "; given its target's folder (--target-from)"
        },
    )


FAMILIES = (
    drafter_family(
        "EAGLE-3 drafter",
        "eagle3",
        "Eagle3DraftModel",
        ("Eagle3Speculator", "LlamaForCausalLMEagle3"),
        "EAGLE-3 drafter",
        EAGLE3,
    ),
    drafter_family(
        "DFlash/DSpark drafter",
        "dspark",
        "DSparkDraftModel",
        ("DSparkSpeculator", "DFlashDraftModel", DFLASH2_CLASS),
        "DFlash or DSpark drafter",
        DFLASH,
    ),
)

"""EAGLE-3 drafters as vLLM's `speculators` trains them (Eagle3DraftModel; Eagle3Speculator in its older releases): one
decoder layer whose attention reads the token's embedding beside a projection (fc) of three of the target model's
hidden states, with the target's embedding, its own head over a draft vocabulary, and the maps between the two
vocabularies (d2t: each draft token's offset to its target id; t2d). speculators saves it with save_pretrained, its
layer's config nested in `transformer_layer_config`; transformers has no class of it, so its names are kept as saved.

GGUF: as llama.cpp's converter writes it (its LlamaModel, switched to llama.cpp's eagle3 by the draft vocabulary and the
one layer), given the target's folder (its --target-model-dir: here --target-from, or the verifier the config names):
the target's vocabulary and sizes, the three target layers up front, d2t last as absolute target ids, t2d left out.
llama.cpp runs the drafter beside its target alone (llama-server's --model-draft)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import llama_hyperparameters
from .llama import llama_computed
from .parts import LLAMA_CPP_GGUF_PY, NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def as_the_converter_reads(hparams: dict, where: Path) -> dict:
    """The config with its layer's nested in, as the converter merges `transformer_layer_config` over it."""
    return {**hparams, **(hparams.get("transformer_layer_config") or {})}


def eagle3_checked(hparams: dict, where: Path) -> list[str]:
    """Refuses what llama.cpp's eagle3 would not load or would compute otherwise: other than one Llama layer (a
    Qwen3 layer's q and k norms, biases), an activation other than SiLU, other than three target layers, a norm per
    target layer (fc_norm). Returns the notes of what it computes otherwise past the first drafted token."""
    layer = hparams.get("transformer_layer_config") or {}
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
    elif len(hparams.get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0]) != 3:
        why = "it reads other than three target layers, and llama.cpp's eagle3 reads exactly three"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: serve this drafter with vLLM")
    notes = []
    if hparams.get("norm_output"):
        notes.append(
            "norm_output is on: the drafter was trained on its own normed states for the tokens it drafts after the "
            "first, and llama.cpp feeds back the states before the norm, so its drafts past the first token differ "
            "from vLLM's (the first is the same)"
        )
    if "sliding_attention" in (hparams.get("layer_types") or []):
        notes.append(
            f"llama.cpp's eagle3 attends over the whole context, where the drafter's layer keeps a window of "
            f"{hparams.get('sliding_window')} tokens: the same up to that length"
        )
    return notes


def eagle3_target(hparams: dict, where: Path, given: Path | None) -> Path:
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
            f"{where}: an EAGLE-3 drafter's GGUF file takes the vocabulary and sizes of the model it drafts for, and "
            f"{said}: pass --target-from DIR, the target model's folder"
        )
    if not (folder / "config.json").is_file() or not any(
        (folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model")
    ):
        raise ConfigMismatchError(
            f"{folder}: not a model folder with a config.json and a tokenizer, which an EAGLE-3 drafter's GGUF file "
            "takes from the model it drafts for; pass --target-from the target model's folder"
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


def eagle3_maps(values: dict, hparams: dict, where: Path) -> dict:
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


EAGLE3 = GGUFPart(
    "EAGLE3",
    hyperparameters=llama_hyperparameters,
    opening_keys=eagle3_opening_keys,
    target=eagle3_target,
    as_the_converter_reads=as_the_converter_reads,
    check_config=eagle3_checked,
    computed=llama_computed,
    permute_qk=True,
    llama_vocabulary=True,
    # (the converter's names: the layer's own under model.layers, the norm of the target's hidden states as a second
    # attention norm, that of fc's input as the encoder's output norm, fc as itself)
    renames=(
        (r"^layers\.(\d+)\.hidden_norm\.", r"model.layers.\1.self_attn.norm."),
        (r"^input_norm\.", "model.hidden_norm."),
        (r"^(layers|embed_tokens|norm|fc)\.", r"model.\1."),
    ),
    written_last=r"^(d2t|t2d)$",
    last_from_tensors=eagle3_maps,
)

FAMILIES = (
    Family(
        "EAGLE-3 (speculators)",
        "eagle3",
        "Eagle3DraftModel",
        also=("Eagle3Speculator",),
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron-LM trains no EAGLE-3 drafter", applies=False),
        **no_trainer_model("EAGLE-3 drafter"),
        fused_siblings=Unsupported(
            "llm-compressor, the oracle of --quantize, quantizes transformers' models, and speculators' drafter is none"
        ),
        gguf=EAGLE3,
        mmproj=Unsupported("a drafter has no towers", applies=False),
        moe_layout=NOT_A_MOE_INPUT,
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="eagle3") + "; given its target's folder (--target-from)"},
    ),
)

"""What a sentence-transformers folder says beside the model (modules.json and its modules' folders), as llama.cpp's
converter reads it into a GGUF file: the Pooling module's pooling, and the Dense modules' projections after it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_py, json_or_empty

# sentence-transformers' pooling settings, and llama.cpp's pooling types by its modes' names
POOLING_FLAGS = (
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_lasttoken", "lasttoken"),
)
POOLING = {"mean": "MEAN", "cls": "CLS", "lasttoken": "LAST"}


def pooling_type(folder: Path):
    """The pooling the model's sentence-transformers modules name (modules.json, its Pooling module's config.json),
    as the converter reads it, or None where there is none."""
    path = next((m.get("path") for m in _modules(folder) if str(m.get("type", "")).endswith("Pooling")), None)
    if path is None:
        return None
    where = folder / path / "config.json"
    pooling = json_or_empty(where)
    mode = next((mode for flag, mode in POOLING_FLAGS if pooling.get(flag)), pooling.get("pooling_mode"))
    if mode not in POOLING:
        raise ConfigMismatchError(
            f"{where}: pooling {mode!r}, and llama.cpp pools by the mean, the first token or the last; serve this "
            "model with sentence-transformers"
        )
    return getattr(gguf_py().PoolingType, POOLING[mode])


def pooled(writer, hparams: dict, folder: Path) -> None:
    """The pooling sentence-transformers' config names, and the pooling before a classification head the model's
    config names (ModernBERT's, EuroBERT's), as the converter's _try_set_pooling_type writes them."""
    if (pooling := pooling_type(folder)) is not None:
        writer.add_pooling_type(pooling)
    if (classifier := hparams.get("classifier_pooling")) is not None:
        if classifier not in ("cls", "mean"):
            raise ConfigMismatchError(
                f"{folder / 'config.json'}: classifier_pooling {classifier!r}, and llama.cpp pools by the first token "
                "or the mean before a classifier; serve this model with transformers"
            )
        # (gguf-py 0.19's writer has no method for the key)
        writer.add_uint32(f"{writer.arch}.classifier.pooling_type", getattr(gguf_py().PoolingType, POOLING[classifier]))


def _modules(folder: Path) -> list[dict]:
    """modules.json's modules (none where there is no modules.json)."""
    modules = json_or_empty(folder / "modules.json") or []
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ConfigMismatchError(
            f"{folder / 'modules.json'}: not sentence-transformers' list of modules; fix or remove it"
        )
    return modules


def dense_modules(folder: Path) -> list[tuple[str, dict]]:
    """The Dense modules modules.json lists with their weights beside (PATH/model.safetensors), in its order: (PATH,
    its config.json), as the converter's EmbeddingGemma reads them."""
    paths = [str(m.get("path")) for m in _modules(folder) if str(m.get("type", "")).endswith("Dense")]
    return [
        (path, json_or_empty(folder / path / "config.json"))
        for path in paths
        if (folder / path / "model.safetensors").is_file()
    ]


# sentence-transformers' Dense module without an activation (llama.cpp applies none after its projections)
IDENTITY = "torch.nn.modules.linear.Identity"


def dense_weight(folder: Path, path: str) -> Any:
    """A Dense module's projection (PATH/model.safetensors' linear.weight) as float32 values. A bias, which the
    converter drops, or an activation, which llama.cpp does not apply: one line naming the module."""
    from safetensors import safe_open

    where = folder / path
    config = json_or_empty(where / "config.json")
    activation = config.get("activation_function", IDENTITY)
    if activation != IDENTITY:
        raise ConfigMismatchError(
            f"{where / 'config.json'}: activation_function {activation}, and llama.cpp applies none after the "
            "model's Dense projections: it would compute another embedding; serve this model with sentence-transformers"
        )
    try:
        with safe_open(where / "model.safetensors", framework="pt") as f:
            names = set(f.keys())
            weight = f.get_tensor("linear.weight") if "linear.weight" in names else None
    except Exception as e:  # (safetensors raises its own errors, and OSError, on a damaged file)
        raise ConfigMismatchError(
            f"{where / 'model.safetensors'}: unreadable ({type(e).__name__}: {e}); fix or remove it"
        ) from None
    if weight is None or weight.dim() != 2 or "linear.bias" in names:
        why = (
            "has no linear.weight"
            if weight is None or weight.dim() != 2
            else "has a bias, which llama.cpp's converter drops"
        )
        raise ConfigMismatchError(
            f"{where / 'model.safetensors'}: {why}: llama.cpp would compute another embedding; fix the module, or "
            "remove it from modules.json to write the model's embedding before it"
        )
    return weight.float().numpy()

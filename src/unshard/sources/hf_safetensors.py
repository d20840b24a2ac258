"""A Hugging Face model folder: `model.safetensors`, or shards with `model.safetensors.index.json`; or one
safetensors file of a whole state dict, alone (ColossalAI's `save_model(shard=False, use_safetensors=True)`
writes one where it is told: its config comes from --config-from).

Read as one more layout so that `unshard merge` can take Hub-style folders beside sharded
checkpoints (and `unshard convert` can re-shard or re-type one). Each tensor is one piece, read
through safetensors' memory map.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError, read_json
from . import compressed_tensors, fp8_blocks
from .base import Piece, SourceTensor
from .dcp_safetensors import SafetensorsFiles, dtype_of, read_header
from .placements import Block

LAYOUT, FILE_LAYOUT = "huggingface-safetensors", "safetensors-state-dict"


def _weight_files(folder: Path) -> list[Path]:
    # DCP's HuggingFaceStorageWriter shards (shard-*-model-*) are another layout, read elsewhere.
    return sorted(p for p in folder.glob("*.safetensors") if not p.name.startswith("shard-"))


def find_folder(src: Path) -> Path | None:
    if src.is_file():
        return src if src.suffix == ".safetensors" else None
    return src if src.is_dir() and (src / "config.json").is_file() and _weight_files(src) else None


def open_folder(src: Path) -> SafetensorsFiles:
    found = find_folder(src)
    if found is None:
        raise CheckpointError(f"{src}: no config.json and *.safetensors here")
    files = [found] if found.is_file() else _weight_files(found)
    tensors = {}
    for path in files:
        header, _ = read_header(path)
        for key, entry in header.items():
            if key != "__metadata__":
                shape = tuple(entry["shape"])
                tensors[key] = SourceTensor(
                    key, shape, dtype_of(path, key, entry), [Piece(path, key, Block.whole(shape))]
                )
    alone = found.is_file()
    checkpoint = SafetensorsFiles(
        layout=FILE_LAYOUT if alone else LAYOUT,
        path=found,
        tensors=tensors,
        hf_folder=None if alone else found,
        facts={"files": len(files)},
    )
    config = found / "config.json"
    quantization = None if alone else read_json(config, "fix it or pass --config-from DIR", CheckpointError)
    quantization = quantization.get("quantization_config") if isinstance(quantization, dict) else None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if method == "fp8":  # (a block-FP8 release)
        return fp8_blocks.dequantized(checkpoint, fp8_blocks.block_size(quantization, config))
    if method == compressed_tensors.METHOD:
        return compressed_tensors.dequantized(checkpoint, quantization, config)
    return checkpoint

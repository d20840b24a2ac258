"""A Hugging Face model folder saved as pickles: `pytorch_model.bin`, or shards
`pytorch_model-0000i-of-0000N.bin` listed by `pytorch_model.bin.index.json` (transformers 4's
`save_pretrained(safe_serialization=False)`, and most older Hub models).

Each file is a `torch.save` state dict of whole tensors, read as every other pickle here: by unshard's
allow-list reader, never by pickle's own loader, so no code in the file runs (the job the Hub's
convert-to-safetensors tool does with an unsafe `torch.load`). Each tensor is one piece, its bytes
copied from where they lie in the file.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError, read_json
from .base import SourceTensor, load_archive
from .fsdp_rank_files import FsdpRankFiles, _is_tensor, _model_state, _pieces

LAYOUT = "huggingface-pickle"
SINGLE, INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


def find_folder(src: Path) -> Path | None:
    if src.is_dir() and (src / "config.json").is_file() and ((src / SINGLE).is_file() or (src / INDEX).is_file()):
        return src
    return None


def _weight_files(folder: Path) -> dict[Path, set[str] | None]:
    """Each weight file, with the tensors the index says it holds (None: the single file, whatever it holds)."""
    if not (folder / INDEX).is_file():
        return {folder / SINGLE: None}
    index = read_json(folder / INDEX, "restore it, or save the model again")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{folder / INDEX}: has no weight_map; restore it, or save the model again")
    files: dict[Path, set[str]] = {}
    for name, filename in weight_map.items():
        if not isinstance(filename, str) or Path(filename).name != filename:
            raise CheckpointError(f"{folder / INDEX}: {name} is in {filename!r}, not a file of this folder")
        files.setdefault(folder / filename, set()).add(name)
    missing = [path.name for path in files if not path.is_file()]
    if missing:
        raise CheckpointError(
            f"{folder}: {len(missing)} weight file(s) the index lists are missing ({', '.join(missing[:3])}); "
            "copy every pytorch_model-*.bin file"
        )
    return files


def open_folder(src: Path) -> FsdpRankFiles:
    folder = find_folder(src)
    if folder is None:
        raise CheckpointError(f"{src}: no config.json with pytorch_model.bin (or its index) here")
    states, maps, tensors = {}, {}, {}
    for path, listed in _weight_files(folder).items():
        state = _model_state(path, load_archive(path, maps))
        states[path] = state
        for key, value in state.items():
            if not _is_tensor(value):
                continue
            if key in tensors:
                raise CheckpointError(
                    f"{path}: {key} is also in {tensors[key].pieces[0].file.name}; save the model again"
                )
            shape, dtype, pieces, _ = _pieces(path, key, value)
            tensors[key] = SourceTensor(key, shape, dtype, pieces)
        if listed is not None and (absent := sorted(listed - set(tensors))):
            raise CheckpointError(
                f"{path}: the index lists {len(absent)} tensor(s) it does not hold (e.g. {absent[0]}); "
                "the file is from another save, or cut short"
            )
    return FsdpRankFiles(
        layout=LAYOUT,
        path=folder,
        tensors=tensors,
        hf_folder=folder,
        facts={"files": len(states)},
        maps=maps,
        states=states,
    )

"""Output formats. The plan says which tensors go out (names, shapes, dtype, source pieces); an output
format says how each is stored, in which files, and what surrounds them. Each is a types.Sink, found here
by the name `OutputOptions.format` gives.

Every format is fed the same way (write/execute.py, write/threads.py). The plan is made with the format's encodings
(a tensor stored otherwise than as it is) and its `lay_out` of files before any byte is read, so `inspect`,
`--dry-run`, the memory estimate and the split of work between writers see the bytes that will really be
written. Then each tensor is assembled (a band of rows at a time where it is large or encoded) and written
into the file the format `open`s in the place it `stage`s; `--verify` reads it back through `read_back`;
the format `finish`es what surrounds the tensors and the place is committed.

- safetensors: hf_folder.HFFolder, a Hugging Face folder of safetensors shards (safetensors.py writes the files).
- compressed-tensors: compressed_tensors.CompressedTensorsFolder, the same folder with its Linear weights stored
  as compressed-tensors encodes them: the checkpoint vLLM and transformers load quantized.
- gguf: gguf.GGUFSink, one GGUF file, as llama.cpp's converter writes it (tensors renamed, converted and
  quantized by gguf-py's kernels, metadata and vocabulary in the header); a vision-language model's vision
  part in a second, the mmproj.
- dcp: dcp.DCPFolder, a torch.distributed.checkpoint folder a trainer loads (`--to dcp`): each tensor in chunks of
  whole rows, under Hugging Face's or torchtitan's names.
- megatron: megatron.MegatronFolder, Megatron-LM's torch_dist checkpoint (`--to megatron`): the same DCP files,
  with megatron-core's names and layout, its args and files around them; verl-megatron: megatron.VerlMegatronFolder,
  the same checkpoint in verl's layout.
- fsdp: fsdp.FSDPRankFiles, verl's FSDP rank files (`--to fsdp --world-size N`): each rank's shard of every tensor,
  as DTensors in a torch.save archive; every group is listed under every file, its shards `placed` by rank.
(peft_adapter.PeftAdapterFolder, what extract-lora writes, is planned by the merging code itself.)
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import UnshardError
from ..types import FormatRequest, OutputOptions, Sink

# Each format's module, imported when a conversion asks for it: `plan_sink(request) -> Sink` (which sets the
# encodings of the request's outputs), and `SUMMARY_KEY` with `summary_lines(summary)`: what inspect prints of the
# format's part of the plan's summary. A format may refuse a config before the plan is made (check_config).
FORMATS = {
    "safetensors": "hf_folder",
    "compressed-tensors": "compressed_tensors",
    "gguf": "gguf.sink",
    "dcp": "dcp",
    "megatron": "megatron",
    "verl-megatron": "megatron",
    "fsdp": "fsdp",
}


def format_module(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{FORMATS[name]}")


def check_config(options: OutputOptions, config_folder: Path | None, dtype_name: str, config_updates: dict) -> None:
    """The format's one-line refusals that the config alone decides, where it has any: made before transformers is
    asked for the model's names (seconds) and before a weight is read."""
    check = getattr(format_module(options.format), "check_config", None)
    if check is not None:
        check(options, config_folder, dtype_name, config_updates)


def plan_format(request: FormatRequest) -> Sink:
    """The sink that writes the output format the options ask for, with each output tensor's encoding for it set
    in `request.groups`."""
    if request.options.gguf_split and request.options.format != "gguf":
        raise UnshardError("--gguf-split-max-size splits a GGUF file: give an OUT ending in .gguf (or --gguf-type)")
    return format_module(request.options.format).plan_sink(request)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """inspect's lines for the output format of a plan's summary (none for a plain folder)."""
    modules = dict.fromkeys(map(format_module, FORMATS))  # (each once: one module may write two layouts)
    return [
        line
        for module in modules
        if summary.get(module.SUMMARY_KEY)
        for line in module.summary_lines(summary[module.SUMMARY_KEY])
    ]

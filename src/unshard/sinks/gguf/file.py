"""The one module that touches gguf-py's writer internals: a planned file's header bytes (metadata and tensor infos at
aligned offsets), the file a band at a time behind it, and a written file read back for --verify."""

from __future__ import annotations

from pathlib import Path

from ...errors import UnshardError
from ...families.gguf_hooks import gguf_py
from ...types import OutputTensor
from ..safetensors import SafetensorsFile, WrittenFile
from .reading import tensor_infos
from .split import split_fields
from .tensors import GGUFPlan, stacked


def header(plan: GGUFPlan, tensors: list[OutputTensor]):
    """The file's header as gguf-py writes it (metadata, then tensor infos, in the plan's positions), and where
    each stored tensor goes (an expert, in its place in its stack):
    (header bytes, {name: (dtype, shape, offset from the data's start, bytes)}, data start, file size)."""
    import io

    import numpy as np

    asked = tuple((t.name, t.shape, t.nbytes) for t in tensors)
    if plan.made_header and plan.made_header[0] == asked:
        return plan.made_header[1]
    gguf = gguf_py()
    writer = plan.writer
    writer.tensors = [{}]  # (one writer makes every header of the plan: --dry-run's, the file's)
    qtypes = {name: qtype for e in plan.encoded.values() for name, qtype in e.types().items()}
    qtypes.update({name: plan.computed_type(name) for name in plan.computed})
    parts: dict[str, dict[int | None, OutputTensor]] = {}  # the file's tensors: their experts, or themselves (None)
    for tensor in [*tensors, *plan.computed_stored()]:
        name, expert = stacked(tensor.name)
        parts.setdefault(name, {})[expert] = tensor
    entries, offset = {}, 0
    for name in sorted(parts, key=plan.positions.__getitem__):
        each = [parts[name][expert] for expert in sorted(parts[name], key=lambda e: e or 0)]
        shape = (len(each), *each[0].shape) if None not in parts[name] else each[0].shape
        if name in plan.joined_rows:  # (its members' rows one after another)
            shape = (len(each) * each[0].shape[0], *each[0].shape[1:])
        nbytes = sum(t.nbytes for t in each)
        writer.add_tensor_info(name, shape, np.dtype(np.uint8), nbytes, raw_dtype=qtypes[name])
        at = offset
        for tensor in each:
            entries[tensor.name] = (tensor.dtype, tensor.shape, at, tensor.nbytes)
            at += tensor.nbytes
        offset += writer.ggml_pad(nbytes, writer.data_alignment)
    made = io.BytesIO()
    fields = writer.kv_data
    writer.fout, writer.path, writer.state = [made], None, gguf.WriterState.EMPTY
    if plan.split:  # (this file's own key-values, after the model's)
        writer.kv_data = [{**fields[0], **split_fields(plan.split)}]
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
    finally:
        writer.fout, writer.state, writer.tensors, writer.kv_data = None, gguf.WriterState.NO_FILE, [{}], fields
    raw = made.getvalue()
    data_start = writer.ggml_pad(len(raw), writer.data_alignment)
    plan.made_header = (asked, (raw, entries, data_start, data_start + offset))
    return plan.made_header[1]


class GGUFFile(SafetensorsFile):
    """The GGUF file, written as a safetensors file is (sinks/safetensors.py): the header first, every
    tensor's offset known, each tensor's bytes to its place, in any order."""

    def __init__(self, path: Path, tensors: list[OutputTensor], plan: GGUFPlan):
        self._start(path, *header(plan, tensors))
        for stored in plan.computed_stored():  # (a few values each, known from the config)
            self.write_parts(
                stored.name, stored.dtype, stored.shape, [memoryview(plan.computed[stored.name]).cast("B")]
            )


class WrittenGGUF(WrittenFile):
    """A GGUF file read back for --verify: its tensors as the plan stores them (the bytes of their GGUF type), at the
    offsets its header's tensor infos give (reading.py)."""

    def __init__(self, path: Path, stacks: dict[str, int], joined_rows: set[str] = frozenset()):
        """stacks: the file's tensors that stack experts, by their count (read back as the plan stores them, one per
        expert); joined_rows: those of them whose members are rows one after another."""
        import math

        gguf = gguf_py()
        self.path = path
        self.data_start, infos = tensor_infos(path)
        self.entries = {}
        for tensor in infos:
            try:
                ggml_type = gguf.GGMLQuantizationType(tensor.ggml_type)
                byte_shape = tuple(gguf.quant_shape_to_byte_shape(tuple(reversed(tensor.shape)), ggml_type))
            except ValueError as e:  # (a type gguf-py does not know, or a row not in whole blocks)
                raise UnshardError(
                    f"{path}: {tensor.name} is not a tensor gguf-py reads ({e}); the file is damaged"
                ) from None
            begin, n_bytes = tensor.offset, math.prod(byte_shape)
            if tensor.name not in stacks:
                self.entries[tensor.name] = ("U8", byte_shape, begin, begin + n_bytes)
                continue
            count = stacks[tensor.name]
            step = n_bytes // count  # (a stack of experts: each as the plan stores it, name[expert])
            member = (byte_shape[0] // count, *byte_shape[1:]) if tensor.name in joined_rows else byte_shape[1:]
            for expert in range(count):
                at = begin + expert * step
                self.entries[f"{tensor.name}[{expert}]"] = ("U8", member, at, at + step)

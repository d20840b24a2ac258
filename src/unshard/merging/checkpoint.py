"""The merged model as a Checkpoint: its tensors are the output's, and reading one computes it from the
inputs' tensors (whole, or, for a tensor larger than a band whose inputs all read rows as they are, a band
of rows at a time), so the planner, streaming writer, progress bar and --verify are the conversion's."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..dtypes import DType
from ..plan import pieces_read
from ..sources import Checkpoint
from ..types import OutputTensor
from .inputs import Input
from .methods import Method
from .vocabulary import Vocabulary


@dataclass
class TensorMerge:
    """How one output tensor is made: which tensor of which input, with the parameters' values for it."""

    out: OutputTensor
    lead: tuple[Input, str]  # the input whose tensor a non-float buffer is copied from
    base: tuple[Input, str] | None
    others: list[tuple[Input, str]]
    params: list[dict[str, Any]]  # per other input
    shared: dict[str, Any]
    by_token: list[str] | None = (
        None  # a tensor of a row per token, laid onto the output's vocabulary: its models, in order
    )


class FromInputs(Checkpoint):
    """A Checkpoint whose tensors are computed from other models' (`inputs`), which lie in no file of its own."""

    inputs: list[Input]

    def check_records(self, pieces) -> None:
        # (the records read are the inputs')
        for item in self.inputs:
            item.plan.checkpoint.check_records(pieces_read(item.plan.groups))

    def close(self) -> None:
        for item in self.inputs:
            item.plan.checkpoint.close()


class MergedCheckpoint(FromInputs):
    """Set up by `plan_merge` with `method`, `merges` (output name -> TensorMerge), `work` (the dtype merged
    in), `seed`, `inputs` and `recipe`."""

    BAND_BYTES = 64 << 20  # of each input, in the working dtype: a larger tensor is merged in bands

    method: Method
    merges: dict[str, TensorMerge]
    work: DType
    seed: int

    def setup(
        self,
        method: Method,
        merges: dict[str, TensorMerge],
        work: DType,
        seed: int,
        inputs: list[Input],
        recipe: Any,
        vocabulary: Vocabulary | None = None,
    ) -> None:
        self.method, self.merges, self.work, self.seed, self.inputs, self.recipe = (
            method,
            merges,
            work,
            seed,
            inputs,
            recipe,
        )
        self.vocabulary = vocabulary
        self._band_rows = {name: rows for name in merges if (rows := self._in_bands(name)) is not None}
        self._merging: dict[str, Iterator[tuple[int, torch.Tensor]]] = {}

    def read(self, name: str) -> torch.Tensor:
        return next(self._merged(name, None))[1]

    def band_rows(self, name: str) -> int | None:
        return self._band_rows.get(name)

    def read_rows_as_bytes(self, name: str, start: int, stop: int, out=None) -> None:
        return None  # (computed, never in a file)

    def read_rows(self, name: str, start: int, stop: int, local=None) -> torch.Tensor:
        # The writer (and --verify) asks for a tensor's bands in order, from one thread: the first band
        # starts the tensor's merge, which surveys the whole tensor, and each call takes the next band.
        if start == 0:
            self._merging[name] = self._merged(name, self._band_rows[name])
        at, band = next(self._merging[name])
        assert at == start, (name, at, start)
        if stop == self.tensors[name].shape[0]:
            del self._merging[name]
        return band

    # ---- reading the inputs ----

    def _tensor_of(self, item: Input, name: str) -> torch.Tensor:
        return item.read(name).to(self.work.torch)

    def _rows_of(self, item: Input, name: str, start: int, stop: int, buffers: dict, slot: int) -> torch.Tensor:
        """Rows [start, stop) of an input's `name`, in the working dtype, in `buffers` kept for all the bands
        of the tensor (fresh ones for each band cost as much again in page faults as the reading); `slot`:
        the input's place in the merge (a model may come twice)."""
        checkpoint, source = item.plan.checkpoint, item.groups[name].source
        shape = (stop - start, *source.shape[1:])

        def buffer(dtype: torch.dtype) -> torch.Tensor:
            if (slot, dtype) not in buffers:  # (made for the first band, the largest)
                buffers[slot, dtype] = torch.empty(math.prod(shape), dtype=dtype)
            return buffers[slot, dtype][: math.prod(shape)].view(shape)

        rows = buffer(source.dtype.torch)
        if checkpoint.read_rows_as_bytes(source.name, start, stop, out=rows.view(-1).view(torch.uint8).numpy()) is None:
            rows = checkpoint.read_rows(source.name, start, stop, checkpoint.local_tensor)
        return rows if rows.dtype == self.work.torch else buffer(self.work.torch).copy_(rows)

    def _in_bands(self, name: str) -> int | None:
        """Rows per band if `name` is merged a band at a time: larger than a band, and every input reads
        its rows as they are (no split, no transformers conversion, no adapter to fold)."""
        merge = self.merges[name]
        out = merge.out
        if not out.dtype.is_floating_point or len(out.shape) < 2 or merge.by_token:
            return None
        rows = max(1, self.BAND_BYTES // (math.prod(out.shape[1:]) * self.work.itemsize))
        read = ([merge.base] if merge.base else []) + merge.others
        if rows >= out.shape[0] or not all(
            len(g.outputs) == 1
            and g.convert is None
            and item.plan.checkpoint.reads_rows(g.source.name)
            and not (item.adapter and item.adapter.adapts(input_name))
            for item, input_name in read
            for g in [item.groups[input_name]]
        ):
            return None
        return rows

    # ---- merging ----

    def _merged(self, name: str, rows: int | None) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, merged band) of `name`, a band of `rows` rows at a time, or whole (rows None)."""
        merge = self.merges[name]
        if not merge.out.dtype.is_floating_point:
            yield 0, self._tensor_of(*merge.lead)  # integer buffers are copied from the lead input
            return
        base, others, method = merge.base, merge.others, self.method

        def draws(start: int) -> torch.Generator:  # seeded per tensor and band: repeats whatever the threads
            return torch.Generator().manual_seed(
                zlib.crc32(f"{self.seed}/{name}{f'/{start}' if start else ''}".encode())
            )

        if rows is None and merge.by_token:  # each input's rows moved to the output's token ids, together
            read = {item.reference: (item, name) for item, name in ([base] if base else []) + others}
            models = list(dict.fromkeys(merge.by_token))  # (in the recipe's order, as mergekit averages them)
            laid = self.vocabulary.laid_out([(model, self._tensor_of(*read[model])) for model in models])
            by_model = dict(zip(models, laid))
            whole = (by_model[base[0].reference] if base else None, [by_model[item.reference] for item, _ in others])
            starts, bands = [0], lambda: iter([(*whole, draws(0))])
        elif rows is None:  # one band, read once
            whole = (self._tensor_of(*base) if base else None, [self._tensor_of(*other) for other in others])
            starts, bands = [0], lambda: iter([(*whole, draws(0))])
        else:
            total, buffers = merge.out.shape[0], {}
            starts = list(range(0, total, rows))

            # (each band read into the buffers of the one before: it is done with when the next is asked for)
            def bands():
                for start in starts:
                    stop = min(start + rows, total)
                    yield (
                        self._rows_of(*base, start, stop, buffers, -1) if base else None,
                        [self._rows_of(*other, start, stop, buffers, i) for i, other in enumerate(others)],
                        draws(start),
                    )

        numbers = method.survey(bands, merge.params, merge.shared) if method.survey else None
        for start, (base_band, other_bands, generator) in zip(starts, bands()):
            yield start, method.combine(base_band, other_bands, merge.params, merge.shared, numbers, generator)

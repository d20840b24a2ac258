"""Element types, as torch names them, known without importing torch.

A plan, `inspect` and a same-dtype conversion (bytes copied file to file) need only a type's name,
size and safetensors code. Importing torch takes over a second on every run, more than planning
a 70B checkpoint, so torch is imported only where a tensor is built: `DType.torch`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # torch's name: torch.<name>
    itemsize: int
    safetensors: str  # the safetensors header's code
    is_floating_point: bool = True

    @property
    def torch(self):
        import torch

        return getattr(torch, self.name)

    def __str__(self) -> str:
        return self.name


ALL = [DType("float64", 8, "F64"), DType("float32", 4, "F32"), DType("float16", 2, "F16"),
       DType("bfloat16", 2, "BF16"), DType("float8_e4m3fn", 1, "F8_E4M3"), DType("float8_e5m2", 1, "F8_E5M2"),
       *(DType(f"int{bits}", bits // 8, f"I{bits}", False) for bits in (64, 32, 16, 8)),
       DType("uint8", 1, "U8", False), DType("bool", 1, "BOOL", False)]
BY_NAME = {d.name: d for d in ALL}
BY_SAFETENSORS = {d.safetensors: d for d in ALL}
float32 = BY_NAME["float32"]
# What --dtype offers.
OUTPUT = {name: BY_NAME[name] for name in ("float32", "bfloat16", "float16")}


@dataclass(frozen=True)
class Unhandled:
    """A torch dtype unshard has no use for (complex, quantized), as a pickle names it: fine in an
    optimizer's state, an error in a tensor that would be written."""

    name: str

    def __str__(self) -> str:
        return self.name


def of(dtype) -> DType:
    """The DType of a torch dtype (torch.float32), or of its name ("float32")."""
    if isinstance(dtype, DType):
        return dtype
    name = str(dtype).removeprefix("torch.")
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unshard does not handle tensors of dtype {name}") from None

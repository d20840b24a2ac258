"""compressed-tensors' preset schemes (W4A16, FP8_DYNAMIC, NVFP4A16, ...), written down as the data its config carries:
how each quantizes a Linear weight (Args) and what config.json says of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UnshardError

# The compressed-tensors release whose output the tests compare with (llm-compressor 0.14.0.1's);
# its config says which release wrote it.
FORMAT_VERSION = "0.19.0"


@dataclass(frozen=True)
class Args:
    """One tensor's quantization, as compressed-tensors' QuantizationArgs says it."""

    num_bits: int
    type: str  # "int" or "float"
    strategy: str  # "group", "tensor_group", "channel", "block" (weights); "token", "group" (dynamic activations)
    symmetric: bool = True
    group_size: int | None = None
    block_structure: tuple[int, int] | None = None
    dynamic: bool = False
    zp_dtype: str | None = None
    scale_dtype: str | None = None  # "torch.uint8": MX, power-of-two scales stored as their biased exponents

    @property
    def mx(self) -> bool:
        return self.scale_dtype == "torch.uint8"

    @property
    def grouped(self) -> bool:
        """Columns in groups, each with its scale (tensor_group: times one scale for the whole tensor)."""
        return self.strategy in ("group", "tensor_group")

    def to_config(self, observer: str | None) -> dict[str, Any]:
        return {
            "actorder": None,
            "block_structure": list(self.block_structure) if self.block_structure else None,
            "dynamic": self.dynamic,
            "group_size": self.group_size,
            "num_bits": self.num_bits,
            "observer": observer,
            "observer_kwargs": {},
            "scale_dtype": self.scale_dtype,
            "strategy": self.strategy,
            "symmetric": self.symmetric,
            "type": self.type,
            "zp_dtype": self.zp_dtype,
        }


@dataclass(frozen=True)
class Scheme:
    name: str
    format: str  # compressed-tensors' name for how the weights are stored
    weights: Args
    input_activations: Args | None = None  # quantized by the serving engine, per token, as it runs

    def quantization_config(self, ignore: list[str]) -> dict[str, Any]:
        """config.json's `quantization_config`, as compressed-tensors writes it."""
        inputs = self.input_activations.to_config(None) if self.input_activations else None
        group = {
            "format": self.format,
            "input_activations": inputs,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": self.weights.to_config("memoryless_minmax"),
        }
        return {
            "config_groups": {"group_0": group},
            "format": self.format,
            "global_compression_ratio": None,
            "ignore": ignore,
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "version": FORMAT_VERSION,
        }


def _int_weights(bits: int, symmetric: bool = True) -> Args:
    return Args(bits, "int", "group", symmetric, group_size=128, zp_dtype=None if symmetric else "torch.int8")


def _mx(bits: int, dynamic: bool = False) -> Args:
    """The OCP microscaling formats: floats in groups of 32 sharing a power-of-two scale."""
    return Args(bits, "float", "group", group_size=32, dynamic=dynamic, scale_dtype="torch.uint8")


_TOKEN_INT8 = Args(8, "int", "token", dynamic=True)
_TOKEN_FP8 = Args(8, "float", "token", dynamic=True)
SCHEMES = {
    scheme.name: scheme
    for scheme in (
        Scheme("W8A16", "pack-quantized", _int_weights(8)),
        Scheme("W4A16", "pack-quantized", _int_weights(4)),
        Scheme("W4A16_ASYM", "pack-quantized", _int_weights(4, symmetric=False)),
        Scheme("W8A8", "int-quantized", Args(8, "int", "channel"), _TOKEN_INT8),
        Scheme("FP8_DYNAMIC", "float-quantized", Args(8, "float", "channel"), _TOKEN_FP8),
        Scheme(
            "FP8_BLOCK",
            "float-quantized",
            Args(8, "float", "block", block_structure=(128, 128)),
            Args(8, "float", "group", group_size=128, dynamic=True),
        ),
        # NVIDIA's FP4: groups of 16 with FP8 scales, under a tensor-wide float32 scale (see GlobalScale)
        Scheme(
            "NVFP4A16",
            "nvfp4-pack-quantized",
            Args(4, "float", "tensor_group", group_size=16, scale_dtype="torch.float8_e4m3fn"),
        ),
        Scheme("MXFP4A16", "mxfp4-pack-quantized", _mx(4)),
        Scheme("MXFP4", "mxfp4-pack-quantized", _mx(4), _mx(4, dynamic=True)),
        Scheme("MXFP8A16", "mxfp8-quantized", _mx(8)),
        Scheme("MXFP8", "mxfp8-quantized", _mx(8), _mx(8, dynamic=True)),
    )
}
ALIASES = {"INT8": "W8A8"}  # as compressed-tensors names them too


def scheme_named(name: str) -> Scheme:
    key = ALIASES.get(name.upper(), name.upper())
    if key not in SCHEMES:
        raise UnshardError(
            f"--quantize {name}: unknown scheme; known: {', '.join(SCHEMES)} (compressed-tensors' preset names)"
        )
    return SCHEMES[key]

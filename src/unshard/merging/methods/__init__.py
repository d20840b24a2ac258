"""Merge methods: each merges one band of rows of a tensor, from numbers its survey took over the whole
(registry.py: how a method is declared, `@merge_method(name, ...)`). So a tensor larger than a band is
merged a band at a time, and memory follows the band, not the tensor; a smaller tensor is one band, read once.

Each method computes what mergekit 0.1.5 computes, with its defaults and parameter names.
"""

# Each registers its methods, in the order they are listed (mergekit's)
from . import linear, task_arithmetic, slerp, model_stock, passthrough  # noqa: F401, I001
from .registry import METHODS, REQUIRED, Band, Method, Parameter

__all__ = ["METHODS", "REQUIRED", "Band", "Method", "Parameter"]

"""Model Stock: from the base towards the fine-tunes' average, by the angle between their offsets."""

import math

from .registry import merge_method
from .slerp import _dot


def _model_stock_survey(bands, params, shared) -> float:
    """Model Stock's interpolation ratio, from the mean angle between the fine-tunes' offsets from the base."""
    n = len(params)
    dots = [[0.0] * n for _ in range(n)]
    for base, others, _ in bands():
        offsets = [other.float() - base.float() for other in others]
        for i in range(n):
            for j in range(i, n):
                dots[i][j] += _dot(offsets[i], offsets[j])
    cosines = [
        max(-1.0, min(1.0, dots[i][j] / max(math.sqrt(dots[i][i] * dots[j][j]), 1e-6)))
        for i in range(n)
        for j in range(i + 1, n)
    ]
    cos = sum(cosines) / len(cosines)
    denominator = 1 + (n - 1) * cos
    return 0.0 if abs(denominator) < 1e-6 else n * cos / denominator


@merge_method("model_stock", needs_base=True, survey=_model_stock_survey, inputs=(2, None))
def _model_stock(base, others, params, shared, t, generator):
    """Model Stock: move from the base towards the average by the angle between the fine-tunes."""
    average = sum(other.float() for other in others) / len(others)
    return t * average + (1 - t) * base.float()

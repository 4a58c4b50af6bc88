"""The numbers a reviewer asks of a sweep's row, pure: bootstrap intervals over examples, the paired gain over
another strategy on the same examples, the median paired wall-time ratio, and the Pareto flag.

The bootstrap is the percentile one, seeded, so the same rows always give the same interval. A paired
interval resamples *examples* and takes both strategies' results on each drawn example together, so what the
two share (an easy example is easy for both) cancels and the interval is that of the difference itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 4000
LEVEL = 0.95
SEED = 0


def _resampled_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The mean of `values` in each of `resamples` bootstrap draws of as many rows, with replacement."""
    rows = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    return values[rows].mean(axis=1)


def _percentiles(means: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_interval(
    values: Sequence[float], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """The `level` percentile-bootstrap interval of the mean of `values` (1/0 per example: of the accuracy);
    NaNs when there are none."""
    data = np.asarray(values, dtype=float)
    if not len(data):
        return float("nan"), float("nan")
    return _percentiles(_resampled_means(data, resamples, seed), level)


def paired_interval(
    values: Sequence[float],
    baseline: Sequence[float],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """(mean difference, low, high) of `values` − `baseline`, the two given on the same examples in the same order,
    with the examples resampled together; NaNs when there are none."""
    a, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same examples: {len(a)} vs {len(b)}")
    if not len(a):
        return float("nan"), float("nan"), float("nan")
    return (float((a - b).mean()), *_percentiles(_resampled_means(a - b, resamples, seed), level))


def median_ratio(values: Sequence[float], baseline: Sequence[float]) -> float:
    """The median of values[i] / baseline[i] (paired: each example divided by its own baseline); NaN if none."""
    a, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    return float(np.median(a / b)) if len(a) else float("nan")


def pareto(accuracy: Sequence[float], cost: Sequence[float]) -> list[bool]:
    """True where no other row has both a higher accuracy and a lower cost (ties dominate nothing)."""
    acc, cost_ = np.asarray(accuracy, dtype=float), np.asarray(cost, dtype=float)
    return [not bool(np.any((acc > a) & (cost_ < c))) for a, c in zip(acc, cost_)]

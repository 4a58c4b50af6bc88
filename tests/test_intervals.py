"""A sweep's statistics against answers known in closed form or by hand (`safe_engine.bench.intervals`)."""

import math

import pytest

from safe_engine.bench.intervals import bootstrap_interval, median_ratio, paired_interval, pareto

Z = 1.959964  # the standard normal's 97.5th percentile


def wilson(correct: int, n: int) -> tuple[float, float]:
    p = correct / n
    centre = (p + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z / (1 + Z**2 / n) * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n**2))
    return centre - half, centre + half


@pytest.mark.parametrize("correct, n", [(120, 400), (200, 400), (320, 400), (45, 150)])
def test_the_accuracy_interval_is_the_binomials(correct, n):
    """Rows with a known accuracy: the bootstrap's 95 % interval is the binomial's (Wilson's, and the normal
    approximation's) within a point and a half."""
    rows = [1] * correct + [0] * (n - correct)
    low, high = bootstrap_interval(rows)
    p, se = correct / n, math.sqrt(correct / n * (1 - correct / n) / n)
    assert (low, high) == pytest.approx(wilson(correct, n), abs=0.015)
    assert (low, high) == pytest.approx((p - Z * se, p + Z * se), abs=0.01)
    assert bootstrap_interval(rows) == (low, high)  # seeded: the same rows, the same interval


def test_the_paired_interval_is_that_of_the_differences():
    """100 examples: 30 right only for the first strategy, 10 only for the other, 60 ties. By hand: the
    differences d are +1 (30), −1 (10), 0 (60): mean 0.2, var E[d²] − 0.2² = 0.4 − 0.04 = 0.36, standard error
    0.6 / √100 = 0.06, so the 95 % interval is 0.2 ± 1.96 · 0.06 = (0.082, 0.318)."""
    first = [1] * 30 + [0] * 10 + [1] * 30 + [0] * 30
    other = [0] * 30 + [1] * 10 + [1] * 30 + [0] * 30
    gain, low, high = paired_interval(first, other)
    assert gain == pytest.approx(0.2)
    assert (low, high) == pytest.approx((0.2 - Z * 0.06, 0.2 + Z * 0.06), abs=0.01)


def test_the_paired_interval_keeps_examples_together():
    """Every example right for both but a third: the difference is exactly 0 in every resample, where unpaired
    resampling would give an interval around 0 of some width."""
    rows = [1, 0, 1] * 20
    assert paired_interval(rows, rows) == (0.0, 0.0, 0.0)
    assert paired_interval([1] * 10, [0] * 10) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="same examples"):
        paired_interval([1, 0], [1])


def test_no_rows_give_no_interval():
    assert all(math.isnan(x) for x in (*bootstrap_interval([]), *paired_interval([], []), median_ratio([], [])))


def test_the_wall_time_ratio_is_the_median_of_paired_ratios():
    """Each example over its own baseline: 2, 3, 1.5, 10 (one slow outlier) → median 2.5; a ratio of sums would
    say (2 + 6 + 3 + 50) / (1 + 2 + 2 + 5) = 6.1."""
    assert median_ratio([2, 6, 3, 50], [1, 2, 2, 5]) == pytest.approx(2.5)


def test_the_pareto_front_of_a_hand_made_table():
    """Higher accuracy is better, lower cost is better. C (0.6, 3.0) is beaten by B (0.7, 2.0); E (0.5, 1.0) by
    nothing cheaper and better; D ties B's accuracy at a higher cost: not strictly beaten in both, so kept."""
    rows = {"A": (0.8, 5.0), "B": (0.7, 2.0), "C": (0.6, 3.0), "D": (0.7, 4.0), "E": (0.5, 1.0), "F": (0.4, 1.5)}
    flags = pareto([a for a, _ in rows.values()], [c for _, c in rows.values()])
    assert dict(zip(rows, flags)) == {"A": True, "B": True, "C": False, "D": True, "E": True, "F": False}

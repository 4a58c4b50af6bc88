"""SAFE's decision at one drafted position, rule by rule (docs/algorithm.md; the paper's §3 and App. H).

1. Stability: ensembling at drafted token d_j is safe only if the boundary *before* d_j is a token
   boundary in every verifier's own tokenization of the same text (else d_{j-1} is OOV-like for it).
2. Need (greedy): keep d_j if every verifier's argmax is its own token there (unanimity), or if the
   weighted mean of the models' probabilities of their own tokens there is above the consensus threshold
   (strict; ½ by default, the paper's, `DecodeConfig.consensus_threshold`).
   Sampling drops both: d_j is kept with probability min(1, P_ens(d_j) / P_draft(d_j)), where P_ens(d_j)
   is that same weighted mean and P_draft(d_j) the probability the drafter drew d_j with.
3. GaC's gate (on for GaC by default): ensemble only where the drafter's top probability is below ½.

`verdict` applies them in Algorithm 1's order to what one position shows (`Position`): one pure function from
the numbers to the decision, its reason and the probabilities it rested on. Each rule is pinned by a
decode-level test in tests/test_rules.py and checked by scripts/mutations.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..contract.reasons import Decision, Reason

GATE_THRESHOLD = 0.5


def is_safe(own_tokens: Sequence[int | None]) -> bool:
    """Rule 1: every verifier has a token starting at the boundary before the drafted token."""
    return all(index is not None for index in own_tokens)


def weighted_mean(weights: Sequence[float], probs: Sequence[float]) -> float:
    """Σ wᵢ·Pᵢ(own token) with the weights normalised (equal weights: the plain mean)."""
    return sum(w * p for w, p in zip(weights, probs)) / sum(weights)


def consensus(agrees: Sequence[bool], mean_p: float, threshold: float) -> Reason | None:
    """Rule 2 (greedy): why the ensemble could not change the drafted token, or None."""
    if all(agrees):
        return Reason.UNANIMITY
    if mean_p > threshold:
        return Reason.MEAN
    return None


def acceptance(mean_p: float, p_draft: float) -> float:
    """Rule 2 (sampling): the probability of keeping the drafted token."""
    return min(1.0, mean_p / p_draft) if p_draft > 0 else 1.0


def gate_keeps(drafter_top_p: float) -> bool:
    """Rule 3: the drafter is confident enough that GaC does not ensemble here."""
    return drafter_top_p >= GATE_THRESHOLD


@dataclass(frozen=True)
class Position:
    """What the rules read at one drafted position."""

    unsafe: Reason | None  # rule 1's finding: why no verifier may ensemble here, or None (a safe position)
    weights: Sequence[float] = ()  # each model's, drafter first
    own_ps: Sequence[float] = ()  # each model's probability of its own token here, drafter first
    agrees: Sequence[bool] = ()  # each verifier: its argmax is its own token
    drafter_top_p: float | None = None  # read only when GaC's gate is on
    drawn_p: float = 1.0  # sampling: the probability the drafter drew the token with


@dataclass(frozen=True)
class Verdict:
    """SAFE's decision at one position, why, and the probabilities it rested on."""

    decision: Decision
    reason: Reason
    mean_p: float | None = None  # Σ wᵢ·Pᵢ(own token), at a safe position
    accept_p: float | None = None  # sampling: the probability the draft was kept with


def verdict(at: Position, greedy: bool, gated: bool, accept: Callable[[float], bool], threshold: float) -> Verdict:
    """The rules in Algorithm 1's order: stability, need (consensus above `threshold`, greedy), GaC's gate, and
    under sampling the acceptance draw. `accept(p)` draws it (the run's sampler), called only when the rules
    reach it, so the random stream is the one the paper's loop consumes."""
    if at.unsafe is not None:
        return Verdict(Decision.SKIPPED_OOV, at.unsafe)
    mean_p = weighted_mean(at.weights, at.own_ps)
    kept = consensus(at.agrees, mean_p, threshold) if greedy else None
    if kept is None and gated and gate_keeps(at.drafter_top_p):
        kept = Reason.GATE
    if kept is not None:
        return Verdict(Decision.SKIPPED_CONSENSUS, kept, mean_p)
    if greedy:
        return Verdict(Decision.ENSEMBLED, Reason.NO_CONSENSUS, mean_p)
    accept_p = acceptance(mean_p, at.drawn_p)
    if accept(accept_p):
        return Verdict(Decision.SKIPPED_CONSENSUS, Reason.ACCEPTED, mean_p, accept_p)
    return Verdict(Decision.ENSEMBLED, Reason.RESAMPLED, mean_p, accept_p)

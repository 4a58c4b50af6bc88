"""CoRE (Consistency Reweighting, EACL 2026 Findings): each model weighted by how consistent it is with the others.

Over the candidate strings the union gives (each row one model's distribution over them):

- reference p* = the models' plain mean; a model's distance to it per candidate δ_j = |p_j − p*|;
- token score r_j = f(δ_j) where p_j + p_0 > 1e-12 (0 elsewhere), f one of `CORE_SCORES`; normalised so the
  scores on its support average 1: s_j = r_j · n_j / S_j, with S_j = Σ r_j and n_j its non-zero count;
- model score w_j = S_j / H(p_j) (consistent and confident), times the run's own weight of the model;
- the anchor clip: the main model (row 0, the drafter) weighs at least as much as all the others together,
  w_0 ← max(w_0, Σ_{j≥1} w_j), and w is normalised, so w_0 ≥ ½;
- p = w_0·p_0 + Σ_{j≥1} w_j·(s_j ⊙ p_j), not renormalised (only its order and the table matter).

The paper's generation-task form. It projects every assisting model into the main model's vocabulary; here
the index space is the UniTE union the engine already builds (docs/algorithm.md says what that changes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract.config import EnsembleConfig

SUPPORT_EPS = 1e-12  # a candidate is on model j's support when p_j + p_0 exceeds this
ENTROPY_FLOOR = 1e-12  # q = max(p, floor) in the entropy, and H + floor in the model score


@dataclass
class CoreScores:
    """What CoRE computed at one point: the models' weights after the anchor clip (they sum to 1) and each
    model's token score per candidate ([models, union], the main model's row unused by the mix)."""

    weights: torch.Tensor
    token_scores: torch.Tensor


def consistency(delta: torch.Tensor, config: EnsembleConfig) -> torch.Tensor:
    """f(δ): 1 where a model agrees with the mean, falling as it departs."""
    if config.core_score == "linear":
        return 1 - delta
    if config.core_score == "power":
        return (1 - delta).clamp_min(0) ** config.core_alpha
    beta = torch.tensor(config.core_beta)
    return (torch.exp(-beta * delta) - torch.exp(-beta)) / (1 - torch.exp(-beta))


def entropy(per_model: torch.Tensor) -> torch.Tensor:
    q = (per_model / per_model.sum(1, keepdim=True)).clamp_min(ENTROPY_FLOOR)
    return -(q * q.log()).sum(1)


def core_scores(per_model: torch.Tensor, prior: torch.Tensor, config: EnsembleConfig) -> CoreScores:
    """CoRE's weights and token scores for rows of probabilities over one index space; `prior`: the run's
    weights of the models (equal weights leave the paper's rule as it is)."""
    delta = (per_model - per_model.mean(0)).abs()
    support = (per_model + per_model[0]) > SUPPORT_EPS
    raw = torch.where(support, consistency(delta, config), torch.zeros(()))
    total = raw.sum(1)
    count = (raw != 0).sum(1)
    scale = torch.where(total > 0, count / total.clamp_min(SUPPORT_EPS), torch.zeros(()))
    token_scores = raw * scale[:, None]
    weights = total / (entropy(per_model) + ENTROPY_FLOOR) * prior
    weights[0] = torch.maximum(weights[0], weights[1:].sum())
    return CoreScores(weights / weights.sum(), token_scores)


def core_mix(per_model: torch.Tensor, scores: CoreScores) -> torch.Tensor:
    """The main model as it is, every other model's probabilities scaled by its token scores, by weight."""
    w = scores.weights
    return w[0] * per_model[0] + (w[1:, None] * scores.token_scores[1:] * per_model[1:]).sum(0)

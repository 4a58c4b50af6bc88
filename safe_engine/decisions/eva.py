"""EVA (Xu et al., NAACL 2024): the assisting models' distributions mapped into the main model's vocabulary
through a learned vocabulary alignment (`models.vocab_alignment`), then averaged there.

At one point, each model's top `eva_top` logits are softmaxed (the rest get 0); an assisting model's
distribution becomes p̃(v) = Σ_a p(a)·S[a, v] over the main tokens v its tokens a link to (S: the alignment's
CSLS weights, not renormalised, as the paper does). A model joins the average only if its top token is among
the top `eva_drop` of at least one other model (all of them join when none would); the average is weighted
by the run's weights (equal: the paper's plain mean) and its argmax, a main-model token, is the choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..contract.config import EnsembleConfig
from ..models.vocab_alignment import VocabAlignment


@dataclass
class MappedToken:
    """One of an assisting model's top tokens and the main tokens it was mapped to, with their weights."""

    model: int  # the view's index
    token: int  # its id in that model's vocabulary
    p: float  # that model's probability of it
    targets: list[tuple[int, float]]  # (main token id, alignment weight), best first


@dataclass
class EvaMix:
    """Every model's distribution over the main vocabulary, which models joined the mean, and the mean."""

    rows: torch.Tensor  # [models, main vocabulary]
    joined: list[bool]
    mean: torch.Tensor  # [main vocabulary]


def top_softmax(logits: torch.Tensor, size: int, top: int) -> torch.Tensor:
    """The softmax of the `top` largest of the first `size` logits, 0 elsewhere."""
    logits = logits[:size].float()
    values, index = torch.topk(logits, min(top, size))
    return torch.zeros(size).index_put_((index,), torch.softmax(values, dim=0))


def mapped(probs: torch.Tensor, alignment: VocabAlignment, size: int) -> torch.Tensor:
    """p̃ = Sᵀ·p: an assisting distribution carried onto the `size` main tokens through the alignment."""
    nonzero = probs.nonzero().squeeze(1)
    mass = probs[nonzero, None] * alignment.weight[nonzero]
    return torch.zeros(size).index_add_(0, alignment.index[nonzero].flatten(), mass.flatten())


def joined(rows: torch.Tensor, drop: int) -> list[bool]:
    """EVA's drop filter: a model joins if its top token is in another model's top `drop`; all when none do."""
    tops = rows.argmax(1).tolist()
    best = [set(torch.topk(row, min(drop, len(row))).indices.tolist()) for row in rows]
    keep = [any(tops[j] in best[k] for k in range(len(rows)) if k != j) for j in range(len(rows))]
    return keep if any(keep) else [True] * len(rows)


def eva_mix(
    logits: Sequence[torch.Tensor],
    alignments: Sequence[VocabAlignment],
    size: int,
    prior: torch.Tensor,
    config: EnsembleConfig,
) -> EvaMix:
    """EVA at one point: logits[0] is the main model's, the others' come with their alignments to it."""
    rows = [top_softmax(logits[0], size, config.eva_top)]
    for z, alignment in zip(logits[1:], alignments):
        rows.append(mapped(top_softmax(z, len(alignment.index), config.eva_top), alignment, size))
    stacked = torch.stack(rows)
    keep = joined(stacked, config.eva_drop)
    w = prior * torch.tensor(keep, dtype=prior.dtype)
    return EvaMix(stacked, keep, (w / w.sum()) @ stacked)


def mapped_tokens(
    logits: Sequence[torch.Tensor], alignments: Sequence[VocabAlignment], shown: int, top: int
) -> list[MappedToken]:
    """Each assisting model's `shown` most likely tokens and where the alignment sends them (the events)."""
    out = []
    for model, (z, alignment) in enumerate(zip(logits[1:], alignments), start=1):
        probs = top_softmax(z, len(alignment.index), top)
        values, ids = torch.topk(probs, min(shown, len(probs)))
        for token, p in zip(ids.tolist(), values.tolist()):
            links = [(i, w) for i, w in zip(alignment.index[token].tolist(), alignment.weight[token].tolist()) if w > 0]
            out.append(MappedToken(model, token, p, links))
    return out

"""The drafter's draft: up to n tokens, each with the distribution it was drawn from."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..decisions.sampling import Sampler
from .participant import Participant


@dataclass
class Draft:
    """Tokens the drafter drew, each with its (temperature-scaled) logits, their softmax, and the
    probability the token was drawn with (its nucleus probability when sampling)."""

    ids: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)
    drawn_p: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


def draft_after(
    drafter: Participant, base: Sequence[int], count: int, gate: float, sampler: Sampler, stop: threading.Event
) -> Draft:
    """`Run.draft` from response ids `base`; `stop` ends it before the next token. SAFE's overlap drafts the
    next round through it too (`overlap.py`)."""
    draft = Draft()
    eos = drafter.lm.eos_ids
    for _ in range(count):
        if stop.is_set():
            break
        position = len(base) + len(draft)
        row = sampler.scaled(drafter.logits(list(base) + draft.ids, [position])[0])
        probs = torch.softmax(row.float(), dim=-1)
        token, drawn_p = sampler.pick(probs)
        draft.ids.append(token)
        draft.logits.append(row)
        draft.probs.append(probs)
        draft.drawn_p.append(drawn_p)
        if token in eos:
            break
        if probs[token].item() < gate:
            break
    return draft

"""A model taking part in one run: its role's name, its weight, and its one decoding session."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..contract.sessions import Session
from ..models.loading import LoadedModel


@dataclass
class Participant:
    """A model under a name unique within the run, with its ensemble weight (normalised over the run)."""

    name: str
    lm: LoadedModel
    session: Session
    prompt_ids: list[int]
    weight: float = 1.0

    def logits(self, response_ids: Sequence[int], starts: Sequence[int]) -> torch.Tensor:
        """Next-token logits at response indices `starts` (0 = the first response token)."""
        ids = self.prompt_ids + list(response_ids)
        return self.session.next_token_logits(ids, [len(self.prompt_ids) + s for s in starts])

    def forget_before(self, response_index: int) -> None:
        self.session.forget_before(len(self.prompt_ids) + response_index)

"""What a strategy hands `Run.commit`: one response position's drafter ids and why they were chosen."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..contract.reasons import Decision, Reason


@dataclass
class Piece:
    """One committed position (a `CommittedToken` once committed). An ensembled string the drafter spells
    with several ids is one piece."""

    ids: list[int]
    decision: Decision
    reason: Reason | None = None
    drafted: str | None = None  # the drafted token an ensemble replaced (forced: the strategy's pick, if different)
    sharpened: bool = False
    oov_like_for: list[str] = field(default_factory=list)  # models for which ensembling here was OOV-like
    kept_draft: bool = False  # the drafter's drafted token, committed unchanged (RunStats.accepted_drafts)

"""Per-token ensembling, as UniTE runs it: the baseline whose collapse the paper reports (docs/algorithm.md).

Every step, every model predicts the next token of the same text (the drafter from its own ids, every
other model from its canonical tokenization of the text) and the union's argmax is committed through the
drafter. With ``first-subtoken`` (UniTE's code) the drafter appends only its first sub-token of the
chosen string when the string is not one of its tokens; ``full`` appends its whole spelling.

Two places need no ensemble: inside a UTF-8 character the drafter finishes the character it started
(no other model has a position there, and splicing another model's whole character in would corrupt
the text), and under GaC's gate the drafter keeps its own token where its top p ≥ 0.5.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..contract.events import Event
from ..contract.reasons import Decision, Reason
from ..decisions import rules
from ..run.piece import Piece
from ..run.state import Run
from ..tokenization.alignment import complete_utf8_prefix


def per_token_step(run: Run) -> Iterator[Event]:
    raw = run.response.raw
    if complete_utf8_prefix(raw) < len(raw):
        yield from _finish_character(run)
        return
    tokenizations = run.tokenizations.of(raw)
    with run.stats.timed("verify"):
        views = [run.view(run.drafter, run.drafter.logits(run.response.ids, [len(run.response.ids)])[0])]
        for v, tok in zip(run.verifiers, tokenizations):
            views.append(run.view(v, v.logits(tok.ids, [len(tok.ids)])[0]))
            v.forget_before(len(tok.ids))
    drafter_probs = torch.softmax(views[0].logits.float(), dim=-1)
    if run.config.ensemble.gated and rules.gate_keeps(drafter_probs.max().item()):
        token, _ = run.sampler.pick(drafter_probs)
        piece = Piece([token], Decision.SKIPPED_CONSENSUS, Reason.GATE)
    else:
        drafter_token = int(torch.argmax(drafter_probs))
        position = len(run.response.ids)
        ids, point = run.ensemble_at(position, views, drafter_token, None, run.config.per_token_commit)
        yield point
        reason = Reason.RESAMPLED if point.sampled else Reason.NO_CONSENSUS
        piece = Piece(ids, Decision.ENSEMBLED, reason, sharpened=point.sharpening is not None)
    event = run.commit([piece])
    # Damage marker: is the place this step committed at a token boundary for each other model, in the new text?
    flagged = zip(run.verifiers, run.tokenizations.of(run.response.raw))
    event.tokens[0].oov_like_for = [v.name for v, tok in flagged if len(raw) not in tok.boundaries]
    yield event


def _finish_character(run: Run) -> Iterator[Event]:
    """The drafter alone continues a character it has started spelling in bytes."""
    draft = run.draft(1)
    if not draft.ids:
        return
    yield run.draft_event(draft)
    everyone = [v.name for v in run.verifiers]
    yield run.commit(
        [Piece(draft.ids, Decision.SKIPPED_OOV, Reason.INSIDE_CHARACTER, oov_like_for=everyone, kept_draft=True)]
    )

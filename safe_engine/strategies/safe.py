"""SAFE's round as the paper writes it: Generate → Verify → Ensemble → commit (docs/algorithm.md; the paper's Alg. 1).

- Generate: the drafter drafts up to n tokens.
- Verify: each verifier re-tokenizes the response with the draft, finds its own token at the boundary
  before every drafted token, and scores those tokens in one forward pass.
- Ensemble: scanning the draft in order, each position is decided by `rules` (stability, need, gate);
  the first position that is ensembled ends the round when the ensemble replaced the token, and in
  ``exact`` mode (the paper's) even when it kept it. ``fast`` mode keeps scanning a draft the ensemble
  confirmed (the verifier scores are still valid; later positions then see a shorter lookahead).
- Commit: the kept tokens and the ensemble's choice; the rest of the draft is dropped (the drafter's
  memoised logits redraft it without recomputing).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import torch

from ..contract.events import EnsemblePoint, Event, PositionVerified, VerifierView
from ..contract.reasons import Decision, Reason
from ..decisions import rules
from ..run.drafting import Draft
from ..run.event_values import key_text
from ..run.participant import Participant
from ..run.piece import Piece
from ..run.response import text_and_index
from ..run.state import Run
from ..tokenization.alignment import CharIndex, Tokenization
from . import overlap

Scores = list[dict[int, torch.Tensor]]  # per verifier: its logits at each of its own tokens that was scored


def safe_round(run: Run) -> Iterator[Event]:
    draft = run.draft(min(run.config.lookahead, run.remaining()), run.config.draft_gate)  # Generate
    if not draft.ids:
        return
    layout = Layout.of(run, draft)
    yield run.draft_event(draft, layout.index)
    with overlap.drafting_ahead(run, draft):  # with the models on their own devices, the next draft meanwhile
        scores = verify(run, layout)  # Verify
        pieces: list[Piece] = []
        for j, token_id in enumerate(draft.ids):  # Ensemble at most where needed
            check = check_position(run, draft, layout, scores, j)
            yield check
            if check.decision != Decision.ENSEMBLED:
                blocked = [v.model for v in check.verifiers if v.oov_like]
                pieces.append(
                    Piece([token_id], check.decision, check.reason_code, oov_like_for=blocked, kept_draft=True)
                )
            else:
                point, piece = ensemble_position(run, draft, layout, scores, j, check)
                yield point
                pieces.append(piece)
                if point.changed or run.config.safe_mode == "exact":  # this ensemble ends the round
                    break
            if run.diverted(pieces):  # a forced text: the rest of the draft followed another text
                break
    yield run.commit(pieces)  # a stop sequence may end it early


@dataclass
class Layout:
    """Where the draft sits in each verifier's own tokenization of the response + draft."""

    spans: list[tuple[int, int]]  # the drafted tokens' byte spans in the response
    index: CharIndex  # character offsets of the response + draft
    tokenizations: list[Tokenization]  # one per verifier
    own: list[list[int | None]]  # own[j][k]: verifier k's token starting where d_j starts (None: no boundary)
    unsafe: list[Reason | None]  # why d_j is unsafe for every verifier whatever their boundaries, or None

    @classmethod
    def of(cls, run: Run, draft: Draft) -> Layout:
        raw = run.response.extended(draft.ids)
        _, index = text_and_index(raw)
        tokenizations = run.tokenizations.of(raw)
        spans = run.drafter.lm.vocab.spans(draft.ids, len(run.response.raw))
        eos = run.drafter.lm.eos_ids
        unsafe = [
            Reason.INSIDE_CHARACTER
            if not index.is_char_boundary(s)
            else Reason.NO_TEXT
            if s == e and token not in eos
            else None
            for token, (s, e) in zip(draft.ids, spans)
        ]
        own = [
            [None if unsafe[j] else _own_token(tok, s, draft.ids[j] in eos) for tok in tokenizations]
            for j, (s, _) in enumerate(spans)
        ]
        return cls(spans, index, tokenizations, own, unsafe)

    def safe(self, j: int) -> bool:
        return rules.is_safe(self.own[j])


def _own_token(tok: Tokenization, offset: int, drafted_eos: bool) -> int | None:
    """The verifier token that starts at byte `offset`; at the end of the text, only for a drafted EOS
    (the verifier's own token there is its end of sequence)."""
    if offset == tok.length:
        return len(tok.ids) if drafted_eos else None
    return None if drafted_eos else tok.token_starting_at(offset)


def verify(run: Run, layout: Layout) -> Scores:
    """One forward pass per verifier: its logits for its own token at every safe position.

    The passes are independent of each other and of the next draft: with one device per model they run at
    once (`overlap.each`). Not on one CPU by default: there the models share memory bandwidth, and
    overlapping them was measured slower than running them in turn (benchmarks/RESULTS.md).
    """
    safe = [j for j in range(len(layout.own)) if layout.safe(j)]
    starts = [sorted({layout.own[j][k] for j in safe}) for k in range(len(run.verifiers))]
    passes = [partial(_score, v, tok.ids, at) for v, tok, at in zip(run.verifiers, layout.tokenizations, starts)]
    with run.stats.timed("verify"):
        return overlap.each(run, passes)


def _score(verifier: Participant, ids: list[int], starts: list[int]) -> dict[int, torch.Tensor]:
    if not starts:
        return {}
    scores = dict(zip(starts, verifier.logits(ids, starts)))
    verifier.forget_before(starts[0])
    return scores


def check_position(run: Run, draft: Draft, layout: Layout, scores: Scores, j: int) -> PositionVerified:
    """SAFE's decision at drafted token j (`rules.verdict`), as the event that explains it."""
    s, e = layout.spans[j]
    views = [_verifier_view(run, k, layout, scores, j) for k in range(len(run.verifiers))]
    found = rules.verdict(
        _position(run, draft, layout, views, j),
        run.sampler.greedy,
        run.config.ensemble.gated,
        run.sampler.accept,
        run.config.consensus_threshold,
    )
    return PositionVerified(
        round=run.round,
        position=len(run.response.ids) + j,
        token=key_text(run.drafter.lm.key_of(draft.ids[j])),
        start=layout.index.char_of_byte(s),
        end=layout.index.char_of_byte(e),
        verifiers=views,
        mean_p=found.mean_p,
        decision=found.decision,
        reason=found.reason.text([v.model for v in views if v.oov_like]),
        accept_p=found.accept_p,
        reason_code=found.reason,
    )


def _position(run: Run, draft: Draft, layout: Layout, views: list[VerifierView], j: int) -> rules.Position:
    """What the rules read at drafted token j: the drafter's numbers and each verifier's view."""
    if not layout.safe(j):
        return rules.Position(layout.unsafe[j] or Reason.BOUNDARY_MISSING)
    probs = draft.probs[j]
    return rules.Position(
        None,
        [p.weight for p in run.parts],
        [probs[draft.ids[j]].item(), *(v.p for v in views)],
        [v.agrees for v in views],
        probs.max().item() if run.config.ensemble.gated else None,  # read only by GaC's gate
        draft.drawn_p[j],
    )


def ensemble_position(
    run: Run, draft: Draft, layout: Layout, scores: Scores, j: int, check: PositionVerified
) -> tuple[EnsemblePoint, Piece]:
    """The ensemble at drafted token j: the drafter's logits there and each verifier's at its own token."""
    token_id = draft.ids[j]
    views = [run.view(run.drafter, draft.logits[j])]
    views += [run.view(v, scores[k][layout.own[j][k]]) for k, v in enumerate(run.verifiers)]
    ids, point = run.ensemble_at(len(run.response.ids) + j, views, token_id, check.token)
    drafted = check.token if point.changed else None
    sharpened = point.sharpening is not None
    return point, Piece(ids, Decision.ENSEMBLED, check.reason_code, drafted, sharpened, kept_draft=not point.changed)


def _verifier_view(run: Run, k: int, layout: Layout, scores: Scores, j: int) -> VerifierView:
    """Verifier k at the boundary before d_j: its own token there and, where the position is safe, its
    probability of that token and its argmax."""
    v, tok, i = run.verifiers[k], layout.tokenizations[k], layout.own[j][k]
    if i is None:
        return VerifierView(v.name, oov_like=True)
    at_end = i == len(tok.ids)  # the drafter ended the response: the verifier's own token is its EOS
    own = "<eos>" if at_end else key_text(v.lm.key_of(tok.ids[i]))
    if i not in scores[k]:  # another verifier blocked this position: nothing was scored
        return VerifierView(v.name, False, own)
    probs = torch.softmax(run.sampler.scaled(scores[k][i]).float(), dim=-1)
    argmax = int(torch.argmax(probs))
    if at_end:
        eos = [t for t in v.lm.eos_ids if t < len(probs)]
        return VerifierView(
            v.name, False, own, sum(probs[t].item() for t in eos), key_text(v.lm.key_of(argmax)), argmax in v.lm.eos_ids
        )
    return VerifierView(
        v.name, False, own, probs[tok.ids[i]].item(), key_text(v.lm.key_of(argmax)), argmax == tok.ids[i]
    )

"""SAFE's round as the paper writes it: Generate → Verify → Ensemble → commit (SAFE.md, Alg. 1).

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

import torch

from . import rules
from .alignment import CharIndex, Tokenization
from .decoder import Decoder, Draft, key_text, text_and_index
from .events import Event, PositionVerified, VerifierView

SKIP_STAT = {rules.UNANIMITY: "unanimity", rules.MEAN: "mean", rules.GATE: "gate", rules.ACCEPTED: "accepted"}


def safe_round(run: Decoder) -> Iterator[Event]:
    draft = run.draft(min(run.config.lookahead, run.remaining()), run.config.draft_gate)  # Generate
    if not draft.ids:
        return
    layout = Layout.of(run, draft)
    yield run.draft_event(draft, layout.index)
    scores = verify(run, layout)  # Verify
    pieces: list[tuple[list[int], dict]] = []
    for j, token_id in enumerate(draft.ids):  # Ensemble at most where needed
        check = check_position(run, draft, layout, scores, j)
        yield check
        info = {"decision": check.decision, "reason": check.reason}
        if check.decision == "skipped-oov":
            info["oov_like_for"] = [v.model for v in check.verifiers if v.oov_like]
        piece, ends_round = ([token_id], info), False
        if check.decision == "ensembled":
            views = [run.view(run.drafter, draft.logits[j])] + [
                run.view(v, scores[k][layout.own[j][k]]) for k, v in enumerate(run.verifiers)
            ]
            ids, point = run.ensemble_at(len(run.response.ids) + j, views, token_id, check.token)
            yield point
            info["sharpened"] = point.sharpening is not None
            if point.changed:
                info["drafted"] = check.token
            piece, ends_round = (ids, info), point.changed or run.config.safe_mode == "exact"
        piece, forced = run.override(run.stats.tokens + len(pieces), piece)
        pieces.append(piece)
        if ends_round or forced:
            break
    event = run.commit(pieces)  # a stop sequence may end it early
    run.stats.accepted_drafts += sum(1 for t in event.tokens if t.drafted is None)
    yield event


@dataclass
class Layout:
    """Where the draft sits in each verifier's own tokenization of the response + draft."""

    spans: list[tuple[int, int]]  # the drafted tokens' byte spans in the response
    index: CharIndex  # character offsets of the response + draft
    tokenizations: list[Tokenization]  # one per verifier
    own: list[list[int | None]]  # own[j][k]: verifier k's token starting where d_j starts (None: no boundary)
    unsafe: list[str | None]  # why d_j is unsafe for every verifier whatever their boundaries, or None

    @classmethod
    def of(cls, run: Decoder, draft: Draft) -> Layout:
        raw = run.response.extended(draft.ids)
        _, index = text_and_index(raw)
        tokenizations = run.verifier_tokenizations(raw)
        spans = run.drafter.lm.vocab.spans(draft.ids, len(run.response.raw))
        eos = run.drafter.lm.eos_ids
        unsafe = [
            rules.INSIDE_CHARACTER
            if not index.is_char_boundary(s)
            else rules.NO_TEXT
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


def verify(run: Decoder, layout: Layout) -> list[dict[int, torch.Tensor]]:
    """One forward pass per verifier: its logits for its own token at every safe position.

    The passes are independent of each other and of the next draft: with one device per model they could
    run concurrently. Not here: on one CPU the models share memory bandwidth, and overlapping them was
    measured slower than running them in turn (README).
    """
    safe = [j for j in range(len(layout.own)) if layout.safe(j)]
    scores = []
    with run.stats.timed("verify"):
        for k, (v, tok) in enumerate(zip(run.verifiers, layout.tokenizations)):
            starts = sorted({layout.own[j][k] for j in safe})
            scores.append(dict(zip(starts, v.logits(tok.ids, starts))) if starts else {})
            if starts:
                v.forget_before(starts[0])
    return scores


def check_position(
    run: Decoder, draft: Draft, layout: Layout, scores: list[dict[int, torch.Tensor]], j: int
) -> PositionVerified:
    """SAFE's decision at drafted token j (`rules`), as the event that explains it."""
    token_id = draft.ids[j]
    s, e = layout.spans[j]
    views = [_verifier_view(run, k, layout, scores, j) for k in range(len(run.verifiers))]
    event = PositionVerified(
        round=run.round,
        position=len(run.response.ids) + j,
        token=key_text(run.drafter.lm.key_of(token_id)),
        start=layout.index.char_of_byte(s),
        end=layout.index.char_of_byte(e),
        verifiers=views,
        mean_p=None,
        decision="skipped-oov",
    )
    if not layout.safe(j):
        blocked = [v.model for v in views if v.oov_like]
        for name in blocked:
            run.stats.oov_skips[name] += 1
        event.reason = layout.unsafe[j] or "boundary missing for " + ", ".join(blocked)
        return event
    weights = [p.weight for p in run.parts]
    event.mean_p = rules.weighted_mean(weights, [draft.probs[j][token_id].item()] + [v.p for v in views])
    if run.sampler.greedy:
        keep = rules.consensus([v.agrees for v in views], event.mean_p)
    else:
        keep = None
    if keep is None and run.config.ensemble.gated and rules.gate_keeps(draft.probs[j].max().item()):
        keep = rules.GATE
    if keep is None and not run.sampler.greedy:
        event.accept_p = rules.acceptance(event.mean_p, draft.drawn_p[j])
        keep = rules.ACCEPTED if run.sampler.accept(event.accept_p) else None
    if keep is not None:
        run.stats.consensus_skips[SKIP_STAT[keep]] += 1
        event.decision, event.reason = "skipped-consensus", keep
    else:
        event.decision, event.reason = "ensembled", rules.NO_CONSENSUS if run.sampler.greedy else rules.RESAMPLED
    return event


def _verifier_view(run: Decoder, k: int, layout: Layout, scores: list[dict[int, torch.Tensor]], j: int) -> VerifierView:
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

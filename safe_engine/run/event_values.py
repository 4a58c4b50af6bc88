"""A run's values as its events show them: token texts, candidates, the ensemble's union table, the drafted
and the committed tokens. Pure functions of what the run computed; the run decides when to announce them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..contract.config import TOP_K_SHOWN
from ..contract.events import Candidate, CommittedToken, DraftToken, MappedCandidate, UnionRow
from ..decisions.ensemble import EnsembleResult, Key
from ..models.loading import LoadedModel
from ..tokenization.alignment import CharIndex, display_piece
from .drafting import Draft
from .piece import Piece


def key_text(key: Key) -> str:
    return display_piece(key) if isinstance(key, bytes) else key


def raw_hex(key: Key) -> str | None:
    """The bytes of a union key in hex where its display shows them as <0xNN> (a piece of a character)."""
    if not isinstance(key, bytes):
        return None
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return key.hex()
    return None


def top_candidates(probs: torch.Tensor, lm: LoadedModel, k: int = TOP_K_SHOWN) -> list[Candidate]:
    """A distribution's k most likely tokens, as the events show them."""
    top = torch.topk(probs, k)
    keys = [lm.key_of(i) for i in top.indices.tolist()]
    return [Candidate(key_text(key), p, raw_hex(key)) for key, p in zip(keys, top.values.tolist())]


def drafted_tokens(lm: LoadedModel, draft: Draft, start: int, index: CharIndex) -> list[DraftToken]:
    """The drafted tokens, appended at byte `start` of the response; `index`: character offsets of the
    response extended by the draft."""
    spans = lm.vocab.spans(draft.ids, start)
    return [
        DraftToken(
            token_id,
            key_text(lm.key_of(token_id)),
            index.char_of_byte(s),
            index.char_of_byte(e),
            row[token_id].item(),
            top_candidates(row, lm),
        )
        for token_id, row, (s, e) in zip(draft.ids, draft.probs, spans)
    ]


def union_table(result: EnsembleResult, names: Sequence[str]) -> list[UnionRow]:
    """The ensemble's union as rows, the most likely first (after sharpening, where it ran); `names`: the
    models in the order of the ensemble's views."""
    scores = None if result.core is None else result.core.token_scores
    table = [
        UnionRow(
            text=key_text(key),
            per_model={name: result.per_model[m, i].item() for m, name in enumerate(names)},
            before=result.before[i].item(),
            after=None if result.after is None else result.after[i].item(),
            raw_hex=raw_hex(key),
            scores=None if scores is None else {name: scores[m, i].item() for m, name in enumerate(names)},
        )
        for i, key in enumerate(result.keys)
    ]
    table.sort(key=lambda row: -(row.after if row.after is not None else row.before))
    return table


def method_values(result: EnsembleResult, lms: Sequence[LoadedModel], names: Sequence[str]) -> dict:
    """What CoRE or EVA did at the point, as `EnsemblePoint`'s fields (none for the other methods); `lms` and
    `names`: the models in the order of the ensemble's views."""
    values: dict = {}
    if result.core is not None:
        values["model_weights"] = dict(zip(names, result.core.weights.tolist()))
    if result.joined is not None:
        values["joined"] = [name for name, joined in zip(names, result.joined) if joined]
    if result.mapped is not None:
        values["mapped"] = [
            MappedCandidate(
                model=names[m.model],
                text=key_text(lms[m.model].key_of(m.token)),
                p=m.p,
                targets=[Candidate(key_text(lms[0].key_of(i)), w, raw_hex(lms[0].key_of(i))) for i, w in m.targets],
                raw_hex=raw_hex(lms[m.model].key_of(m.token)),
            )
            for m in result.mapped
        ]
    return values


def committed_token(lm: LoadedModel, piece: Piece, start: int, end: int) -> CommittedToken:
    """A committed piece of the drafter `lm`, at characters [start, end) of the response."""
    key = lm.key_of(piece.ids[0]) if len(piece.ids) == 1 else lm.vocab.join(piece.ids)
    reason = piece.reason
    return CommittedToken(
        text=key_text(key),
        start=start,
        end=end,
        ids=list(piece.ids),
        decision=piece.decision,
        drafted=piece.drafted,
        reason=None if reason is None else reason.text(piece.oov_like_for),
        sharpened=piece.sharpened,
        oov_like_for=list(piece.oov_like_for),
        reason_code=reason,
        raw_hex=raw_hex(key),
    )

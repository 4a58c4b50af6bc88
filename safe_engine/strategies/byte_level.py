"""Byte-level ensembling (ByteSampler, arXiv 2506.14123): each model turned exactly into a next-byte model,
and the models combined one byte at a time, so no model ever reads a tokenization it would not produce.

Each round chooses one byte. Every model's covering tree (`tokenization/next_byte.py`) gives its exact
next-byte distribution over 256 bytes and a stop symbol; ``mixture`` takes Σ wᵢ·pᵢ, ``product`` the
normalised Π pᵢ^wᵢ (weights normalised; where the models share no symbol the product falls back to the
mixture for that byte). The byte is the argmax, or drawn with the run's temperature and top-p. A model
whose paths all have probability 0 sits the byte out, and restarts from its canonical tokenization of the
text after it.

The response is the drafter's tokens: a token is committed when every covering path of the drafter starts
with it (its trunk), so `max_new_tokens` counts the drafter's canonical tokens of the text, as the other
strategies count theirs; bytes chosen past the last of them end with the run and are not in the text. The
stop symbol commits the drafter's spelling of the whole text and its end token.

Cost: a path is new whenever a token ends at the chosen byte, and each new path is one forward pass of its
model on the tokens it does not share with the session's cache (usually one), so about one pass per byte
per model: bytes-per-token passes per token, against one for token-level decoding (`passes_per_token`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..contract.events import ByteCandidate, ByteModelStep, ByteStep, Event
from ..contract.reasons import Decision, Reason
from ..run.participant import Participant
from ..run.piece import Piece
from ..run.state import Run
from ..tokenization.alignment import EOS_KEY, TokenBytes, display_piece
from ..tokenization.canonical import PairRule, canonical
from ..tokenization.next_byte import STOP, ByteTokens, CoveringTree, Path

SHOWN = 5  # candidate symbols per byte in the events


@lru_cache(maxsize=8)
def _byte_view(vocab: TokenBytes, stop_ids: frozenset[int]) -> tuple[ByteTokens, PairRule]:
    """A vocabulary's sorted spellings and pairwise rule, built once per process (the rule's masks too)."""
    return ByteTokens(vocab, stop_ids), PairRule(vocab)


def symbol_text(symbol: int) -> str:
    """A symbol as the events show it: the byte's character when printable ASCII, else <0xNN>; <eos>."""
    if symbol == STOP:
        return EOS_KEY
    return display_piece(bytes([symbol])) if 32 <= symbol < 127 else f"<0x{symbol:02X}>"


class ByteModel:
    """One model's covering tree, with the next-token log-probabilities of each path it has run."""

    def __init__(self, part: Participant):
        self.part = part
        self.tokens, self.rule = _byte_view(part.lm.vocab, frozenset(part.lm.eos_ids))
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}
        self.tree = CoveringTree(self.tokens, self.rule, self.logprobs)

    def logprobs(self, ids: tuple[int, ...]) -> torch.Tensor:
        row = self._memo.get(ids)
        if row is None:
            logits = self.part.logits(list(ids), [len(ids)])[0].float()
            row = torch.log_softmax(logits, -1)[: len(self.part.lm.vocab)]
            self._memo[ids] = row
        return row

    def push(self, byte: int) -> None:
        self.tree.push(byte)
        if not self.tree.paths:  # every path has probability 0: restart from the canonical spelling
            ids = tuple(canonical(self.part.lm.vocab, self.tree.raw))
            self.tree.paths = [Path(ids, 0.0, len(self.tree.raw))]
        alive = {p.ids for p in self.tree.paths}  # a later byte asks only for the paths' own rows
        self._memo = {ids: row for ids, row in self._memo.items() if ids in alive}
        self.part.forget_before(len(self.tree.trunk))


@dataclass
class ByteLevel:
    """The run's byte-level state: one covering tree per model, in role order."""

    models: list[ByteModel]

    @classmethod
    def of(cls, run: Run) -> ByteLevel:
        if run.strategy_state is None:
            run.strategy_state = cls([ByteModel(p) for p in run.parts])
        return run.strategy_state


def combine(log_probs: list[torch.Tensor], weights: list[float], how: str) -> torch.Tensor:
    """The ensemble's next-symbol probabilities from each model's normalised log-probabilities."""
    live = [(lp, w) for lp, w in zip(log_probs, weights) if w > 0 and torch.isfinite(lp).any()]
    total = sum(w for _, w in live)
    if how == "product":
        joint = sum((w / total) * lp for lp, w in live)
        if torch.isfinite(joint).any():
            return torch.softmax(joint, -1)
    return sum((w / total) * lp.exp() for lp, w in live)


def byte_level_step(run: Run) -> Iterator[Event]:
    """Choose one byte for every model, and commit the drafter's tokens it fixed."""
    state = ByteLevel.of(run)
    passes = [m.part.session.stats.passes for m in state.models]
    with run.stats.timed("verify"):
        own = [torch.log_softmax(m.tree.scores(), -1) for m in state.models]
    with run.stats.timed("ensemble"):
        probs = combine(own, [m.part.weight for m in state.models], run.config.byte_combine)
        symbol, p = run.sampler.pick(run.sampler.scaled(probs.log()).softmax(-1))
    run.stats.ensembled += 1
    offset = len(state.models[0].tree.raw)
    if symbol != STOP:
        for model in state.models:
            model.push(symbol)
    yield _step_event(run, state, own, probs, symbol, p, offset, passes)
    drafter = state.models[0]
    if symbol == STOP:
        path = drafter.tree.spelling_all()
        ids = list(path.ids) if path else canonical(drafter.part.lm.vocab, drafter.tree.raw)
        ids = ids[len(run.response.ids) :] + [_end_token(drafter.part)]
    else:
        ids = list(drafter.tree.trunk[len(run.response.ids) :])
    ids = ids[: run.remaining()]
    if ids:
        yield run.commit([Piece([t], Decision.ENSEMBLED, Reason.BYTE_LEVEL) for t in ids])


def _end_token(part: Participant) -> int:
    eos = part.lm.tokenizer.eos_token_id
    return eos if eos in part.lm.eos_ids else min(part.lm.eos_ids)


def _step_event(
    run: Run,
    state: ByteLevel,
    own: list[torch.Tensor],
    probs: torch.Tensor,
    symbol: int,
    p: float,
    offset: int,
    passes_before: list[int],
) -> ByteStep:
    names = [m.part.name for m in state.models]
    top = torch.topk(probs, min(SHOWN, len(probs))).indices.tolist()
    candidates = [
        ByteCandidate(
            symbol_text(s),
            float(probs[s]),
            {n: float(lp[s].exp()) if math.isfinite(float(lp[s])) else 0.0 for n, lp in zip(names, own)},
        )
        for s in top
        if probs[s] > 0
    ]
    models = []
    for model, before in zip(state.models, passes_before):
        trunk = len(model.tree.trunk)
        vocab = model.part.lm.vocab
        paths = [[display_piece(vocab[t]) for t in path.ids[trunk:]] for path in model.tree.paths]
        models.append(ByteModelStep(model.part.name, paths, trunk, model.part.session.stats.passes - before))
    return ByteStep(
        round=run.round,
        offset=offset,
        chosen=symbol_text(symbol),
        p=p,
        combine=run.config.byte_combine,
        sampled=not run.sampler.greedy,
        candidates=candidates,
        models=models,
    )

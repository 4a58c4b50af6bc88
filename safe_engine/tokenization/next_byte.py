"""A token model's exact next-byte distribution (ByteSampler's valid covering tree, arXiv 2506.14123).

For response bytes x, the covering paths are the canonical token paths that spell a prefix of x and whose
next token would cover the rest of x and go on: a path p ending at byte k of x, followed by a token t whose
bytes start with x[k:]. P(x·b) sums P(p)·P(t | p) over the pairs whose t has byte b right after x, and the
stop symbol sums P(p)·P(end | p) over the paths spelling all of x. A token that ends exactly at the end of
x is a path of its own (it is counted through its continuations), so nothing is counted twice; tokens
that `canonical.PairRule` rejects after p's last token carry no mass, so the model never reads a
tokenization it would not produce. Normalised over the 257 symbols, these are the model's next-byte
probabilities; `tests/test_byte_level.py` checks them against brute-force enumeration.

A path is kept while some token could still cover the rest of x from its end, so at most one path per
byte of the longest token is alive; the tokens every path shares are the trunk, fixed for good.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from .alignment import TokenBytes
from .canonical import PairRule

STOP = 256  # the symbol after the 256 bytes: the model ends the text here
SYMBOLS = 257

LogProbs = Callable[[tuple[int, ...]], torch.Tensor]
"""A path's next-token log-probabilities over the vocabulary (the caller runs and remembers the model)."""


@dataclass(frozen=True)
class Path:
    """A canonical token path of the response: its ids, log P(ids), and the bytes they spell."""

    ids: tuple[int, ...]
    logp: float
    end: int


class ByteTokens:
    """A vocabulary as byte strings: the tokens that start with given bytes, and each token's first byte."""

    def __init__(self, vocab: TokenBytes, stop_ids: Collection[int]):
        spelled = sorted((vocab[i], i) for i in range(len(vocab)) if vocab[i] and i not in vocab.special_ids)
        self.keys = [raw for raw, _ in spelled]
        self.ids = torch.tensor([i for _, i in spelled], dtype=torch.long)
        self.lengths = torch.tensor([len(raw) for raw in self.keys], dtype=torch.long)
        self.spelling = torch.zeros((len(self.keys), int(self.lengths.max())), dtype=torch.uint8)
        for row, raw in enumerate(self.keys):  # each token's bytes, one row each (zero past its end)
            self.spelling[row, : len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        self.first = torch.full((len(vocab),), -1, dtype=torch.long)
        self.first[self.ids] = self.spelling[:, 0].long()
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long)

    def _range(self, prefix: bytes) -> tuple[int, int]:
        """The rows of the tokens that start with `prefix` (sorted, so they are contiguous)."""
        lo = bisect.bisect_left(self.keys, prefix)
        return lo, bisect.bisect_right(self.keys, prefix, lo=lo, key=lambda raw: raw[: len(prefix)])

    def continuing(self, prefix: bytes) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids of the tokens that start with `prefix` and are longer, and the byte each has after it."""
        lo, hi = self._range(prefix)
        longer = self.lengths[lo:hi] > len(prefix)
        if len(prefix) >= self.spelling.shape[1]:
            return self.ids[:0], self.ids[:0]
        return self.ids[lo:hi][longer], self.spelling[lo:hi, len(prefix)][longer].long()

    def exactly(self, raw: bytes) -> list[int]:
        """Ids of the tokens spelled exactly `raw`."""
        lo, hi = bisect.bisect_left(self.keys, raw), bisect.bisect_right(self.keys, raw)
        return self.ids[lo:hi].tolist()

    def extends(self, prefix: bytes) -> bool:
        """Some token is longer than `prefix` and starts with it."""
        lo, hi = self._range(prefix)
        return bool((self.lengths[lo:hi] > len(prefix)).any())


def group_logsumexp(values: torch.Tensor, groups: torch.Tensor, size: int) -> torch.Tensor:
    """log Σ exp(values) per group (−inf for an empty group)."""
    out = torch.full((size,), -math.inf, dtype=torch.float64)
    if values.numel() == 0:
        return out
    peak = out.clone().scatter_reduce(0, groups, values, "amax")
    live = peak > -math.inf
    shifted = torch.where(live[groups], values - peak[groups], torch.full_like(values, -math.inf))
    sums = torch.zeros(size, dtype=torch.float64).index_add(0, groups, shifted.exp())
    out[live] = peak[live] + sums[live].log()
    return out


class CoveringTree:
    """One model's covering paths over the response bytes, advanced one byte at a time."""

    def __init__(self, tokens: ByteTokens, rule: PairRule, logprobs: LogProbs):
        self.tokens = tokens
        self.rule = rule
        self.logprobs = logprobs
        self.raw = b""
        self.paths = [Path((), 0.0, 0)]

    def scores(self) -> torch.Tensor:
        """Unnormalised log P(x·s) for the 257 symbols s (−inf where no covering path leads)."""
        parts = []
        for path in self.paths:
            lp = self.logprobs(path.ids).double()
            valid = self.rule.valid_after(path.ids[-1] if path.ids else None)
            if path.end == len(self.raw):
                ids = torch.nonzero(valid & (self.tokens.first >= 0)).flatten()
                parts.append((lp[ids] + path.logp, self.tokens.first[ids]))
                stop = torch.logsumexp(lp[self.tokens.stop_ids], 0) if len(self.tokens.stop_ids) else -math.inf
                parts.append((torch.tensor([float(stop) + path.logp], dtype=torch.float64), torch.tensor([STOP])))
            else:
                ids, following = self.tokens.continuing(self.raw[path.end :])
                keep = valid[ids] if len(ids) else ids.bool()
                parts.append((lp[ids[keep]] + path.logp, following[keep]))
        values = torch.cat([v for v, _ in parts]) if parts else torch.zeros(0, dtype=torch.float64)
        groups = torch.cat([g for _, g in parts]) if parts else torch.zeros(0, dtype=torch.long)
        return group_logsumexp(values, groups, SYMBOLS)

    def push(self, byte: int) -> list[Path]:
        """Advance by one byte; returns the paths that a token ending at this byte completed."""
        self.raw += bytes([byte])
        kept, born = [], []
        for path in self.paths:
            rest = self.raw[path.end :]
            last = path.ids[-1] if path.ids else None
            completing = [t for t in self.tokens.exactly(rest) if self.rule.valid_after(last)[t]]
            if completing:
                lp = self.logprobs(path.ids)
                born += [Path((*path.ids, t), path.logp + float(lp[t]), len(self.raw)) for t in completing]
            if self.tokens.extends(rest):
                kept.append(path)
        self.paths = [p for p in kept + born if p.logp > -math.inf]
        return born

    @property
    def trunk(self) -> tuple[int, ...]:
        """The ids every covering path starts with: fixed, whatever bytes come next."""
        if not self.paths:
            return ()
        first = self.paths[0].ids
        size = len(first)
        for path in self.paths[1:]:
            size = min(size, len(path.ids))
            while path.ids[:size] != first[:size]:
                size -= 1
        return first[:size]

    def spelling_all(self) -> Path | None:
        """The path that spells exactly the bytes so far, if one is alive (the one the stop symbol ends)."""
        whole = [p for p in self.paths if p.end == len(self.raw)]
        return max(whole, key=lambda p: p.logp) if whole else None

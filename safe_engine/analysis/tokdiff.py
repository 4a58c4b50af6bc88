"""Why tokenizers disagree: pair view of a text, corpus scan, vocabulary overlap, conditioning probe.

Built only on `alignment` (byte spans, boundary sets, SAFE's OOV-like test), so the debugger shows
exactly what the ensembling strategies decide on. Byte offsets stay the truth; character offsets are
derived for display and JSON. Boundaries are the *interior* ones (the start and end of the text are
shared by every tokenizer and would only inflate the agreement).
"""

from __future__ import annotations

import bisect
import functools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from itertools import compress
from typing import NamedTuple

import torch

from ..contract.errors import ConfigError
from ..decisions.ensemble import first_subtoken
from ..models.embedded import Progress
from ..models.loading import LoadedModel, LoadOptions, load_tokenizer
from ..models.specs import resolve_spec
from ..run.damage import kl_divergence
from ..tokenization.alignment import (
    CharIndex,
    TokenBytes,
    Tokenization,
    display_piece,
    oov_like,
    shared_boundaries,
    tokenize,
    visible,
)

_SPAN = re.compile(r"\w+|[^\w\s]+")


def direction(a: str, b: str) -> str:
    """Key of "a's tokens that are OOV-like for b"."""
    return f"{a}->{b}"


_VOCABS: dict[tuple[str, LoadOptions], TokenBytes] = {}


def load_vocabs(
    specs: Sequence[str], options: LoadOptions = LoadOptions(), progress: Progress | None = None
) -> dict[str, TokenBytes]:
    """Tokenizers only (no weights), keyed by model name; each spec loads once per process."""
    names = [resolve_spec(spec).short_name for spec in specs]
    if len(names) < 2:
        raise ConfigError("comparing tokenizers needs at least two models")
    if len(set(names)) < len(names):
        raise ConfigError(f"the models must differ (got {', '.join(names)})")
    for spec in specs:
        if (spec, options) not in _VOCABS:
            _VOCABS[spec, options] = TokenBytes(load_tokenizer(spec, options, progress))
    return {name: _VOCABS[spec, options] for spec, name in zip(specs, names)}


class Token(NamedTuple):  # a tuple: a long text makes hundreds of thousands of them
    text: str  # its bytes as text; bytes that are not whole characters shown as <0xNN>
    start: int  # character offsets; a token holding part of a character covers all of it
    end: int
    start_byte: int
    end_byte: int
    id: int
    partial: bool  # not whole UTF-8 characters (byte fallback)
    oov_for: tuple[str, ...]  # the models it is OOV-like for


@dataclass
class PairView:
    """Two or more tokenizations of one text on its bytes."""

    text: str
    tokens: dict[str, list[Token]]
    boundaries: dict[str, frozenset[int]]  # interior byte offsets where each model's tokens end
    shared: frozenset[int]  # interior byte offsets every model has
    index: CharIndex

    @property
    def names(self) -> list[str]:
        return list(self.tokens)

    @property
    def oov_like(self) -> dict[str, list[Token]]:
        return {
            direction(a, b): [t for t in self.tokens[a] if b in t.oov_for]
            for a in self.names
            for b in self.names
            if a != b
        }

    def char_offsets(self, byte_offsets) -> list[int]:
        """Character offsets of the boundaries that lie between characters (not inside one)."""
        return sorted(self.index.char_of_byte(b) for b in byte_offsets if self.index.is_char_boundary(b))

    def only(self, name: str) -> frozenset[int]:
        """Boundaries of this model that some other model lacks (for a pair: only this side has them)."""
        return self.boundaries[name] - self.shared

    def counts(self) -> dict:
        union = frozenset().union(*self.boundaries.values())
        return {
            "tokens": {name: len(toks) for name, toks in self.tokens.items()},
            "boundaries": {name: len(b) for name, b in self.boundaries.items()},
            "shared_boundaries": len(self.shared),
            "shared_ratio": len(self.shared) / len(union) if union else 1.0,
            "oov_like": {key: len(toks) for key, toks in self.oov_like.items()},
        }

    def to_dict(self) -> dict:
        return {
            "models": self.names,
            "tokens": {name: [t._asdict() for t in toks] for name, toks in self.tokens.items()},
            "shared_boundaries": self.char_offsets(self.shared),
            "only_boundaries": {name: self.char_offsets(self.only(name)) for name in self.names},
            "oov_like": {key: [t._asdict() for t in toks] for key, toks in self.oov_like.items()},
            "counts": self.counts(),
        }


def _whole_chars(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def pair_view(text: str, vocabs: Mapping[str, TokenBytes]) -> PairView:
    """Each model's canonical tokenization of `text`, shared/one-sided boundaries and OOV-like tokens."""
    if len(vocabs) < 2:
        raise ConfigError("comparing tokenizers needs at least two models")
    raw = text.encode("utf-8")
    index = CharIndex(text)
    toks: dict[str, Tokenization] = {name: tokenize(vocab, text) for name, vocab in vocabs.items()}
    edges = {0, len(raw)}
    tokens = {}
    for name, tok in toks.items():
        others = [other for other in toks if other != name]
        flags = zip(*(oov_like(tok.spans, toks[other]) for other in others))  # per token: one flag per other
        tokens[name] = [
            Token(
                display_piece(raw[s:e]),
                *index.char_span(s, e),
                s,
                e,
                token_id,
                not _whole_chars(raw[s:e]),
                tuple(compress(others, flag)),
            )
            for (s, e), token_id, flag in zip(tok.spans, tok.ids, flags)
        ]
    return PairView(
        text,
        tokens,
        {name: tok.boundaries - edges for name, tok in toks.items()},
        shared_boundaries(list(toks.values())) - edges,
        index,
    )


@dataclass
class SpanBreak:
    span: str
    count: int
    breaks: int  # occurrences where the models' boundaries inside or at the edges of the span differ
    pieces: dict[str, str]  # each model's tokens over the first breaking occurrence, "|"-joined, visible


@dataclass
class CorpusScan:
    tokens: dict[str, int]
    oov_like: dict[str, int]  # per direction "a->b": a's tokens that are OOV-like for b
    oov_rate: dict[str, float]  # the same as a share of a's tokens
    spans: list[SpanBreak]  # spans (words, punctuation runs) that broke at least once, most breaks first


def corpus_scan(view: PairView) -> CorpusScan:
    """OOV-like rates and the words/punctuation runs whose tokenizations disagree most often."""
    disagree = sorted(frozenset().union(*view.boundaries.values()) - view.shared)
    ends = {name: [t.end_byte for t in toks] for name, toks in view.tokens.items()}
    seen: Counter[str] = Counter()
    breaks: dict[str, SpanBreak] = {}
    for match in _SPAN.finditer(view.text):
        span = match.group()
        seen[span] += 1
        start, end = view.index.byte_of_char(match.start()), view.index.byte_of_char(match.end())
        i = bisect.bisect_left(disagree, start)
        if i == len(disagree) or disagree[i] > end:
            continue
        if span not in breaks:
            pieces = {name: _pieces(toks, ends[name], start, end) for name, toks in view.tokens.items()}
            breaks[span] = SpanBreak(span, 0, 0, pieces)
        breaks[span].breaks += 1
    for row in breaks.values():
        row.count = seen[row.span]
    counts = view.counts()
    rates = {
        direction(a, b): counts["oov_like"][direction(a, b)] / max(counts["tokens"][a], 1)
        for a in view.names
        for b in view.names
        if a != b
    }
    rows = sorted(breaks.values(), key=lambda r: (-r.breaks, -r.count, r.span))
    return CorpusScan(counts["tokens"], counts["oov_like"], rates, rows)


def _pieces(tokens: list[Token], ends: list[int], start: int, end: int) -> str:
    """The tokens that overlap bytes [start, end), "|"-joined with whitespace visible."""
    i, out = bisect.bisect_right(ends, start), []
    while i < len(tokens) and tokens[i].start_byte < end:
        out.append(visible(tokens[i].text))
        i += 1
    return "|".join(out)


@functools.lru_cache(maxsize=4)
def common_words(n: int = 5000) -> tuple[str, ...]:
    """The most frequent English words from wordfreq (its lists ship inside the package: works offline)."""
    from wordfreq import top_n_list

    return tuple(word for word in top_n_list("en", n) if word.isalpha())


@dataclass
class WordAgreement:
    rate: float  # share of the words every model splits identically
    words: int
    differing: list[SpanBreak]  # count 1, breaks 1: the words split differently, with each model's pieces


def word_agreement(vocabs: Mapping[str, TokenBytes], words: Sequence[str] | None = None) -> WordAgreement:
    """The paper's word-list agreement: each word tokenized as " word" (mid-sentence form), same boundaries?

    Cached per set of tokenizers (about a second for 5,000 words), so treat the result as read-only.
    """
    return _word_agreement(tuple(vocabs.items()), tuple(common_words() if words is None else words))


@functools.lru_cache(maxsize=16)
def _word_agreement(vocabs: tuple[tuple[str, TokenBytes], ...], words: tuple[str, ...]) -> WordAgreement:
    differing = []
    for word in words:
        text = " " + word
        toks = {name: tokenize(vocab, text) for name, vocab in vocabs}
        if len({tok.boundaries for tok in toks.values()}) > 1:
            raw = text.encode("utf-8")
            pieces = {
                name: "|".join(visible(display_piece(raw[s:e])) for s, e in tok.spans) for name, tok in toks.items()
            }
            differing.append(SpanBreak(word, 1, 1, pieces))
    return WordAgreement(1 - len(differing) / len(words) if words else 1.0, len(words), differing)


def vocab_overlap(vocabs: Mapping[str, TokenBytes]) -> dict:
    """How many token strings (by their bytes: `Ġ`/`▁` are spaces, byte pieces are bytes) all models share."""
    strings = {name: set(vocab.id_of_bytes) for name, vocab in vocabs.items()}
    shared = set.intersection(*strings.values())
    return {
        "sizes": {name: len(s) for name, s in strings.items()},
        "shared": len(shared),
        "share": {name: len(shared) / len(s) for name, s in strings.items()},
    }


def unite_fill(string: str, vocabs: Mapping[str, TokenBytes]) -> dict[str, dict | None]:
    """The token whose logit UniTE's first-sub-token fill reads for `string` in each model (None: none)."""
    key = string.encode("utf-8")
    out: dict[str, dict | None] = {}
    for name, vocab in vocabs.items():
        token_id = first_subtoken(vocab, key)
        out[name] = (
            None
            if token_id is None
            else {"id": token_id, "text": display_piece(vocab[token_id]), "exact": vocab[token_id] == key}
        )
    return out


@dataclass
class ProbeResult:
    canonical: list[str]  # the span as the model splits it itself
    imposed: list[str]  # the span cut at the other model's boundaries, each piece in the model's tokens
    kl: float  # KL(next | canonical || next | imposed), nats
    top_canonical: list[tuple[str, float]]
    top_imposed: list[tuple[str, float]]
    continuation: str | None  # the model's first token of the text after the span
    rank_canonical: int | None  # 1 = the model's top choice
    rank_imposed: int | None


def probe(lm: LoadedModel, text: str, span: tuple[int, int], other: TokenBytes, top_k: int = 5) -> ProbeResult:
    """Why OOV-like tokens hurt: `lm`'s next-token distribution after `text[:span[1]]` tokenized its own
    way vs with `text[span[0]:span[1]]` cut where `other` puts boundaries (as an ensemble would feed it).

    Character offsets; the text after the span only supplies the true continuation.
    """
    first, last = span
    if not 0 <= first < last <= len(text):
        raise ConfigError(f"span {span} is not a non-empty range inside the text ({len(text)} characters)")
    index, raw, vocab = CharIndex(text), text.encode("utf-8"), lm.vocab
    start, end = index.byte_of_char(first), index.byte_of_char(last)
    cuts = [start] + sorted(b for b in tokenize(other, text).boundaries if start < b < end) + [end]
    head = tokenize(vocab, text[:first]).ids
    imposed_span = [i for a, b in zip(cuts, cuts[1:]) for i in vocab.encode_bytes(raw[a:b])]
    canonical = tokenize(vocab, text[:last])
    canonical_span = [i for i, (_, b) in zip(canonical.ids, canonical.spans) if b > start]
    bos = list(lm.tokenizer("")["input_ids"])  # what the tokenizer puts in front of any text (Gemma: <bos>)

    def next_logprobs(ids: list[int]):
        with closing(lm.open_session()) as session:  # wherever the model computes: here, a server, an actor
            logits = session.next_token_logits(bos + ids, [len(bos) + len(ids)])[0]
        return torch.log_softmax(logits[: len(vocab)].float(), dim=-1)

    p, q = next_logprobs(canonical.ids), next_logprobs(head + imposed_span)
    rest = tokenize(vocab, text[last:]).ids
    true_id = rest[0] if rest else None

    def top(logprobs):
        values, ids = torch.topk(logprobs, top_k)
        return [(display_piece(vocab[i]), v) for i, v in zip(ids.tolist(), values.exp().tolist())]

    def rank(logprobs):
        return None if true_id is None else int((logprobs > logprobs[true_id]).sum()) + 1

    return ProbeResult(
        canonical=[display_piece(vocab[i]) for i in canonical_span],
        imposed=[display_piece(vocab[i]) for i in imposed_span],
        kl=kl_divergence(p, q),
        top_canonical=top(p),
        top_imposed=top(q),
        continuation=None if true_id is None else display_piece(vocab[true_id]),
        rank_canonical=rank(p),
        rank_imposed=rank(q),
    )

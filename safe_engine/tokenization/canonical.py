"""Which token sequences a byte-level BPE tokenizer can produce: canonical spellings and the pairwise rule.

A BPE tokenizer spells every text one way (its canonical tokenization), and every prefix of a canonical
tokenization is the canonical tokenization of its own bytes. Within one pre-tokenized word, a sequence of
BPE tokens is canonical iff each adjacent pair is (the bigram property of BPE: a merge that would cross a
boundary is a merge between the two neighbours). So the byte-level strategy checks a path one pair at a
time: `PairRule.valid_after(a)` is the mask of tokens t with canonical(bytes(a) + bytes(t)) == [a, t], and
`valid_after(None)` the tokens that are canonical alone (the first token of a response).

Only byte-level BPE (GPT-2's byte alphabet: SmolLM2, Llama 3, Qwen) has this property on bytes. A
SentencePiece-style BPE merges *characters* and spells a character it lacks in `<0xNN>` byte pieces, so
the bytes of a character it has ("日", one token) also pass every pairwise check as three byte pieces,
which are never canonical: `refusal` names that family, and the strategy refuses it
(docs/algorithm.md#byte-level-ensembling).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from .alignment import TokenBytes, gpt2_chars, tokenize

SUPPORTED_KIND = "byte-level"


def refusal(vocab: TokenBytes) -> str | None:
    """Why the byte-level strategy cannot run this vocabulary exactly (None: it can)."""
    if vocab.kind == SUPPORTED_KIND and vocab.fast:
        return None
    family = "SentencePiece-style BPE with byte fallback" if vocab.kind == "sentencepiece" else "this tokenizer"
    return (
        f"byte-level ensembling is exact only for byte-level BPE tokenizers; {family} spells a character it "
        "has as byte pieces that pass every pairwise check (e.g. 日 as <0xE6><0x97><0xA5>)"
    )


def canonical(vocab: TokenBytes, raw: bytes) -> list[int]:
    """The tokenizer's own ids for `raw`. In byte-level BPE, bytes that are not UTF-8 text (a character cut
    by a token boundary) are one word of the BPE model, as they are inside the pre-tokenizer's word in any
    text; other families spell them as `tokenize` does, one byte piece each."""
    if vocab.kind == SUPPORTED_KIND:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return _bpe_word(vocab, raw)
    return tokenize(vocab, raw).ids


def _bpe_word(vocab: TokenBytes, raw: bytes) -> list[int]:
    return [token.id for token in vocab.tokenizer.backend_tokenizer.model.tokenize(gpt2_chars(raw))]


def _canonical_many(vocab: TokenBytes, raws: Sequence[bytes]) -> list[list[int]]:
    """`canonical` of many byte strings, the valid-UTF-8 ones read in one batch by the tokenizer."""
    out: list[list[int] | None] = [None] * len(raws)
    texts, where = [], []
    for i, raw in enumerate(raws):
        try:
            texts.append(raw.decode("utf-8"))
            where.append(i)
        except UnicodeDecodeError:
            out[i] = _bpe_word(vocab, raw)
    try:
        batch = vocab.read_many(texts)
    except Exception:  # a text the batch refuses: one at a time, as `tokenize` reads it
        batch = [tokenize(vocab, text).ids for text in texts]
    for i, ids, text in zip(where, batch, texts):
        out[i] = ids if vocab.join(ids) == text.encode("utf-8") else tokenize(vocab, text).ids
    return out  # type: ignore[return-value]


class PairRule:
    """Masks of the tokens that may follow a token on a canonical path, kept for the latest `keep` tokens."""

    def __init__(self, vocab: TokenBytes, keep: int = 256):
        self.vocab = vocab
        self.keep = keep
        self.spelled = [i for i in range(len(vocab)) if vocab[i] and i not in vocab.special_ids]
        self._masks: OrderedDict[int | None, torch.Tensor] = OrderedDict()

    def valid_after(self, last: int | None) -> torch.Tensor:
        """Bool mask over the vocabulary: t may follow `last` (None: t may start a response)."""
        mask = self._masks.get(last)
        if mask is None:
            mask = self._compute(last)
            self._masks[last] = mask
            while len(self._masks) > self.keep:
                self._masks.popitem(last=False)
        self._masks.move_to_end(last)
        return mask

    def _compute(self, last: int | None) -> torch.Tensor:
        head = [] if last is None else [last]
        before = b"" if last is None else self.vocab[last]
        spellings = _canonical_many(self.vocab, [before + self.vocab[t] for t in self.spelled])
        mask = torch.zeros(len(self.vocab), dtype=torch.bool)
        for t, ids in zip(self.spelled, spellings):
            mask[t] = ids == [*head, t]
        return mask

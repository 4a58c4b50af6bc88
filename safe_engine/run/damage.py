"""The damage that makes per-token ensembling fail, measured along a run (events) and summed up (stats).

- Non-canonical context: how many of a model's context tokens are not tokens of its own canonical
  tokenization of the same text (compared as byte spans). A verifier re-tokenizes the text every step,
  so its context is canonical by construction; the drafter's is what it appended, which per-token
  ensembling fills with pieces its tokenizer would never produce.
- Conditioning damage: where a model's context is non-canonical, KL(P(·|canonical) ‖ P(·|its context))
  of its next-token distribution after the same text — the tokenizer debugger's conditioning probe, run
  along the decode. It costs one extra forward pass, so it runs at most `DecodeConfig.damage_kl_steps`
  times (the first eligible steps); the events say where it was measured.
- OOV-like predictions: commits after which a model's own tokenization has no boundary where it was
  asked to predict (per-token's `CommittedToken.oov_like_for`).
- Degeneration of the output (`degeneration`): formulas in its docstring.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby

import torch

from ..contract.events import DamageMeasured, TextCommitted
from ..contract.reasons import Decision
from ..contract.sessions import Session
from ..tokenization.alignment import complete_utf8_prefix, tokenize
from .participant import Participant
from .response import Response
from .stats import RunStats

_UNITS = re.compile(r"\w+|[^\w\s]|\n")


def non_canonical(spans: Sequence[tuple[int, int]], canonical: Sequence[tuple[int, int]]) -> int:
    """How many of `spans` (a model's context tokens) are not spans of its canonical tokenization."""
    return len(set(spans) - set(canonical))


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> float:
    """KL(softmax(reference) ‖ softmax(other)) in nats, from two logit (or log-probability) rows over the
    same vocabulary."""
    p, q = torch.log_softmax(reference.float(), dim=-1), torch.log_softmax(other.float(), dim=-1)
    return max(float((p.exp() * (p - q)).sum()), 0.0)


def degeneration(text: str, tokens: Sequence[str]) -> dict:
    """Simple, comparable signs that an output has degenerated.

    - repeated_4gram_rate: 1 − distinct / all 4-grams of units (words, single punctuation marks, newlines);
    - longest_token_run: most consecutive identical committed tokens;
    - longest_line_run: most consecutive identical lines (stripped; blank lines count);
    - whitespace_share: share of committed tokens that are only whitespace;
    - replacement_chars: U+FFFD characters in the text.
    """
    units = _UNITS.findall(text)
    grams = list(zip(*(units[i:] for i in range(4))))
    lines = [line.strip() for line in text.split("\n")]
    return {
        "repeated_4gram_rate": 1 - len(set(grams)) / len(grams) if grams else 0.0,
        "longest_token_run": max((len(list(run)) for _, run in groupby(tokens)), default=0),
        "longest_line_run": max((len(list(run)) for _, run in groupby(lines)), default=0) if len(lines) > 1 else 0,
        "whitespace_share": sum(1 for t in tokens if t and not t.strip()) / len(tokens) if tokens else 0.0,
        "replacement_chars": text.count("\ufffd"),
    }


def degenerate(measures: dict) -> bool:
    """The line the collapse search draws: a long repeat, a repeated line, or mostly repeated text."""
    return (
        measures["longest_token_run"] >= 8
        or measures["longest_line_run"] >= 4
        or measures["repeated_4gram_rate"] >= 0.5
        or measures["whitespace_share"] >= 0.3
    )


@dataclass
class ModelDamage:
    non_canonical: int = 0
    non_canonical_max: int = 0
    kl: list[float] = field(default_factory=list)
    kl_eligible: int = 0  # steps with a non-canonical context (where KL was or could have been measured)
    oov_like_predictions: int = 0

    def summary(self) -> dict:
        return {
            "non_canonical": self.non_canonical,
            "non_canonical_max": self.non_canonical_max,
            "kl_mean": sum(self.kl) / len(self.kl) if self.kl else None,
            "kl_max": max(self.kl) if self.kl else None,
            "kl_sampled": len(self.kl),
            "kl_eligible": self.kl_eligible,
            "oov_like_predictions": self.oov_like_predictions,
        }


class DamageMeter:
    """Measures the drafter's context after every commit (verifiers re-tokenize canonically by
    construction) and counts every model's OOV-like predictions. Its own time goes to
    `stats.time_split["damage"]`, which the run's wall time leaves out."""

    def __init__(self, drafter: str, verifiers: Sequence[str], kl_steps: int, stats: RunStats):
        self.drafter, self.verifiers = drafter, list(verifiers)
        self.models = {name: ModelDamage() for name in [drafter, *verifiers]}
        self.kl_left = kl_steps
        self.stats = stats
        self._canonical: Session | None = None  # the drafter fed its canonical tokenization, for KL
        self._measured = 0  # committed tokens when damage was last measured

    def event(
        self, commit: TextCommitted | None, drafter: Participant, response: Response, predicts_next: bool
    ) -> DamageMeasured | None:
        """The measures after `commit`, the run's latest (None when nothing was committed since the last
        measure). OOV-like: the models its tokens name, but for a position skipped because of them."""
        if commit is None or self.stats.tokens == self._measured:
            return None
        self._measured = self.stats.tokens
        oov_like = {name for t in commit.tokens if t.decision != Decision.SKIPPED_OOV for name in t.oov_like_for}
        for name in oov_like:
            self.models[name].oov_like_predictions += 1
        models = self.measure(drafter, response.ids, response.raw, predicts_next)
        return DamageMeasured(
            commit.round, self.stats.tokens, {name: m | {"oov_like": name in oov_like} for name, m in models.items()}
        )

    def measure(
        self, drafter: Participant, response_ids: Sequence[int], raw: bytes, predicts_next: bool
    ) -> dict[str, dict]:
        """This commit's measures per model: {"non_canonical": n, "kl": nats or None, "kl_eligible": bool}.

        `drafter`: the drafting participant, whose response so far is `response_ids` spelling `raw`;
        `predicts_next`: the run goes on. Eligible: the context is non-canonical and a prediction follows;
        then None means the budget ran out."""
        complete = complete_utf8_prefix(raw)
        vocab = drafter.lm.vocab
        with self.stats.timed("damage"):
            canonical = tokenize(vocab, raw[:complete])
            spans = [s for s in vocab.spans(response_ids) if s[1] <= complete]
            count = non_canonical(spans, canonical.spans)
        kl, eligible = None, False
        record = self.models[self.drafter]
        record.non_canonical, record.non_canonical_max = count, max(record.non_canonical_max, count)
        if count and complete == len(raw) and predicts_next:
            eligible = True
            record.kl_eligible += 1
            if self.kl_left > 0:
                self.kl_left -= 1
                kl = self._kl(drafter, response_ids, canonical.ids)
                record.kl.append(kl)
        out = {self.drafter: {"non_canonical": count, "kl": kl, "kl_eligible": eligible}}
        return out | {name: {"non_canonical": 0, "kl": None, "kl_eligible": False} for name in self.verifiers}

    def _kl(self, drafter: Participant, response_ids: Sequence[int], canonical_ids: list[int]) -> float:
        """KL between the drafter's next-token distribution after the canonical ids and after its own."""
        if self._canonical is None:
            self._canonical = drafter.lm.open_session()
        with self.stats.timed("damage"):
            ids = drafter.prompt_ids + canonical_ids
            reference = self._canonical.next_token_logits(ids, [len(ids)])[0]
            self._canonical.forget_before(len(ids))
        actual = drafter.logits(response_ids, [len(response_ids)])[0]  # memoised: the next draft reuses it
        return kl_divergence(reference, actual)

    def summary(self, text: str, tokens: Sequence[str]) -> dict:
        return {
            "models": {name: m.summary() for name, m in self.models.items()},
            "degeneration": degeneration(text, tokens),
        }

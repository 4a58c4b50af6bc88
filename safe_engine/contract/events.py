"""Typed, JSON-serialisable events that every decoding strategy yields while it runs.

A consumer (the CLI, the web UI, a JSONL trace) only ever sees these. Offsets are *character* offsets
into the response text (`TextCommitted.delta`s concatenated). Decisions and reasons are stable codes
(`reasons.Decision`, `reasons.Reason`): ``reason_code`` carries the code, ``reason`` its sentence
(`Reason.text`; traces older than the codes carry only the sentence, which `Reason.parse` reads).
Decisions for a drafted position:

- ``accepted``: committed as drafted, nothing checked it (a single model decoding alone);
- ``skipped-oov``: ensembling there was unsafe — the boundary before the token is missing for some
  verifier (``oov_like`` per verifier; ``boundary_missing``, the sentence names them), the position is
  inside a UTF-8 character (``inside_character``, OOV-like for every verifier), or the drafted token is
  a special token with no text (``no_text``);
- ``skipped-consensus``: the draft is kept without an ensemble: ``unanimity`` or ``mean`` (greedy: the
  ensemble could not change the token), ``gate`` (GaC's gate: the drafter's top p ≥ 0.5), ``accepted``
  (sampling: kept with probability ``accept_p``);
- ``ensembled``: the ensemble ran (``no_consensus``, or ``resampled`` when sampling;
  ``EnsemblePoint.changed`` says whether it replaced the token);
- ``forced``: the user forced this text here (``DecodeConfig.force``, what-if branching); ``drafted``
  holds what the strategy would have committed when that differs.

Byte-level runs commit every drafter token as ``ensembled`` / ``byte_level``: the bytes it spells were
chosen one at a time by the ensemble (``ByteStep`` events, one per byte).

Per-token runs use the same decisions: ``ensembled`` at every step, ``skipped-consensus``/``gate``
where GaC's gate keeps the drafter's token, ``skipped-oov``/``inside_character`` where the drafter
finishes a character it started (no other model has a position there).

A token's ``text`` shows bytes that are not whole UTF-8 characters as ``<0xNN>``; ``raw_hex`` then
carries those bytes (None where ``text`` is the text itself), so no consumer parses the display.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from .reasons import Decision, Reason, StopReason

DECISIONS = tuple(Decision)


@dataclass
class Candidate:
    text: str
    p: float
    raw_hex: str | None = None  # the bytes where `text` shows them as <0xNN>


@dataclass
class DraftToken:
    id: int
    text: str
    start: int
    end: int
    p: float
    top_k: list[Candidate]


@dataclass
class VerifierView:
    model: str
    oov_like: bool  # the boundary before the drafted token is missing in this verifier's tokenization
    token: str | None = None  # the verifier's own token starting at that boundary
    p: float | None = None  # its probability of that token
    argmax: str | None = None
    agrees: bool | None = None  # argmax == its own token


@dataclass
class UnionRow:
    text: str
    per_model: dict[str, float]
    before: float
    after: float | None
    raw_hex: str | None = None  # the bytes where `text` shows them as <0xNN>
    scores: dict[str, float] | None = None  # CoRE: each model's token score for this candidate (mean 1 on support)


@dataclass
class MappedCandidate:
    """EVA: one of an assisting model's top tokens and the drafter's tokens the vocabulary alignment maps it
    to (`targets`: each target's `p` is the alignment's weight, not a probability)."""

    model: str
    text: str
    p: float  # the assisting model's probability of it
    targets: list[Candidate]
    raw_hex: str | None = None


@dataclass
class CommittedToken:
    text: str
    start: int
    end: int
    ids: list[int]
    decision: Decision
    drafted: str | None = None  # the drafted token an ensemble replaced (forced: what the strategy would have picked)
    reason: str | None = None  # the reason's sentence
    sharpened: bool = False
    oov_like_for: list[str] = field(default_factory=list)  # models for which ensembling here was OOV-like
    reason_code: Reason | None = None
    raw_hex: str | None = None  # the bytes where `text` shows them as <0xNN>


@dataclass
class Event:
    kind: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


@dataclass
class RunStarted(Event):
    kind: ClassVar[str] = "run_started"
    strategy: str
    drafter: str
    models: list[dict]
    prompts: dict[str, str]  # each model's formatted prompt
    config: dict


@dataclass
class TokensDrafted(Event):
    kind: ClassVar[str] = "tokens_drafted"
    round: int
    model: str
    tokens: list[DraftToken]


@dataclass
class PositionVerified(Event):
    kind: ClassVar[str] = "position_verified"
    round: int
    position: int  # index of the drafted token in the response (drafter tokens)
    token: str
    start: int
    end: int
    verifiers: list[VerifierView]
    mean_p: float | None  # Σ wᵢ·Pᵢ(own token) over the drafter and every verifier (weights normalised)
    decision: Decision
    reason: str | None = None  # the reason's sentence
    accept_p: float | None = None  # sampling: min(1, mean_p / P_draft), the probability the draft was kept with
    reason_code: Reason | None = None


@dataclass
class EnsemblePoint(Event):
    kind: ClassVar[str] = "ensemble_point"
    round: int
    position: int
    drafted: str | None  # None for per-token decoding, where nothing was drafted
    chosen: str
    changed: bool
    method: str
    sharpening: str | None  # the method that ran, None when the ensemble was not too smooth
    table: list[UnionRow]
    sampled: bool = False  # the choice was drawn from the (sharpened) ensemble distribution, not its argmax
    model_weights: dict[str, float] | None = None  # CoRE: each model's weight after the anchor clip (sum 1)
    joined: list[str] | None = None  # EVA: the models whose top token passed the drop filter and joined the mean
    mapped: list[MappedCandidate] | None = None  # EVA: the assisting models' top tokens and where they map


@dataclass
class ByteCandidate:
    text: str  # the byte's character (printable ASCII), <0xNN>, or <eos> for the stop symbol
    p: float  # in the ensemble
    per_model: dict[str, float]  # each model's own next-byte probability of it


@dataclass
class ByteModelStep:
    model: str
    paths: list[list[str]]  # the covering paths kept after the byte: each one's tokens past the trunk, shown
    trunk: int  # the model's tokens every path shares (fixed for good)
    passes: int  # forward passes this byte cost the model


@dataclass
class ByteStep(Event):
    """One byte of a byte-level run (`strategies/byte_level.py`): the ensemble's choice over the 256 bytes
    and the stop symbol, and what each model's covering tree kept."""

    kind: ClassVar[str] = "byte_step"
    round: int
    offset: int  # byte offset in the response where the chosen byte goes
    chosen: str  # as `ByteCandidate.text`
    p: float  # the probability it was chosen with
    combine: str  # mixture | product
    sampled: bool
    candidates: list[ByteCandidate]  # the most likely symbols
    models: list[ByteModelStep]


@dataclass
class TextCommitted(Event):
    kind: ClassVar[str] = "text_committed"
    round: int
    delta: str
    tokens: list[CommittedToken]
    elapsed_s: float  # since the run started: lets a replayed trace draw tokens/s


@dataclass
class DamageMeasured(Event):
    """After each commit (`damage.py`): per model, how many of its context tokens are not its canonical
    tokenization of the text, the KL of its next-token distribution against the canonical one (None where
    it was not measured), whether it could have been (`kl_eligible`: a non-canonical context; None then
    means the `damage_kl_steps` budget was spent), and whether this commit left it predicting from a
    position that is not one of its token boundaries."""

    kind: ClassVar[str] = "damage"
    round: int
    tokens: int  # committed tokens so far
    models: dict[str, dict]  # name -> {"non_canonical": int, "kl": float | None, "kl_eligible": bool, "oov_like": bool}


@dataclass
class RunFinished(Event):
    kind: ClassVar[str] = "run_finished"
    text: str
    stop_reason: (
        StopReason  # eos | stop (a stop sequence; `text` ends right after it) | max_new_tokens | stopped (cancelled)
    )
    stats: dict  # RunStats.to_dict(), with "damage": {"models": {name: ...}, "degeneration": {...}} (damage.py)


EVENT_TYPES = {
    cls.kind: cls
    for cls in (
        RunStarted,
        TokensDrafted,
        PositionVerified,
        EnsemblePoint,
        ByteStep,
        TextCommitted,
        DamageMeasured,
        RunFinished,
    )
}


def write_jsonl(events: Iterable[Event], handle) -> Iterator[Event]:
    """Pass events through while appending each one as a JSON line (traces stay valid if a run is cut)."""
    for event in events:
        handle.write(event.to_json() + "\n")
        handle.flush()
        yield event

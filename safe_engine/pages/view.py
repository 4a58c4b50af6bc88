"""Folds one run's events into what the UI draws, so a live run and a replayed trace render the same way.

Events are dicts (``Event.to_dict()`` or one JSONL line). The engine numbers positions in drafter ids and
one committed token can span several ids (an ensembled string the drafter spells in pieces), so the
draft / verify / ensemble details of a round are matched to its committed tokens by id offset.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..run.damage import ModelDamage
from ..tokenization.alignment import EOS_KEY

DAMAGE_KEYS = ("non_canonical", "non_canonical_max", "kl_mean", "kl_max", "kl_sampled")  # the drafter's, from stats


@dataclass
class TokenView:
    index: int
    round: int
    text: str
    start: int  # character offsets in the response text
    end: int
    special: bool  # takes no characters of the response text (an end marker)
    decision: str
    drafted: str | None  # the drafted token an ensemble replaced
    reason: str | None
    sharpened: bool
    oov_like_for: list[str]
    changed: bool  # the ensemble picked something else than the drafter would have
    draft: dict | None = None  # the DraftToken it was drafted as (p, top_k)
    verify: dict | None = None  # its PositionVerified event
    point: int | None = None  # index of its EnsemblePoint in RunView.points
    byte_steps: list[int] | None = None  # byte-level: indices in RunView.byte_steps of the bytes that spell it


class RunView:
    """One run's events folded for drawing. A plain class, not a dataclass: gradio's State serializes a dataclass
    value with `dataclasses.asdict` (only to drop the result) for every new session and at every update of the
    state: CPU per visitor, and more per frame as a live run grows, taken from the forward passes of everyone
    else's runs."""

    def __init__(self, started: dict | None = None):
        self.events: list[dict] = []
        self.tokens: list[TokenView] = []
        self.points: list[dict] = []
        self.byte_steps: list[dict] = []  # byte-level runs: one ByteStep per byte chosen
        self.commits: list[dict] = []  # tokens, ensembled, elapsed (s since the start) per commit
        self.damage: list[dict] = []  # the damage events, one per commit (none in older traces)
        self.started = started
        self.finished: dict | None = None
        self.pinned: int | None = None  # the token whose details the page shows (set by a click)
        self.diverge: int | None = None  # the first token where this run and its what-if counterpart differ
        self._pending: dict[int, dict] = {}  # id position → details of the round being decided
        self._ids = 0  # drafter ids committed so far
        self._bytes = 0  # response bytes committed so far (byte-level steps are placed by byte offset)
        self._next_step = 0  # the first byte step no committed token holds yet

    @classmethod
    def of(cls, events: list[dict]) -> RunView:
        view = cls()
        for event in events:
            view.add(event)
        return view

    def add(self, event: dict) -> None:
        self.events.append(event)
        kind = event["kind"]
        if kind == "run_started":
            self.started = event
        elif kind == "tokens_drafted":
            for j, token in enumerate(event["tokens"]):
                self._pending.setdefault(self._ids + j, {})["draft"] = token
        elif kind == "position_verified":
            self._pending.setdefault(event["position"], {})["verify"] = event
        elif kind == "ensemble_point":
            self.points.append(event)
            self._pending.setdefault(event["position"], {})["point"] = len(self.points) - 1
        elif kind == "byte_step":
            self.byte_steps.append(event)
        elif kind == "text_committed":
            self._commit(event)
        elif kind == "damage":
            self.damage.append(event)
        elif kind == "run_finished":
            self.finished = event

    def _commit(self, event: dict) -> None:
        for token in event["tokens"]:
            info = self._pending.get(self._ids, {})
            point = info.get("point")
            self.tokens.append(
                TokenView(
                    index=len(self.tokens),
                    round=event["round"],
                    text=token["text"],
                    start=token["start"],
                    end=token["end"],
                    special=token["start"] == token["end"],
                    decision=token["decision"],
                    drafted=token["drafted"],
                    reason=token["reason"],
                    sharpened=token["sharpened"],
                    oov_like_for=token["oov_like_for"],
                    changed=point is not None and self.points[point]["changed"],
                    draft=info.get("draft"),
                    verify=info.get("verify"),
                    point=point,
                    byte_steps=self._steps_of(token) if self.byte_steps else None,
                )
            )
            self._ids += len(token["ids"])
        self._pending.clear()
        self.commits.append(
            {"tokens": len(self.tokens), "ensembled": len(self.points), "elapsed": event.get("elapsed_s")}
        )

    def _steps_of(self, token: dict) -> list[int]:
        """The byte steps that chose a committed token's bytes (an end token: the step that chose to stop)."""
        special = token["start"] == token["end"] and not token.get("raw_hex")
        size = (
            0 if special else len(bytes.fromhex(token["raw_hex"]) if token.get("raw_hex") else token["text"].encode())
        )
        self._bytes += size
        first = self._next_step
        steps = self.byte_steps
        while self._next_step < len(steps) and (
            steps[self._next_step]["offset"] < self._bytes or special and steps[self._next_step]["chosen"] == EOS_KEY
        ):
            self._next_step += 1
        return list(range(first, self._next_step))

    # ------------------------------------------------------------------ what the page shows
    @property
    def strategy(self) -> str:
        return self.started["strategy"] if self.started else ""

    @property
    def label(self) -> str:
        """The engine's comparison labels: ``single:<model>``, ``per-token``, ``safe``."""
        if not self.started:
            return ""
        return f"single:{self.started['drafter']}" if self.strategy == "single" else self.strategy

    @property
    def models(self) -> list[str]:
        return [m["name"] for m in self.started["models"]] if self.started else []

    @property
    def response(self) -> str:
        return "".join(e["delta"] for e in self.events if e["kind"] == "text_committed")

    def context(self, index: int, max_chars: int = 200) -> tuple[str, int]:
        """The words around token `index` (at most about `max_chars` characters, cut before a whitespace so
        each word keeps the leading space it is tokenized with) and where that window starts in the response."""
        text, token = self.response, self.tokens[index]
        room = max(max_chars - (token.end - token.start), 0) // 2
        lo, hi = max(token.start - room, 0), min(token.end + room, len(text))
        if lo > 0:
            lo = next((i for i in range(lo, token.start) if text[i].isspace()), token.start)
        if hi < len(text):
            hi = next((i for i in range(hi, token.end, -1) if text[i].isspace()), token.end)
        return text[lo:hi], lo

    def pinned_point(self) -> int | None:
        """The pinned token's ensemble point, if it has one; charts fall back to the latest point."""
        if self.pinned is None or not 0 <= self.pinned < len(self.tokens):
            return None
        return self.tokens[self.pinned].point

    def damage_after(self, index: int) -> dict | None:
        """The damage event of the commit that holds token `index` (it counts the tokens committed so far)."""
        return next((d for d in self.damage if d["tokens"] > index), None)

    def damage_summary(self) -> dict | None:
        """The drafter's context damage, every model's OOV-like predictions and (once finished) the output's
        degeneration: the engine's summary when the run finished; while it runs, the engine's per-model
        counters rebuilt from the damage events (the two agree at the end); None for a trace recorded before
        runs measured damage."""
        stats = (self.finished or {}).get("stats", {}).get("damage")
        if stats:
            models, degeneration = stats["models"], stats["degeneration"]
        elif self.damage:
            models, degeneration = {name: m.summary() for name, m in self._damage_so_far().items()}, None
        else:
            return None
        drafter = self.started["drafter"]
        return {
            "drafter": drafter,
            **{k: models[drafter][k] for k in DAMAGE_KEYS},
            "oov_like_predictions": sum(m["oov_like_predictions"] for m in models.values()),
            "degeneration": degeneration,
        }

    def _damage_so_far(self) -> dict[str, ModelDamage]:
        """The engine's per-model damage counters, folded from the damage events of a run still going."""
        models: dict[str, ModelDamage] = {}
        for event in self.damage:
            for name, m in event["models"].items():
                counter = models.setdefault(name, ModelDamage())
                counter.non_canonical = m["non_canonical"]
                counter.non_canonical_max = max(counter.non_canonical_max, m["non_canonical"])
                counter.kl += [] if m["kl"] is None else [m["kl"]]
                counter.kl_eligible += bool(m.get("kl_eligible"))
                counter.oov_like_predictions += bool(m["oov_like"])
        return models

    def metrics(self) -> dict:
        """Counted from the events, so a run cut short (Stop, a partial trace) still adds up."""
        tokens = len(self.tokens)
        ensembled = len(self.points) + len(self.byte_steps)  # byte-level: every byte is an ensemble, as its stats count
        if self.finished:
            wall = self.finished["stats"]["wall_s"]
        else:
            wall = next((c["elapsed"] for c in reversed(self.commits) if c["elapsed"] is not None), None)
        return {
            "tokens": tokens,
            "ensembled": ensembled,
            "e_t": ensembled / tokens if tokens else 0.0,
            "replaced": sum(t.changed for t in self.tokens),
            "oov_skips": sum(len(t.oov_like_for) for t in self.tokens if t.decision == "skipped-oov"),
            "consensus_skips": sum(t.decision == "skipped-consensus" for t in self.tokens),
            "damaged": sum(bool(t.oov_like_for) and t.decision != "skipped-oov" for t in self.tokens),  # per-token
            "sharpened": sum(p["sharpening"] is not None for p in self.points),
            "wall_s": wall,
            "tokens_per_s": tokens / wall if wall else None,
            "stop_reason": self.finished["stop_reason"] if self.finished else None,
            "bytes": len(self.byte_steps),
            "passes_per_token": (self.finished or {}).get("stats", {}).get("passes_per_token"),
        }


def first_difference(a: RunView, b: RunView) -> int | None:
    """The first committed token where two runs differ (by text); None while they agree as far as both
    go. A run that ended (not stopped) shorter than the other differs where it ended."""
    for x, y in zip(a.tokens, b.tokens):
        if x.text != y.text:
            return x.index
    for short, long in ((a, b), (b, a)):
        if short.finished and short.finished["stop_reason"] != "stopped" and len(short.tokens) < len(long.tokens):
            return len(short.tokens)
    return None

"""Greedy decoding strategies behind one interface: ``decode(models, prompt, config)`` yields events.

- ``single``: the drafter alone.
- ``per-token``: UniTE at every step (the failing baseline): every model runs every step, the union
  argmax is committed, the drafter consumes it and every other model re-tokenizes the text.
- ``safe``: Generate → Verify → Ensemble (SAFE.md). ``exact`` mode is the paper's algorithm: at most one
  ensemble per round and the rest of the draft is dropped. ``fast`` mode keeps scanning the same draft
  after an ensemble that kept the drafted token (nothing changed, the verifier logits are still valid),
  so fewer drafts are thrown away; outputs can differ only because later positions see a shorter
  lookahead. In both modes a dropped draft is not recomputed: the drafter's memoised logits redraft it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

import torch

from .alignment import EOS_KEY, CharIndex, Tokenization, complete_utf8_prefix, display_piece, tokenize
from .ensemble import METHODS, SHARPENING, EnsembleConfig, EnsembleResult, ModelView, ensemble
from .errors import ConfigError
from .events import (
    Candidate,
    CommittedToken,
    DraftToken,
    EnsemblePoint,
    Event,
    PositionVerified,
    RunFinished,
    RunStarted,
    TextCommitted,
    TokensDrafted,
    UnionRow,
    VerifierView,
)
from .models import LoadedModel
from .runtime import ModelSession
from .stats import RunStats

STRATEGIES = ("single", "per-token", "safe")
SAFE_MODES = ("exact", "fast")
MAX_NEW_TOKENS = 4096
TOP_K_SHOWN = 5  # candidates per drafted token in events


@dataclass(frozen=True)
class DecodeConfig:
    strategy: str = "safe"
    max_new_tokens: int = 64
    lookahead: int = 5
    drafter: int = 0  # index into the model list
    safe_mode: str = "fast"
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    adaptive_lookahead: bool = False  # SAFE: draft fewer tokens after a replacement (changes outputs a little)

    def validate(self, model_count: int) -> None:
        ens = self.ensemble
        checks = [
            (self.strategy in STRATEGIES, f"strategy must be one of {', '.join(STRATEGIES)}"),
            (1 <= self.max_new_tokens <= MAX_NEW_TOKENS, f"max new tokens must be 1..{MAX_NEW_TOKENS}"),
            (1 <= self.lookahead <= 64, "lookahead must be 1..64"),
            (self.safe_mode in SAFE_MODES, f"safe mode must be one of {', '.join(SAFE_MODES)}"),
            (ens.method in METHODS, f"ensemble method must be one of {', '.join(METHODS)}"),
            (ens.sharpen in SHARPENING, f"sharpening must be one of {', '.join(SHARPENING)}"),
            (1 <= ens.top_k <= 1000, "top-k must be 1..1000"),
            (0 < ens.sharpen_lambda < 1, "sharpening lambda must be in (0, 1)"),
            (0 <= self.drafter < model_count, "the drafter must be one of the models"),
            (self.strategy == "single" or model_count >= 2, f"{self.strategy} needs at least two models"),
            (ens.weights is None or len(ens.weights) == model_count, "give one weight per model"),
            (ens.weights is None or (min(ens.weights) >= 0 and sum(ens.weights) > 0), "weights must be ≥ 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


@dataclass
class Participant:
    """A model taking part in one run, under a name unique within the run."""

    name: str
    lm: LoadedModel
    session: ModelSession
    prompt_ids: list[int]

    def logits(self, response_ids: Sequence[int], starts: Sequence[int]) -> torch.Tensor:
        """Next-token logits at response indices `starts` (0 = the first response token)."""
        ids = self.prompt_ids + list(response_ids)
        return self.session.next_token_logits(ids, [len(self.prompt_ids) + s for s in starts])

    def forget_before(self, response_index: int) -> None:
        self.session.forget_before(len(self.prompt_ids) + response_index)


class Response:
    """The drafter's response so far: ids, their exact bytes, and the text already announced."""

    def __init__(self, drafter: LoadedModel):
        self.vocab = drafter.vocab
        self.ids: list[int] = []
        self.raw = b""
        self._announced = 0  # characters already sent in TextCommitted deltas

    def extended(self, ids: Sequence[int]) -> bytes:
        return self.raw + self.vocab.join(ids)

    def commit(self, ids: Sequence[int]) -> tuple[int, int]:
        start = len(self.raw)
        self.ids.extend(ids)
        self.raw += self.vocab.join(ids)
        return start, len(self.raw)

    @property
    def text(self) -> str:
        return _text_and_index(self.raw)[0]

    def take_delta(self) -> str:
        text = self.text
        delta, self._announced = text[self._announced :], len(text)
        return delta


def _top(probs: torch.Tensor, lm: LoadedModel, k: int = TOP_K_SHOWN) -> list[Candidate]:
    top = torch.topk(probs, k)
    return [Candidate(_key_text(lm.key_of(i)), p) for p, i in zip(top.values.tolist(), top.indices.tolist())]


def _key_text(key) -> str:
    return display_piece(key) if isinstance(key, bytes) else key


def _complete(raw: bytes) -> bytes:
    return raw[: complete_utf8_prefix(raw)]


def _text_and_index(raw: bytes) -> tuple[str, CharIndex]:
    """Display text (a character still being spelled at the end is held back) and its offset index."""
    index = CharIndex.of_bytes(_complete(raw))
    return index.text, index


class Decoder:
    """State shared by the strategies for one run; `run()` picks the strategy."""

    def __init__(self, models: Sequence[LoadedModel], prompt: str, config: DecodeConfig, stop: threading.Event | None):
        config.validate(len(models))
        if not prompt or not prompt.strip():
            raise ConfigError("the prompt is empty")
        self.config = config
        self.stop = stop or threading.Event()
        names = _unique_names([m.name for m in models])
        order = [config.drafter] + [i for i in range(len(models)) if i != config.drafter]
        if config.strategy == "single":
            order = order[:1]
        self.parts = [Participant(names[i], models[i], ModelSession(models[i]), models[i].encode_prompt(prompt)) for i in order]
        for part in self.parts:
            limit = getattr(part.lm.model.config, "max_position_embeddings", None)
            if limit and len(part.prompt_ids) + config.max_new_tokens + config.lookahead > limit:
                raise ConfigError(
                    f"the prompt is {len(part.prompt_ids)} tokens for {part.name}; with {config.max_new_tokens} new "
                    f"tokens it exceeds the model's context of {limit}"
                )
        self.prompt = prompt
        self.drafter = self.parts[0]
        self.verifiers = self.parts[1:]
        self.response = Response(self.drafter.lm)
        self.stats = RunStats(config.strategy)
        self.stats.oov_skips = {v.name: 0 for v in self.verifiers}
        self.round = 0
        self._tokenized: tuple[bytes, list[Tokenization]] | None = None
        self._lookahead = config.lookahead
        self.started = time.perf_counter()
        self.stop_reason = "max_new_tokens"

    # ---------------------------------------------------------------- shared pieces
    def started_event(self) -> RunStarted:
        config = asdict(self.config)
        config["drafter"] = self.drafter.name
        return RunStarted(
            strategy=self.config.strategy,
            drafter=self.drafter.name,
            models=[{**p.lm.describe(), "name": p.name, "role": "drafter" if p is self.drafter else "verifier"} for p in self.parts],
            prompts={p.name: p.lm.format_prompt(self.prompt) for p in self.parts},
            config=config,
        )

    def remaining(self) -> int:
        return self.config.max_new_tokens - self.stats.tokens

    def draft(self, count: int) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
        """Greedy tokens from the drafter, with the logits each was drawn from and their softmax."""
        ids, logits = [], []
        eos = self.drafter.lm.eos_ids
        with self.stats.timed("draft"):
            for _ in range(count):
                if self.stop.is_set():
                    break
                row = self.drafter.logits(self.response.ids + ids, [len(self.response.ids) + len(ids)])[0]
                ids.append(int(torch.argmax(row)))
                logits.append(row)
                if ids[-1] in eos:
                    break
        self.stats.drafted += len(ids)
        return ids, logits, [torch.softmax(row.float(), dim=-1) for row in logits]

    def draft_event(self, ids: list[int], probs: list[torch.Tensor], index: CharIndex) -> TokensDrafted:
        """`index`: character offsets of the response extended by the draft."""
        lm = self.drafter.lm
        tokens = []
        for token_id, row, (s, e) in zip(ids, probs, lm.vocab.spans(ids, len(self.response.raw))):
            tokens.append(
                DraftToken(token_id, _key_text(lm.key_of(token_id)), index.char_of_byte(s), index.char_of_byte(e), row[token_id].item(), _top(row, lm))
            )
        return TokensDrafted(self.round, self.drafter.name, tokens)

    def commit(self, pieces: list[tuple[list[int], dict]]) -> TextCommitted:
        """Append (ids, CommittedToken fields) pieces to the response; count them and announce them."""
        spans = [self.response.commit(ids) for ids, _ in pieces]
        _, index = _text_and_index(self.response.raw)
        tokens = []
        for (ids, info), (s, e) in zip(pieces, spans):
            text = _key_text(self.drafter.lm.key_of(ids[0])) if len(ids) == 1 else display_piece(self.drafter.lm.vocab.join(ids))
            tokens.append(CommittedToken(text=text, start=index.char_of_byte(s), end=index.char_of_byte(e), ids=list(ids), **info))
            if any(i in self.drafter.lm.eos_ids for i in ids):
                self.stop_reason = "eos"
        self.stats.tokens += len(pieces)
        return TextCommitted(self.round, self.response.take_delta(), tokens, time.perf_counter() - self.started)

    def ensemble_at(self, position: int, views: list[ModelView], own: int, drafted: str | None) -> tuple[EnsembleResult, list[int], EnsemblePoint]:
        """Ensemble where the drafter would emit `own` (its drafted token; per-token: its argmax)."""
        with self.stats.timed("ensemble"):
            result = ensemble(views, self.config.ensemble)
            chosen, ids = self._drafter_spelling(result, views[0].logits, own)
        self.stats.ensembled += 1
        self.stats.replaced += ids != [own]
        self.stats.sharpened += result.after is not None
        names = [p.name for p in ([self.drafter] + self.verifiers)]
        table = [
            UnionRow(
                text=_key_text(key),
                per_model={n: result.per_model[m, i].item() for m, n in enumerate(names)},
                before=result.before[i].item(),
                after=None if result.after is None else result.after[i].item(),
            )
            for i, key in enumerate(result.keys)
        ]
        table.sort(key=lambda row: -(row.after if row.after is not None else row.before))
        sharpening = self.config.ensemble.sharpen if result.after is not None else None
        point = EnsemblePoint(
            round=self.round,
            position=position,
            drafted=drafted,
            chosen=_key_text(chosen),
            changed=ids != [own],
            method=self.config.ensemble.method,
            sharpening=sharpening,
            table=table,
        )
        return result, ids, point

    def _drafter_spelling(self, result: EnsembleResult, logits: torch.Tensor, own: int):
        """The best union string the drafter can spell, and its ids for it.

        A vocabulary can spell one string with several ids (Gemma has two "."): the drafter's own
        token, then its best-scored id for the string, win over a fresh encoding.
        """
        lm = self.drafter.lm
        preferred = {lm.key_of(own): own}
        for token_id in torch.topk(logits, self.config.ensemble.top_k).indices.tolist():
            preferred.setdefault(lm.key_of(token_id), token_id)
        for i in torch.argsort(result.final, descending=True).tolist():
            key = result.keys[i]
            if key in preferred:
                return key, [preferred[key]]
            if key == EOS_KEY:
                return key, [min(lm.eos_ids)]
            if isinstance(key, bytes):
                try:
                    return key, lm.vocab.encode_bytes(key)
                except ValueError:
                    continue
            token_id = lm.tokenizer.convert_tokens_to_ids(key)
            if isinstance(token_id, int) and token_id != lm.tokenizer.unk_token_id:
                return key, [token_id]
        raise RuntimeError("no ensemble candidate can be spelled by the drafter")

    def finished_event(self) -> RunFinished:
        self.stats.wall_s = time.perf_counter() - self.started
        self.stats.forward = {p.name: asdict(p.session.stats) for p in self.parts}
        return RunFinished(self.response.text, self.stop_reason, self.stats.to_dict())

    def done(self) -> bool:
        if self.stop.is_set():
            self.stop_reason = "stopped"
            return True
        return self.stop_reason == "eos" or self.remaining() <= 0

    # ---------------------------------------------------------------- strategies
    def run(self) -> Iterator[Event]:
        self.started = time.perf_counter()
        yield self.started_event()
        step = {"single": self._single_round, "per-token": self._per_token_step, "safe": self._safe_round}[self.config.strategy]
        while not self.done():
            self.round += 1
            self.stats.rounds += 1
            yield from step()
        yield self.finished_event()

    def _single_round(self) -> Iterator[Event]:
        ids, _, probs = self.draft(min(self.config.lookahead, self.remaining()))
        if not ids:
            return
        yield self.draft_event(ids, probs, _text_and_index(self.response.extended(ids))[1])
        self.stats.accepted_drafts += len(ids)
        yield self.commit([([i], {"decision": "accepted"}) for i in ids])
        self.drafter.forget_before(len(self.response.ids))

    def _per_token_step(self) -> Iterator[Event]:
        boundary = len(self.response.raw)
        tokenizations = self._verifier_tokenizations(self.response.raw)
        with self.stats.timed("verify"):
            views = [ModelView(self.drafter.lm, self.drafter.logits(self.response.ids, [len(self.response.ids)])[0])]
            for v, tok in zip(self.verifiers, tokenizations):
                views.append(ModelView(v.lm, v.logits(tok.ids, [len(tok.ids)])[0]))
                v.forget_before(len(tok.ids))
        own = int(torch.argmax(views[0].logits))
        _, ids, point = self.ensemble_at(len(self.response.ids), views, own, None)
        yield point
        event = self.commit([(ids, {"decision": "ensembled", "sharpened": point.sharpening is not None})])
        # Damage marker: was the end of the text we ensembled at a real boundary for each other model?
        flagged = zip(self.verifiers, self._verifier_tokenizations(self.response.raw))
        event.tokens[0].oov_like_for = [v.name for v, tok in flagged if boundary not in tok.boundaries]
        self.drafter.forget_before(len(self.response.ids))
        yield event

    def _verifier_tokenizations(self, raw: bytes) -> list[Tokenization]:
        """Each verifier's canonical tokenization of `raw` (a character still being spelled at its end is
        held back); the last one is kept, so per-token's damage check also serves its next step."""
        raw = _complete(raw)
        if self._tokenized is None or self._tokenized[0] != raw:
            with self.stats.timed("retokenize"):
                self._tokenized = (raw, [tokenize(v.lm.vocab, raw) for v in self.verifiers])
        return self._tokenized[1]

    def _safe_round(self) -> Iterator[Event]:
        ids, logits, probs = self.draft(min(self._lookahead, self.remaining()))
        if not ids:
            return
        spans = self.drafter.lm.vocab.spans(ids, len(self.response.raw))
        raw = self.response.extended(ids)
        _, index = _text_and_index(raw)
        tokenizations = self._verifier_tokenizations(raw)
        yield self.draft_event(ids, probs, index)
        eos = self.drafter.lm.eos_ids
        # Verifier token index at the boundary before each drafted token (None: not a boundary there).
        at = [[_own_index(tok, s, ids[j] in eos) for tok in tokenizations] for j, (s, _) in enumerate(spans)]
        candidates = {j for j in range(len(ids)) if all(i is not None for i in at[j])}
        with self.stats.timed("verify"):
            verifier_logits = []
            for k, (v, tok) in enumerate(zip(self.verifiers, tokenizations)):
                starts = [at[j][k] for j in sorted(candidates)]
                verifier_logits.append(dict(zip(starts, v.logits(tok.ids, starts))) if starts else {})
                if starts:
                    v.forget_before(min(starts))

        pieces: list[tuple[list[int], dict]] = []
        for j, token_id in enumerate(ids):
            s, e = spans[j]
            drafted = _key_text(self.drafter.lm.key_of(token_id))
            views = [ModelView(self.drafter.lm, logits[j])]
            checks = []
            for k, (v, tok) in enumerate(zip(self.verifiers, tokenizations)):
                i = at[j][k]
                if i is None:
                    checks.append(VerifierView(v.name, oov_like=True))
                    continue
                row = verifier_logits[k][i]
                views.append(ModelView(v.lm, row))
                checks.append(_verifier_check(v, row, tok, i))
            probe = dict(round=self.round, position=len(self.response.ids) + j, token=drafted,
                         start=index.char_of_byte(s), end=index.char_of_byte(e), verifiers=checks)
            if j not in candidates:
                blocked = [c.model for c in checks if c.oov_like]
                for name in blocked:
                    self.stats.oov_skips[name] += 1
                yield PositionVerified(**probe, mean_p=None, decision="skipped-oov", reason="boundary missing for " + ", ".join(blocked))
                pieces.append(([token_id], {"decision": "skipped-oov", "oov_like_for": blocked}))
                continue
            p_draft = probs[j][token_id].item()
            mean_p = (p_draft + sum(c.p for c in checks)) / (1 + len(checks))
            reason = "unanimity" if all(c.agrees for c in checks) else "mean>0.5" if mean_p > 0.5 else None
            if reason:
                self.stats.consensus_skips["unanimity" if reason == "unanimity" else "mean"] += 1
                yield PositionVerified(**probe, mean_p=mean_p, decision="skipped-consensus", reason=reason)
                pieces.append(([token_id], {"decision": "skipped-consensus", "reason": reason}))
                continue
            yield PositionVerified(**probe, mean_p=mean_p, decision="ensembled", reason="no consensus")
            result, chosen_ids, point = self.ensemble_at(len(self.response.ids) + j, views, token_id, drafted)
            yield point
            info = {"decision": "ensembled", "sharpened": result.after is not None}
            if point.changed:
                pieces.append((chosen_ids, {**info, "drafted": drafted}))
                break
            pieces.append(([token_id], info))
            if self.config.safe_mode == "exact":
                break
        self.stats.accepted_drafts += sum(1 for chosen, info in pieces if "drafted" not in info)
        if self.config.adaptive_lookahead:
            self._adapt_lookahead(replaced="drafted" in pieces[-1][1], committed=len(pieces))
        yield self.commit(pieces)
        self.drafter.forget_before(len(self.response.ids))

    def _adapt_lookahead(self, replaced: bool, committed: int) -> None:
        """Draft about as far as the last replacement came (a replaced token drops the rest of the draft),
        growing back by one token a round while drafts survive; between 2 and the configured lookahead."""
        grown = committed + 1 if replaced else self._lookahead + 1
        self._lookahead = max(2, min(self.config.lookahead, grown))


def _own_index(tok: Tokenization, offset: int, drafted_eos: bool) -> int | None:
    """The verifier token that starts at byte `offset`; at the end of the text, only for a drafted EOS."""
    if offset == tok.length:
        return len(tok.ids) if drafted_eos else None
    return None if drafted_eos else tok.token_starting_at(offset)


def _verifier_check(v: Participant, row: torch.Tensor, tok: Tokenization, i: int) -> VerifierView:
    probs = torch.softmax(row.float(), dim=-1)
    argmax = int(torch.argmax(probs))
    if i == len(tok.ids):  # the drafter ended the response: the verifier's own token is its EOS
        eos = [t for t in v.lm.eos_ids if t < len(probs)]
        return VerifierView(v.name, False, "<eos>", sum(probs[t].item() for t in eos), _key_text(v.lm.key_of(argmax)), argmax in v.lm.eos_ids)
    own = tok.ids[i]
    return VerifierView(v.name, False, _key_text(v.lm.key_of(own)), probs[own].item(), _key_text(v.lm.key_of(argmax)), argmax == own)


def _unique_names(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


def decode(models: Sequence[LoadedModel], prompt: str, config: DecodeConfig = DecodeConfig(), stop: threading.Event | None = None) -> Iterator[Event]:
    """Run one strategy; yields events as they happen. Raises SafeEngineError subclasses on bad input."""
    return Decoder(models, prompt, config, stop).run()

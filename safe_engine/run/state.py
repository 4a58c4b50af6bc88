"""One decoding run's state (`Run`) and the steps every strategy is written in.

The models take roles (the drafter first, then the verifiers, each with its weight), the drafter's
response grows by commits, and `Run` offers `draft`, `view` (a model's next-token logits for the
ensemble), `ensemble_at` (the ensemble and the drafter's spelling of its choice) and `commit` (forcing,
stop sequences, counting, the event). The strategies live in `safe.py`, `per_token.py` and `decoding.py`;
stop sequences, what-if forcing, the speller and the damage measures are parts of their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from ..contract.config import TOP_K_SHOWN, DecodeConfig
from ..contract.errors import ConfigError
from ..contract.events import (
    Candidate,
    CommittedToken,
    DamageMeasured,
    DraftToken,
    EnsemblePoint,
    RunFinished,
    RunStarted,
    TextCommitted,
    TokensDrafted,
    UnionRow,
)
from ..contract.reasons import Decision, StopReason
from ..decisions.ensemble import Key, ModelView, ensemble
from ..decisions.sampling import Sampler, fresh_seed
from ..decisions.spelling import choose
from ..models.loading import LoadedModel
from ..tokenization.alignment import CharIndex, Tokenization, complete_utf8_prefix, display_piece, tokenize
from .damage import DamageMeter
from .forcing import Forcing
from .participant import Participant, unique_names
from .piece import Piece
from .stats import RunStats
from .stop_sequences import StopSequences


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
        return text_and_index(self.raw)[0]

    def take_delta(self) -> str:
        text = self.text
        delta, self._announced = text[self._announced :], len(text)
        return delta


@dataclass
class Draft:
    """Tokens the drafter drew, each with its (temperature-scaled) logits, their softmax, and the
    probability the token was drawn with (its nucleus probability when sampling)."""

    ids: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)
    drawn_p: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


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


def complete(raw: bytes) -> bytes:
    """`raw` without a character still being spelled at its end."""
    return raw[: complete_utf8_prefix(raw)]


def text_and_index(raw: bytes) -> tuple[str, CharIndex]:
    """Display text (a character still being spelled at the end is held back) and its offset index."""
    index = CharIndex.of_bytes(complete(raw))
    return index.text, index


def top_candidates(probs: torch.Tensor, lm: LoadedModel, k: int = TOP_K_SHOWN) -> list[Candidate]:
    """A distribution's k most likely tokens, as the events show them."""
    top = torch.topk(probs, k)
    keys = [lm.key_of(i) for i in top.indices.tolist()]
    return [Candidate(key_text(key), p, raw_hex(key)) for key, p in zip(keys, top.values.tolist())]


def draft_after(
    drafter: Participant, base: Sequence[int], count: int, gate: float, sampler: Sampler, stop: threading.Event
) -> Draft:
    """`Run.draft` from response ids `base`; `stop` ends it before the next token. SAFE's overlap drafts the
    next round through it too (`overlap.py`)."""
    draft = Draft()
    eos = drafter.lm.eos_ids
    for _ in range(count):
        if stop.is_set():
            break
        position = len(base) + len(draft)
        row = sampler.scaled(drafter.logits(list(base) + draft.ids, [position])[0])
        probs = torch.softmax(row.float(), dim=-1)
        token, drawn_p = sampler.pick(probs)
        draft.ids.append(token)
        draft.logits.append(row)
        draft.probs.append(probs)
        draft.drawn_p.append(drawn_p)
        if token in eos:
            break
        if probs[token].item() < gate:
            break
    return draft


class Run:
    """State shared by the strategies for one run. `cancel` ends it at the next check (the UI's Stop)."""

    def __init__(
        self, models: Sequence[LoadedModel], prompt: str, config: DecodeConfig, cancel: threading.Event | None
    ):
        config.validate(len(models))
        if not prompt or not prompt.strip():
            raise ConfigError("the prompt is empty")
        self.config = config
        self.cancel = cancel or threading.Event()
        names = unique_names([m.name for m in models])
        weights = config.ensemble.weights or (1.0,) * len(models)  # weights belong to models, not to roles
        order = [config.drafter] + [i for i in range(len(models)) if i != config.drafter]
        if config.strategy == "single":
            order = order[:1]
        self.parts = [
            Participant(
                names[i],
                models[i],
                models[i].open_session(),
                models[i].encode_prompt(prompt),
                weights[i] / sum(weights),
            )
            for i in order
        ]
        for part in self.parts:
            limit = part.lm.context_length
            if limit and len(part.prompt_ids) + config.max_new_tokens + config.lookahead > limit:
                raise ConfigError(
                    f"the prompt is {len(part.prompt_ids)} tokens for {part.name}; with {config.max_new_tokens} new "
                    f"tokens it exceeds the model's context of {limit}"
                )
        self.prompt = prompt
        self.drafter = self.parts[0]
        self.verifiers = self.parts[1:]
        self.seed = fresh_seed() if config.seed is None else config.seed
        self.sampler = Sampler(config.temperature, config.top_p, self.seed)
        self.forcing = Forcing(config.force, self.drafter.lm.vocab, self.drafter.name)
        self.stops = StopSequences(config.stop)
        self.response = Response(self.drafter.lm)
        self.stats = RunStats(config.strategy)
        self.stats.oov_skips = {v.name: 0 for v in self.verifiers}
        self.damage = DamageMeter(
            self.drafter.name, [v.name for v in self.verifiers], config.damage_kl_steps, self.stats
        )
        self.committed_texts: list[str] = []  # every committed token's text (degeneration measures)
        self._last_commit: TextCommitted | None = None
        self._measured = 0  # committed tokens when damage was last measured
        self._tokenized: tuple[bytes, list[Tokenization]] | None = None
        self.started = time.perf_counter()
        self.stop_reason = StopReason.MAX_NEW_TOKENS

    # ---------------------------------------------------------------- the run's frame
    @property
    def round(self) -> int:
        """The round being decoded (1-based), as counted in `stats.rounds`."""
        return self.stats.rounds

    def started_event(self) -> RunStarted:
        self.started = time.perf_counter()
        config = asdict(self.config) | {"drafter": self.drafter.name, "seed": self.seed}
        return RunStarted(
            strategy=self.config.strategy,
            drafter=self.drafter.name,
            models=[
                {
                    **p.lm.describe(),
                    "name": p.name,
                    "role": "drafter" if p is self.drafter else "verifier",
                    "weight": p.weight,
                }
                for p in self.parts
            ],
            prompts={p.name: p.lm.format_prompt(self.prompt) for p in self.parts},
            config=config,
        )

    def remaining(self) -> int:
        return self.config.max_new_tokens - self.stats.tokens

    @property
    def ended(self) -> bool:
        """The response is over: an end token, a stop sequence or the token limit."""
        return self.stop_reason in (StopReason.EOS, StopReason.STOP_SEQUENCE) or self.remaining() <= 0

    def done(self) -> bool:
        if self.cancel.is_set():
            self.stop_reason = StopReason.CANCELLED
            return True
        return self.ended

    def finished_event(self) -> RunFinished:
        self.stats.wall_s = time.perf_counter() - self.started - self.stats.time_split["damage"]  # decoding only
        self.stats.forward = {p.name: asdict(p.session.stats) for p in self.parts}
        end = self.stops.end
        text = self.response.text if end is None else text_and_index(self.response.raw[:end])[0]
        self.stats.damage = self.damage.summary(text, self.committed_texts)
        return RunFinished(text, self.stop_reason, self.stats.to_dict())

    def damage_event(self) -> DamageMeasured | None:
        """The damage measures after the latest commit (None when nothing was committed since the last)."""
        if self._last_commit is None or self.stats.tokens == self._measured:
            return None
        self._measured = self.stats.tokens
        oov_like = {
            name for t in self._last_commit.tokens if t.decision != Decision.SKIPPED_OOV for name in t.oov_like_for
        }
        self.damage.count_oov_like(oov_like)
        models = self.damage.measure(self.drafter, self.response.ids, self.response.raw, predicts_next=not self.ended)
        return DamageMeasured(
            self.round, self.stats.tokens, {name: m | {"oov_like": name in oov_like} for name, m in models.items()}
        )

    # ---------------------------------------------------------------- drafting
    def draft(self, count: int, gate: float = 0.0) -> Draft:
        """Up to `count` tokens from the drafter (greedy or sampled), ending early at its EOS, or right
        after a token it gave a probability below `gate` (the token most likely to be ensembled away)."""
        with self.stats.timed("draft"):
            draft = draft_after(self.drafter, self.response.ids, count, gate, self.sampler, self.cancel)
        self.stats.drafted += len(draft)
        return draft

    def draft_event(self, draft: Draft, index: CharIndex | None = None) -> TokensDrafted:
        """`index`: character offsets of the response extended by the draft, if the caller has them."""
        lm = self.drafter.lm
        index = index or text_and_index(self.response.extended(draft.ids))[1]
        spans = lm.vocab.spans(draft.ids, len(self.response.raw))
        tokens = [
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
        return TokensDrafted(self.round, self.drafter.name, tokens)

    # ---------------------------------------------------------------- what each model predicts
    def view(self, part: Participant, logits: torch.Tensor) -> ModelView:
        """A model's next-token logits as the ensemble reads them (temperature-scaled), with its weight."""
        return ModelView(part.lm, self.sampler.scaled(logits), part.weight)

    def verifier_tokenizations(self, raw: bytes) -> list[Tokenization]:
        """Each verifier's canonical tokenization of `raw` (a character still being spelled at its end is
        held back); the last one is kept, so per-token's damage check also serves its next step."""
        raw = complete(raw)
        if self._tokenized is None or self._tokenized[0] != raw:
            with self.stats.timed("retokenize"):
                self._tokenized = (raw, [tokenize(v.lm.vocab, raw) for v in self.verifiers])
        return self._tokenized[1]

    # ---------------------------------------------------------------- ensembling
    def ensemble_at(
        self, position: int, views: list[ModelView], drafter_token: int, drafted: str | None, spelling: str = "full"
    ) -> tuple[list[int], EnsemblePoint]:
        """Ensemble where the drafter would emit `drafter_token`; the drafter's ids for the choice and the
        event. `spelling`: see `spelling.speller`."""
        with self.stats.timed("ensemble"):
            result = ensemble(views, self.config.ensemble)
            lm, top_k = self.drafter.lm, self.config.ensemble.top_k
            chosen, ids = choose(result, lm, views[0].logits, drafter_token, top_k, spelling, self.sampler)
        changed = ids != [drafter_token]
        self.stats.ensembled += 1
        self.stats.replaced += changed
        self.stats.sharpened += result.after is not None
        table = [
            UnionRow(
                text=key_text(key),
                per_model={p.name: result.per_model[m, i].item() for m, p in enumerate(self.parts)},
                before=result.before[i].item(),
                after=None if result.after is None else result.after[i].item(),
                raw_hex=raw_hex(key),
            )
            for i, key in enumerate(result.keys)
        ]
        table.sort(key=lambda row: -(row.after if row.after is not None else row.before))
        point = EnsemblePoint(
            round=self.round,
            position=position,
            drafted=drafted,
            chosen=key_text(chosen),
            changed=changed,
            method=self.config.ensemble.method,
            sharpening=self.config.ensemble.sharpen if result.after is not None else None,
            table=table,
            sampled=not self.sampler.greedy,
        )
        return ids, point

    # ---------------------------------------------------------------- committing
    def diverted(self, pieces: Sequence[Piece]) -> bool:
        """A forced text replaces the last of this commit's pieces so far: the rest of its draft is stale,
        so the strategy hands over what it has."""
        return self.forcing.diverts(self.stats.tokens + len(pieces) - 1, pieces[-1])

    def commit(self, pieces: Sequence[Piece]) -> TextCommitted:
        """Append the pieces to the response, forced texts in place of the strategy's (`DecodeConfig.force`);
        count them and announce them. A piece a forced text replaced, or one that completes a stop sequence,
        is the last one committed."""
        committed: list[tuple[Piece, tuple[int, int]]] = []
        for piece in pieces:
            index = self.stats.tokens + len(committed)
            diverted = self.forcing.diverts(index, piece)
            piece = self.forcing.apply(index, piece)
            committed.append((piece, self.response.commit(piece.ids)))
            if self.stops.found(self.response.raw, committed[-1][1][0]):
                self.stop_reason = StopReason.STOP_SEQUENCE
                break
            if diverted:
                break
        _, index = text_and_index(self.response.raw)
        tokens = [self._token(piece, index.char_of_byte(s), index.char_of_byte(e)) for piece, (s, e) in committed]
        self.stats.count([piece for piece, _ in committed])
        self.drafter.forget_before(len(self.response.ids))
        self._last_commit = TextCommitted(
            self.round, self.response.take_delta(), tokens, time.perf_counter() - self.started
        )
        return self._last_commit

    def _token(self, piece: Piece, start: int, end: int) -> CommittedToken:
        """The committed piece as the event shows it; its text joins the degeneration measures, and an end
        token among its ids ends the run."""
        lm = self.drafter.lm
        key = lm.key_of(piece.ids[0]) if len(piece.ids) == 1 else lm.vocab.join(piece.ids)
        text = key_text(key)
        self.committed_texts.append(text)
        if any(i in lm.eos_ids for i in piece.ids):
            self.stop_reason = StopReason.EOS
        reason = piece.reason
        return CommittedToken(
            text=text,
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

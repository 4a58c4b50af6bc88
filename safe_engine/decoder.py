"""One decoding run's state and the steps every strategy shares.

The models take roles (the drafter first, then the verifiers, each with its weight), the drafter's
response grows by commits, and `Decoder` offers what the strategies are written in: `draft`, `view` (a
model's next-token logits for the ensemble), `ensemble_at` (the ensemble and the drafter's spelling of
its choice) and `commit`. The strategies live in `safe.py`, `per_token.py` and `decoding.py`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from .alignment import EOS_KEY, CharIndex, Tokenization, complete_utf8_prefix, display_piece, tokenize
from .config import TOP_K_SHOWN, DecodeConfig
from .damage import DamageMeter
from .ensemble import EnsembleResult, Key, ModelView, ensemble, first_subtoken
from .errors import ConfigError
from .events import (
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
from .models import LoadedModel
from .runtime import ModelSession
from .sampling import Sampler, fresh_seed
from .stats import RunStats


@dataclass
class Participant:
    """A model taking part in one run, under a name unique within the run, with its ensemble weight."""

    name: str
    lm: LoadedModel
    session: ModelSession
    prompt_ids: list[int]
    weight: float = 1.0

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
        return text_and_index(self.raw)[0]

    @property
    def complete_length(self) -> int:
        """Bytes of the response without a character still being spelled at its end."""
        return complete_utf8_prefix(self.raw)

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


def complete(raw: bytes) -> bytes:
    """`raw` without a character still being spelled at its end."""
    return raw[: complete_utf8_prefix(raw)]


def text_and_index(raw: bytes) -> tuple[str, CharIndex]:
    """Display text (a character still being spelled at the end is held back) and its offset index."""
    index = CharIndex.of_bytes(complete(raw))
    return index.text, index


def _top(probs: torch.Tensor, lm: LoadedModel, k: int = TOP_K_SHOWN) -> list[Candidate]:
    top = torch.topk(probs, k)
    return [Candidate(key_text(lm.key_of(i)), p) for p, i in zip(top.values.tolist(), top.indices.tolist())]


def _unique_names(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


class Decoder:
    """State shared by the strategies for one run."""

    def __init__(self, models: Sequence[LoadedModel], prompt: str, config: DecodeConfig, stop: threading.Event | None):
        config.validate(len(models))
        if not prompt or not prompt.strip():
            raise ConfigError("the prompt is empty")
        self.config = config
        self.stop = stop or threading.Event()
        names = _unique_names([m.name for m in models])
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
            limit = getattr(part.lm.model.config, "max_position_embeddings", None)
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
        self.forced = {index: (text, self._spell_forced(text)) for index, text in config.force}
        self.response = Response(self.drafter.lm)
        self.damage = DamageMeter([p.name for p in self.parts], config.damage_kl_steps)
        self.committed_texts: list[str] = []  # every committed token's text (degeneration measures)
        self._last_commit: TextCommitted | None = None
        self._measured = 0  # committed tokens when damage was last measured
        self._stops = [text.encode("utf-8") for text in config.stop]
        self.stop_end: int | None = None  # where the first stop sequence ends in the response (bytes)
        self.stats = RunStats(config.strategy)
        self.stats.oov_skips = {v.name: 0 for v in self.verifiers}
        self.round = 0
        self._tokenized: tuple[bytes, list[Tokenization]] | None = None
        self.started = time.perf_counter()
        self.stop_reason = "max_new_tokens"

    # ---------------------------------------------------------------- the run's frame
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
        return self.stop_reason in ("eos", "stop") or self.remaining() <= 0

    def done(self) -> bool:
        if self.stop.is_set():
            self.stop_reason = "stopped"
            return True
        return self.ended

    def finished_event(self) -> RunFinished:
        self.stats.wall_s = (
            time.perf_counter() - self.started - self.stats.time_split["damage"]
        )  # decoding, not measuring
        self.stats.forward = {p.name: asdict(p.session.stats) for p in self.parts}
        text = self.response.text if self.stop_end is None else text_and_index(self.response.raw[: self.stop_end])[0]
        self.stats.damage = self.damage.summary(text, self.committed_texts)
        return RunFinished(text, self.stop_reason, self.stats.to_dict())

    def damage_event(self) -> DamageMeasured | None:
        """The damage measures after the latest commit (None when nothing was committed since the last)."""
        if self._last_commit is None or self.stats.tokens == self._measured:
            return None
        self._measured = self.stats.tokens
        oov_like = {name for t in self._last_commit.tokens if t.decision != "skipped-oov" for name in t.oov_like_for}
        self.damage.count_oov_like(oov_like)
        models = self.damage.measure(self)
        return DamageMeasured(
            self.round, self.stats.tokens, {name: m | {"oov_like": name in oov_like} for name, m in models.items()}
        )

    # ---------------------------------------------------------------- what-if: forced commits
    def _spell_forced(self, text: str) -> list[int]:
        try:
            return self.drafter.lm.vocab.encode_bytes(text.encode("utf-8"))
        except ValueError:
            raise ConfigError(f"the drafter {self.drafter.name} cannot spell the forced text {text!r}") from None

    def override(self, index: int, piece: tuple[list[int], dict]) -> tuple[tuple[list[int], dict], bool]:
        """The piece committed at committed-token `index`: a forced text replaces the strategy's pick.

        Returns the piece and whether it differs from the strategy's (then the rest of a draft is stale).
        """
        if index not in self.forced:
            return piece, False
        _, ids = self.forced[index]
        picked = self.drafter.lm.vocab.join(piece[0])
        if picked == self.drafter.lm.vocab.join(ids):  # the strategy's own text: keep its ids, change nothing
            return (piece[0], {"decision": "forced", "drafted": None}), False
        return (ids, {"decision": "forced", "drafted": display_piece(picked)}), True

    # ---------------------------------------------------------------- drafting
    def draft(self, count: int, gate: float = 0.0) -> Draft:
        """Up to `count` tokens from the drafter (greedy or sampled), ending early at its EOS, or right
        after a token it gave a probability below `gate` (the token most likely to be ensembled away)."""
        draft = Draft()
        eos = self.drafter.lm.eos_ids
        with self.stats.timed("draft"):
            for _ in range(count):
                if self.stop.is_set():
                    break
                position = len(self.response.ids) + len(draft)
                row = self.sampler.scaled(self.drafter.logits(self.response.ids + draft.ids, [position])[0])
                probs = torch.softmax(row.float(), dim=-1)
                token, drawn_p = self.sampler.pick(probs)
                draft.ids.append(token)
                draft.logits.append(row)
                draft.probs.append(probs)
                draft.drawn_p.append(drawn_p)
                if token in eos:
                    break
                if probs[token].item() < gate:
                    break
        self.stats.drafted += len(draft)
        return draft

    def draft_event(self, draft: Draft, index: CharIndex | None = None) -> TokensDrafted:
        """`index`: character offsets of the response extended by the draft, if the caller has them."""
        lm = self.drafter.lm
        index = index or text_and_index(self.response.extended(draft.ids))[1]
        tokens = [
            DraftToken(
                token_id,
                key_text(lm.key_of(token_id)),
                index.char_of_byte(s),
                index.char_of_byte(e),
                row[token_id].item(),
                _top(row, lm),
            )
            for token_id, row, (s, e) in zip(draft.ids, draft.probs, lm.vocab.spans(draft.ids, len(self.response.raw)))
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
        self, position: int, views: list[ModelView], own: int, drafted: str | None, spelling: str = "full"
    ) -> tuple[list[int], EnsemblePoint]:
        """Ensemble where the drafter would emit `own`; the drafter's ids for the choice and the event.

        `spelling`: "full" appends the drafter's whole spelling of the chosen string; "first-subtoken"
        only its first sub-token when the string is not one drafter token (UniTE's per-token commit).
        """
        with self.stats.timed("ensemble"):
            result = ensemble(views, self.config.ensemble)
            chosen, ids = self._choose(result, views[0].logits, own, spelling)
        self.stats.ensembled += 1
        self.stats.replaced += ids != [own]
        self.stats.sharpened += result.after is not None
        table = [
            UnionRow(
                text=key_text(key),
                per_model={p.name: result.per_model[m, i].item() for m, p in enumerate(self.parts)},
                before=result.before[i].item(),
                after=None if result.after is None else result.after[i].item(),
            )
            for i, key in enumerate(result.keys)
        ]
        table.sort(key=lambda row: -(row.after if row.after is not None else row.before))
        point = EnsemblePoint(
            round=self.round,
            position=position,
            drafted=drafted,
            chosen=key_text(chosen),
            changed=ids != [own],
            method=self.config.ensemble.method,
            sharpening=self.config.ensemble.sharpen if result.after is not None else None,
            table=table,
            sampled=not self.sampler.greedy,
        )
        return ids, point

    def _choose(self, result: EnsembleResult, logits: torch.Tensor, own: int, spelling: str) -> tuple[Key, list[int]]:
        """The ensemble's pick (argmax, or a draw when sampling) among the strings the drafter can spell."""
        spell = self._speller(logits, own, spelling)
        weights = result.final.clone()
        while weights.sum() > 0:
            i, _ = self.sampler.pick(weights)
            ids = spell(result.keys[i])
            if ids:
                return result.keys[i], ids
            weights[i] = 0
        raise RuntimeError("no ensemble candidate can be spelled by the drafter")

    def _speller(self, logits: torch.Tensor, own: int, spelling: str):
        """Maps a union string to the drafter's ids for it, or None.

        A vocabulary can spell one string with several ids (Gemma has two "."): the drafter's own token,
        then its best-scored id for the string, win over a fresh encoding.
        """
        lm = self.drafter.lm
        preferred = {lm.key_of(own): own}
        for token_id in torch.topk(logits, self.config.ensemble.top_k).indices.tolist():
            preferred.setdefault(lm.key_of(token_id), token_id)

        def spell(key: Key) -> list[int] | None:
            if key in preferred:
                return [preferred[key]]
            if key == EOS_KEY:
                return [min(lm.eos_ids)] if lm.eos_ids else None
            if not isinstance(key, bytes):  # another model's special token: only a special token of ours matches
                token_id = lm.tokenizer.convert_tokens_to_ids(key)
                return [token_id] if isinstance(token_id, int) and token_id != lm.tokenizer.unk_token_id else None
            if spelling == "first-subtoken":
                token_id = first_subtoken(lm.vocab, key)
                return None if token_id is None else [token_id]
            try:
                return lm.vocab.encode_bytes(key)
            except ValueError:
                return None

        return spell

    # ---------------------------------------------------------------- committing
    def commit(self, pieces: list[tuple[list[int], dict]]) -> TextCommitted:
        """Append (ids, CommittedToken fields) pieces to the response; count them and announce them.

        A piece that completes a stop sequence is the last one committed."""
        spans = []
        for ids, _ in pieces:
            spans.append(self.response.commit(ids))
            if self._stopped_at(spans[-1][0]):
                pieces = pieces[: len(spans)]
                break
        _, index = text_and_index(self.response.raw)
        tokens = []
        for (ids, info), (s, e) in zip(pieces, spans):
            text = (
                key_text(self.drafter.lm.key_of(ids[0]))
                if len(ids) == 1
                else display_piece(self.drafter.lm.vocab.join(ids))
            )
            tokens.append(
                CommittedToken(text=text, start=index.char_of_byte(s), end=index.char_of_byte(e), ids=list(ids), **info)
            )
            self.committed_texts.append(text)
            if any(i in self.drafter.lm.eos_ids for i in ids):
                self.stop_reason = "eos"
        self.stats.tokens += len(pieces)
        self.drafter.forget_before(len(self.response.ids))
        self._last_commit = TextCommitted(
            self.round, self.response.take_delta(), tokens, time.perf_counter() - self.started
        )
        return self._last_commit

    def _stopped_at(self, piece_start: int) -> bool:
        """Whether a stop sequence now ends in the response (searched from where it could newly end)."""
        raw = self.response.raw
        lead = len(raw) - len(raw.lstrip())  # a stop sequence in the leading whitespace does not count
        for stop in self._stops:
            found = raw.find(stop, max(lead, piece_start - len(stop) + 1))
            if found >= 0:
                end = found + len(stop)
                self.stop_end = end if self.stop_end is None else min(self.stop_end, end)
        if self.stop_end is not None:
            self.stop_reason = "stop"
        return self.stop_end is not None

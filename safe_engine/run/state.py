"""One decoding run (`Run`): the parts a run is made of, and the steps every strategy is written in.

`Run` coordinates; each part does one job: the request's checks (`checks.py`), the models' roles
(`roles.py`), the response (`response.py`), drafting (`drafting.py`), the verifiers' tokenizations
(`tokenizations.py`), appending commits (`committing.py`: forcing, stop sequences, where the response
ends), the event values (`event_values.py`), counters (`stats.py`) and the damage measures (`damage.py`).
A strategy (`safe.py`, `per_token.py`, `decoding.py`) is written in `draft`, `view` (a model's next-token
logits for the ensemble), `ensemble_at` (the ensemble and the drafter's spelling of its choice) and `commit`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict

import torch

from ..contract.config import DecodeConfig
from ..contract.events import DamageMeasured, EnsemblePoint, RunFinished, RunStarted, TextCommitted, TokensDrafted
from ..contract.reasons import StopReason
from ..decisions.ensemble import ModelView, ensemble
from ..decisions.sampling import Sampler, fresh_seed
from ..decisions.spelling import choose
from ..models.loading import LoadedModel
from ..tokenization.alignment import CharIndex
from .checks import check_context, check_request
from .committing import Committer
from .damage import DamageMeter
from .drafting import Draft, draft_after
from .event_values import committed_token, drafted_tokens, key_text, method_values, union_table
from .forcing import Forcing
from .participant import Participant
from .piece import Piece
from .response import Response, text_and_index
from .roles import cast
from .stats import RunStats
from .stop_sequences import StopSequences
from .tokenizations import VerifierTokenizations


class Run:
    """State shared by the strategies for one run. `cancel` ends it at the next check (the UI's Stop)."""

    def __init__(
        self, models: Sequence[LoadedModel], prompt: str, config: DecodeConfig, cancel: threading.Event | None
    ):
        check_request(len(models), prompt, config)
        self.config = config
        self.cancel = cancel or threading.Event()
        self.parts = cast(models, prompt, config)
        check_context(self.parts, config)
        self.prompt = prompt
        self.drafter = self.parts[0]
        self.verifiers = self.parts[1:]
        self.seed = fresh_seed() if config.seed is None else config.seed
        self.sampler = Sampler(config.temperature, config.top_p, self.seed)
        forcing = Forcing(config.force, self.drafter.lm.vocab, self.drafter.name)
        self.response = Response(self.drafter.lm)
        self.committer = Committer(self.response, forcing, StopSequences(config.stop), self.drafter.lm.eos_ids)
        self.stats = RunStats(config.strategy)
        self.stats.oov_skips = {v.name: 0 for v in self.verifiers}
        self.tokenizations = VerifierTokenizations(self.verifiers, self.stats)
        self.damage = DamageMeter(
            self.drafter.name, [v.name for v in self.verifiers], config.damage_kl_steps, self.stats
        )
        self.committed_texts: list[str] = []  # every committed token's text (degeneration measures)
        self.strategy_state: object = None  # what a strategy keeps between its rounds (byte-level's trees)
        self._last_commit: TextCommitted | None = None
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
        end = self.committer.stops.end
        text = self.response.text if end is None else text_and_index(self.response.raw[:end])[0]
        self.stats.damage = self.damage.summary(text, self.committed_texts)
        return RunFinished(text, self.stop_reason, self.stats.to_dict())

    def damage_event(self) -> DamageMeasured | None:
        """The damage measures after the latest commit (None when nothing was committed since the last)."""
        return self.damage.event(self._last_commit, self.drafter, self.response, predicts_next=not self.ended)

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
        index = index or text_and_index(self.response.extended(draft.ids))[1]
        tokens = drafted_tokens(self.drafter.lm, draft, len(self.response.raw), index)
        return TokensDrafted(self.round, self.drafter.name, tokens)

    # ---------------------------------------------------------------- ensembling
    def view(self, part: Participant, logits: torch.Tensor) -> ModelView:
        """A model's next-token logits as the ensemble reads them (temperature-scaled), with its weight."""
        return ModelView(part.lm, self.sampler.scaled(logits), part.weight)

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
        names = [p.name for p in self.parts]
        point = EnsemblePoint(
            round=self.round,
            position=position,
            drafted=drafted,
            chosen=key_text(chosen),
            changed=changed,
            method=self.config.ensemble.method,
            sharpening=self.config.ensemble.sharpen if result.after is not None else None,
            table=union_table(result, names),
            sampled=not self.sampler.greedy,
            **method_values(result, [view.lm for view in views], names),
        )
        return ids, point

    # ---------------------------------------------------------------- committing
    def diverted(self, pieces: Sequence[Piece]) -> bool:
        """A forced text replaces the last of this commit's pieces so far: the rest of its draft is stale,
        so the strategy hands over what it has."""
        return self.committer.diverted(self.stats.tokens, pieces)

    def commit(self, pieces: Sequence[Piece]) -> TextCommitted:
        """Append the pieces to the response (`Committer.append`), count them and announce them; an end token
        or a stop sequence among them ends the run."""
        appended = self.committer.append(self.stats.tokens, pieces)
        if appended.end is not None:
            self.stop_reason = appended.end
        _, index = text_and_index(self.response.raw)
        lm = self.drafter.lm
        tokens = [
            committed_token(lm, piece, index.char_of_byte(s), index.char_of_byte(e))
            for piece, (s, e) in zip(appended.pieces, appended.spans)
        ]
        self.committed_texts += [token.text for token in tokens]
        self.stats.count(appended.pieces)
        self.drafter.forget_before(len(self.response.ids))
        self._last_commit = TextCommitted(
            self.round, self.response.take_delta(), tokens, time.perf_counter() - self.started
        )
        return self._last_commit

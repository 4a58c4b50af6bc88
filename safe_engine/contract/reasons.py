"""The stable codes a run's events carry: what was decided at a position, why, and why the run ended.

Consumers (the UI, traces, the CLI's JSON) match these codes, never the sentences. `Reason.text` is the
one place a reason becomes words (the events' `reason` field); `Reason.parse` reads a code or, for traces
recorded before the codes existed, the sentence they carried instead.
"""

from __future__ import annotations

from enum import StrEnum


class Decision(StrEnum):
    """What happened at a committed position (the values are the events' `decision` strings)."""

    ACCEPTED = "accepted"  # committed as drafted; nothing checked it (one model decoding alone)
    SKIPPED_OOV = "skipped-oov"  # ensembling there was unsafe
    SKIPPED_CONSENSUS = "skipped-consensus"  # the draft was kept without an ensemble
    ENSEMBLED = "ensembled"
    FORCED = "forced"  # the user committed this text here (what-if)


class Reason(StrEnum):
    """Why a position was decided the way it was. The values of the four "kept" reasons are the keys of
    `RunStats.consensus_skips`."""

    UNANIMITY = "unanimity"  # kept: every verifier's argmax is its own token there
    MEAN = "mean"  # kept: the weighted mean of the own-token probabilities is above ½
    GATE = "gate"  # kept: GaC's gate, the drafter's top p is at least ½
    ACCEPTED = "accepted"  # kept (sampling): with probability min(1, P_ens / P_draft)
    NO_CONSENSUS = "no_consensus"  # ensembled (greedy)
    RESAMPLED = "resampled"  # ensembled (sampling): the draft was not kept
    INSIDE_CHARACTER = "inside_character"  # unsafe: inside a UTF-8 character
    NO_TEXT = "no_text"  # unsafe: a special token with no text, which no verifier can see
    BOUNDARY_MISSING = "boundary_missing"  # unsafe: some verifier has no token boundary before the token
    BYTE_LEVEL = "byte_level"  # ensembled byte by byte (the byte-level strategy)

    def text(self, models: list[str] | tuple[str, ...] = ()) -> str:
        """The event's `reason` sentence; `models`: the verifiers a missing boundary blocked."""
        return _TEXT[self].format(models=", ".join(models))

    @classmethod
    def parse(cls, value: str | None) -> Reason | None:
        """The reason a code names, or an older trace's sentence; None for none (or one never written)."""
        if value is None:
            return None
        if value in cls._value2member_map_:
            return cls(value)
        if value.startswith(_BOUNDARY_PREFIX):
            return cls.BOUNDARY_MISSING
        return _BY_TEXT.get(value)


# The one table of sentences, as the events' `reason` field has always spelled them.
_TEXT = {
    Reason.UNANIMITY: "unanimity",
    Reason.MEAN: "mean>0.5",
    Reason.GATE: "gate",
    Reason.ACCEPTED: "accepted",
    Reason.NO_CONSENSUS: "no consensus",
    Reason.RESAMPLED: "resampled",
    Reason.INSIDE_CHARACTER: "inside a character",
    Reason.NO_TEXT: "a special token with no text",
    Reason.BOUNDARY_MISSING: "boundary missing for {models}",
    Reason.BYTE_LEVEL: "chosen byte by byte",
}
_BOUNDARY_PREFIX = _TEXT[Reason.BOUNDARY_MISSING].split("{")[0]
_BY_TEXT = {text: reason for reason, text in _TEXT.items() if reason is not Reason.BOUNDARY_MISSING}


class StopReason(StrEnum):
    """Why a run ended (`RunFinished.stop_reason`; the values are those every trace has carried)."""

    EOS = "eos"  # the drafter committed an end token
    STOP_SEQUENCE = "stop"  # a stop sequence (`DecodeConfig.stop`); the text ends right after it
    MAX_NEW_TOKENS = "max_new_tokens"
    CANCELLED = "stopped"  # the caller set the run's cancel flag (the UI's Stop button)

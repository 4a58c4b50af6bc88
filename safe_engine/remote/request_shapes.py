"""How a served model is asked for its rows at positions inside the token sequence (a verifier scoring a draft):
two request shapes, and the choice between them by measured cost.

- `PROMPT_LOGPROBS`: one ``/v1/completions`` request with ``prompt_logprobs``. vLLM reads nothing from its
  prefix cache for such a request, so every round prefills the whole sequence and computes a full-vocabulary
  log-softmax at each of its positions: the cost grows with the context.
- `PER_POSITION`: one generation request per scored position t (the prompt up to t, one token, the top-k
  log-probabilities, and the token at t forced with ``allowed_token_ids`` so that its own log-probability
  comes back: vLLM computes the log-probabilities it returns before it applies that mask), all sent at once.
  The server batches them over the prefix its cache already holds, so a round costs about the same at any
  context length, in more requests.

Both give the same row at every position: the top-k log-probabilities and the token there. Which is cheaper
depends on the server and the context length, so `ShapeCosts` measures it: per context length it keeps each
shape's seconds per call, and a call takes the shape expected to cost less. ``SAFE_OPENAI_VERIFY`` fixes the
shape (``prompt_logprobs`` or ``per_position``) instead, e.g. to measure one against the other.
"""

from __future__ import annotations

import os

from .http_client import RemoteError

PROMPT_LOGPROBS = "prompt_logprobs"
PER_POSITION = "per_position"
SHAPES = (PROMPT_LOGPROBS, PER_POSITION)  # on a tie the first: today's one request
SMOOTHING = 0.3
"""Weight of the newest call in a shape's moving average: a slow call moves it, one call does not decide."""


def fixed_shape() -> str | None:
    """The shape SAFE_OPENAI_VERIFY names, or None to choose by cost (unset or ``auto``)."""
    value = os.environ.get("SAFE_OPENAI_VERIFY", "auto")
    if value == "auto":
        return None
    if value not in SHAPES:
        raise RemoteError(f"SAFE_OPENAI_VERIFY must be auto, {' or '.join(SHAPES)}, not {value!r}")
    return value


class ShapeCosts:
    """Seconds per scoring call of each shape, a moving average per band of context lengths (powers of two).

    `choose` takes the shape with the lower estimate: its average in the band when measured there, else the
    highest average measured in a shorter band (no shape gets cheaper as the context grows, so that is a
    lower bound), else 0, so an untried shape is tried once. A shape that lost in a band is not tried there
    again; as the context grows into the next band it is tried again if its lower bound beats what the other
    shape costs there, which is how the choice moves from one request to many as prefills grow."""

    def __init__(self):
        self._seconds: dict[tuple[str, int], float] = {}

    def choose(self, length: int) -> str:
        return fixed_shape() or min(SHAPES, key=lambda shape: self.estimate(shape, length))

    def estimate(self, shape: str, length: int) -> float:
        band = length.bit_length()
        if (shape, band) in self._seconds:
            return self._seconds[shape, band]
        return max((s for (measured, b), s in self._seconds.items() if measured == shape and b < band), default=0.0)

    def note(self, shape: str, length: int, seconds: float) -> None:
        key = (shape, length.bit_length())
        before = self._seconds.get(key)
        self._seconds[key] = seconds if before is None else (1 - SMOOTHING) * before + SMOOTHING * seconds

"""One model's decoding state in a run: its token ids, its KV cache and the logits it already computed.

`next_token_logits(ids, starts)` is the only way the strategies run a model. It keeps the longest
cached prefix of `ids` (cropping the `DynamicCache` with its public API), feeds only the rest, and
projects the LM head only at the positions asked for. Logits already computed for a cached prefix are
returned from memory, so a drafted token that survives a round is never recomputed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .models import LoadedModel


def crop_cache(cache, keep: int) -> None:
    """Shrink a DynamicCache to its first `keep` positions (transformers 5 only takes a negative count)."""
    drop = cache.get_seq_length() - keep
    if drop > 0:
        cache.crop(-drop)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class ForwardStats:
    passes: int = 0
    positions: int = 0
    seconds: float = 0.0


@dataclass
class ModelSession:
    lm: LoadedModel
    cached_ids: list[int] = field(default_factory=list)
    stats: ForwardStats = field(default_factory=ForwardStats)
    _cache: object = None
    _memo: dict[int, torch.Tensor] = field(default_factory=dict)  # start index -> logits (fp32, CPU)

    def __post_init__(self):
        from transformers import DynamicCache

        # No config: plain full-length layers even for sliding-window models (Gemma 3), so the cache can
        # be cropped anywhere; the model still applies the sliding-window mask itself.
        self._cache = DynamicCache()

    def next_token_logits(self, ids: Sequence[int], starts: Sequence[int]) -> torch.Tensor:
        """Logits of the distribution of ids[t] given ids[:t], for each t in `starts` (1 ≤ t ≤ len(ids))."""
        keep = common_prefix(self.cached_ids, ids)
        if keep < min(len(self.cached_ids), len(ids)):  # diverged (a prefix of the cache needs no crop)
            crop_cache(self._cache, keep)
            del self.cached_ids[keep:]
            self._memo = {t: v for t, v in self._memo.items() if t <= keep}
        missing = [t for t in starts if t not in self._memo]
        if missing:
            # Feed from the first uncached position; remembered logits past it are recomputed with it.
            feed_from = min(len(self.cached_ids), min(missing) - 1)
            self._forward(ids, feed_from, sorted({t for t in starts if t in missing or t > feed_from}))
        return torch.stack([self._memo[t] for t in starts])

    def _forward(self, ids: Sequence[int], feed_from: int, wanted: Sequence[int]) -> None:
        """Feed ids[feed_from:max(wanted)]; the output at position p is the distribution of ids[p + 1]."""
        if feed_from < len(self.cached_ids):
            crop_cache(self._cache, feed_from)
            del self.cached_ids[feed_from:]
            self._memo = {t: v for t, v in self._memo.items() if t <= feed_from}
        chunk = list(ids[feed_from : wanted[-1]])
        keep = torch.tensor([t - 1 - feed_from for t in wanted], device=self.lm.device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.lm.model(
                input_ids=torch.tensor([chunk], device=self.lm.device),
                past_key_values=self._cache,
                use_cache=True,
                logits_to_keep=keep,
            )
        logits = out.logits[0].float().cpu()
        self.stats.seconds += time.perf_counter() - started
        self.stats.passes += 1
        self.stats.positions += len(chunk)
        self.cached_ids.extend(chunk)
        for t, row in zip(wanted, logits):
            self._memo[t] = row

    def forget_before(self, start: int) -> None:
        """Drop remembered logits that no later request can ask for (bounded memory on long runs)."""
        self._memo = {t: v for t, v in self._memo.items() if t >= start}

"""Many prompts decoded on Ray replicas of a model set, each prompt on the next replica that frees up
(for an lm-eval `generate_until`, or any batch of requests); faults are the pool's (`ray_pool`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..contract.config import DecodeConfig
from ..models.cache import load_models
from ..models.loading import LoadOptions
from ..orchestration.comparison import summarize, warm_up
from ..strategies.decoding import decode
from .ray_pool import Replica, ReplicaPool


class DecodeReplica(Replica):
    """One copy of the model set, warm, decoding one prompt at a time."""

    def load(self, specs: Sequence[str], options: LoadOptions) -> None:
        self._models = load_models(specs, options)
        warm_up(self._models)

    def run(self, index: int, prompt: str, config: DecodeConfig) -> dict:
        self.ready()
        return summarize(list(decode(self._models, prompt, config)))


def decode_on_replicas(
    specs: Sequence[str], options: LoadOptions, prompts: Sequence[str], config: DecodeConfig, **pool
) -> list[dict]:
    """`summarize`'s record of each prompt's run, in prompt order; `pool`: ReplicaPool's keywords."""
    results: list[dict | None] = [None] * len(prompts)
    jobs = [(index, prompt, config) for index, prompt in enumerate(prompts)]
    for (index, _, _), summary in ReplicaPool(DecodeReplica, (list(specs), options), **pool).map(jobs):
        results[index] = summary
    return results

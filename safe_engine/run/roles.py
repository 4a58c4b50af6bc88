"""The models' roles in one run: the drafter first, then the verifiers, each under a unique name, with its
weight and a session of its own."""

from __future__ import annotations

from collections.abc import Sequence

from ..contract.config import DecodeConfig
from ..models.loading import LoadedModel
from .participant import Participant


def cast(models: Sequence[LoadedModel], prompt: str, config: DecodeConfig) -> list[Participant]:
    """The run's participants in role order (`single`: the drafter alone), each with the prompt in its own
    tokens and its weight normalised over all the models given."""
    names = unique_names([m.name for m in models])
    weights = config.ensemble.weights or (1.0,) * len(models)  # weights belong to models, not to roles
    order = [config.drafter] + [i for i in range(len(models)) if i != config.drafter]
    if config.strategy == "single":
        order = order[:1]
    return [
        Participant(
            names[i],
            models[i],
            models[i].open_session(),
            models[i].encode_prompt(prompt),
            weights[i] / sum(weights),
        )
        for i in order
    ]


def unique_names(names: Sequence[str]) -> list[str]:
    """Model names made unique within a run ("a", "a#2", …): the same model may take part twice."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out

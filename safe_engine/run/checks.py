"""What a run is asked, checked before its first event: the config, the prompt, and whether the prompt and
the tokens asked for fit each model's context."""

from __future__ import annotations

from collections.abc import Sequence

from ..contract.config import DecodeConfig
from ..contract.errors import ConfigError
from ..tokenization.canonical import refusal
from .participant import Participant


def check_request(models: int, prompt: str, config: DecodeConfig) -> None:
    """The config for this many models, and a prompt with some text."""
    config.validate(models)
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty")


def check_context(parts: Sequence[Participant], config: DecodeConfig) -> None:
    """Each model's prompt, the new tokens and a draft's lookahead fit its context; byte-level decoding can
    turn each model's tokenizer into an exact next-byte model."""
    for part in parts:
        why = refusal(part.lm.vocab) if config.strategy == "byte-level" else None
        if why:
            raise ConfigError(f"{part.name}: {why}")
        limit = part.lm.context_length  # None: the model does not say
        if limit and len(part.prompt_ids) + config.max_new_tokens + config.lookahead > limit:
            raise ConfigError(
                f"the prompt is {len(part.prompt_ids)} tokens for {part.name}; with {config.max_new_tokens} new "
                f"tokens it exceeds the model's context of {limit}"
            )

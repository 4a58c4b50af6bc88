"""The drafter's spelling of the ensemble's choice: a union string becomes drafter ids, or cannot."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..models.loading import LoadedModel
from ..tokenization.alignment import EOS_KEY
from .ensemble import EnsembleResult, Key, first_subtoken
from .sampling import Sampler


def choose(
    result: EnsembleResult,
    drafter: LoadedModel,
    logits: torch.Tensor,
    token: int,
    top_k: int,
    spelling: str,
    sampler: Sampler,
) -> tuple[Key, list[int]]:
    """The ensemble's pick (argmax, or a draw when sampling) among the strings the drafter can spell, and
    its ids. `token`: the drafter's own token here; `logits`: its logits here."""
    spell = speller(drafter, logits, token, top_k, spelling)
    weights = result.final.clone()
    while weights.sum() > 0:
        i, _ = sampler.pick(weights)
        ids = spell(result.keys[i])
        if ids:
            return result.keys[i], ids
        weights[i] = 0
    raise RuntimeError("no ensemble candidate can be spelled by the drafter")


def speller(
    lm: LoadedModel, logits: torch.Tensor, token: int, top_k: int, spelling: str
) -> Callable[[Key], list[int] | None]:
    """Maps a union string to the drafter's ids for it, or None.

    A vocabulary can spell one string with several ids (Gemma has two "."): the drafter's own token,
    then its best-scored id for the string, win over a fresh encoding. `spelling`: "full" spells the whole
    string; "first-subtoken" only its first sub-token when it is not one drafter token (UniTE's commit).
    """
    preferred = {lm.key_of(token): token}
    for token_id in torch.topk(logits, top_k).indices.tolist():
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

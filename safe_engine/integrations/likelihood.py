"""Log-likelihood of a continuation under an ensemble of models with different tokenizers.

Each model scores the continuation under its *own* tokenization of context + continuation (lm-eval's
convention for causal models: trailing spaces of the context move into the continuation, the continuation's
tokens are those of the whole text past the context's tokens). The ensemble's score is the log of the
weighted mean of the models' sequence probabilities,

    log P_ens(c | x) = log Σ_m w_m · P_m(c | x),

which is the probability of the continuation under the mixture "pick model m with probability w_m, let it
write": a normalised distribution over strings, so scores of different choices stay comparable (acc_norm
divides them by length) and a model that is sure of the answer can carry an unsure one, as SAFE's
probability averaging does token by token. The other candidate, the weighted mean of log-probabilities (a
geometric mean), is not normalised and lets one model's near-zero probability veto a choice. Token-level
mixing is not possible here: the models' tokens do not line up, the whole string is the first unit they share.

`is_greedy` holds when every model would have written the continuation greedily: the conservative reading.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..contract.errors import ConfigError
from ..models.loading import LoadedModel


@dataclass(frozen=True)
class Scored:
    logprob: float  # log P_m(continuation | context)
    greedy: bool  # every continuation token is the model's argmax
    tokens: int  # continuation tokens scored


def context_window(lm: LoadedModel) -> int | None:
    return lm.context_length


def prefix_id(lm: LoadedModel) -> int:
    """What an empty context conditions on: BOS where the tokenizer has one, else its end token (lm-eval's rule)."""
    tokenizer = lm.tokenizer
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def token_ids(lm: LoadedModel, text: str, special: bool = True) -> list[int]:
    return list(lm.tokenizer(text, add_special_tokens=special)["input_ids"])


def encode_pair(lm: LoadedModel, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's causal models split them."""
    if not context:
        cont = token_ids(lm, continuation, special=False)
        return [prefix_id(lm)], cont
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, ctx = token_ids(lm, context + continuation), token_ids(lm, context)
    return ctx, whole[len(ctx) :]


def check_fits(lm: LoadedModel, cont_ids: Sequence[int], what: str) -> None:
    window = context_window(lm)
    if window and len(cont_ids) >= window:
        raise ConfigError(
            f"{what}: the continuation alone is {len(cont_ids)} tokens for {lm.name}, over its context of {window}"
        )


def score(lm: LoadedModel, ctx_ids: Sequence[int], cont_ids: Sequence[int]) -> Scored:
    """The continuation's log-probability given the context; a context over the model's window keeps its last
    tokens (as lm-eval's HF model truncates on the left). An empty continuation has probability 1."""
    if not cont_ids:
        return Scored(0.0, True, 0)
    window = context_window(lm)
    ids = list(ctx_ids) + list(cont_ids)
    if window and len(ids) > window:
        ids = ids[len(ids) - window :]
    starts = list(range(len(ids) - len(cont_ids), len(ids)))
    logits = lm.open_session().next_token_logits(ids, starts).float()
    logprobs = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(list(cont_ids))
    picked = logprobs.gather(1, target[:, None])[:, 0]
    greedy = bool((logits.argmax(dim=-1) == target).all())
    return Scored(float(picked.sum()), greedy, len(cont_ids))


def rolling(lm: LoadedModel, text: str) -> Scored:
    """The whole text's log-probability, conditioned on the prefix token, in disjoint windows of the model's
    context (lm-eval's `loglikelihood_rolling`: every token predicted once, each with the most context)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tokens = token_ids(lm, text, special=False)
    window = context_window(lm) or len(tokens) + 1
    total, greedy = 0.0, True
    for pair in get_rolling_token_windows(tokens, prefix_id(lm), window, 1):
        ctx, cont = make_disjoint_window(pair)
        part = score(lm, ctx, cont)
        total, greedy = total + part.logprob, greedy and part.greedy
    return Scored(total, greedy, len(tokens))


def combine(scores: Sequence[Scored], weights: Sequence[float]) -> tuple[float, bool]:
    """log Σ w_m P_m (weights normalised) and whether every model was greedy."""
    total = sum(weights)
    terms = [math.log(w / total) + s.logprob for s, w in zip(scores, weights) if w > 0]
    top = max(terms)
    if top == -math.inf:
        return -math.inf, all(s.greedy for s in scores)
    return top + math.log(sum(math.exp(t - top) for t in terms)), all(s.greedy for s in scores)

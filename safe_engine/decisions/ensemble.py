"""Ensemble distributions over models with different vocabularies, and SAFE's sharpening.

Tokens are matched across models by the bytes they spell (`LoadedModel.key_of`), except by EVA, which
maps them through a learned alignment into the drafter's vocabulary (`eva.py`). Every method returns
an `EnsembleResult` that keeps the union table: each model's probability of each candidate string, the
ensemble before sharpening and, when sharpening ran, after it — the UI shows all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..contract.config import TOP_K_SHOWN, EnsembleConfig
from ..models.loading import LoadedModel
from ..models.vocab_alignment import VocabAlignment, vocab_alignment
from ..tokenization.alignment import EOS_KEY, TokenBytes
from .core import CoreScores, core_mix, core_scores
from .eva import MappedToken, eva_mix, mapped_tokens, top_softmax
from .model_tuples import ModelTupleCache

Key = bytes | str


@dataclass
class ModelView:
    """One model's next-token logits at the point being ensembled, and its weight in the ensemble."""

    lm: LoadedModel
    logits: torch.Tensor  # [vocab], float32
    weight: float = 1.0  # relative; the views' weights are normalised together


@dataclass
class EnsembleResult:
    keys: list[Key]
    per_model: torch.Tensor  # [models, union]: each model's probability of each key
    before: torch.Tensor  # [union]: weighted mean, before sharpening
    after: torch.Tensor | None  # [union]: after sharpening, None if it did not run
    chosen: Key
    core: CoreScores | None = None  # CoRE's weights and token scores (method core)
    joined: list[bool] | None = None  # EVA: which models joined the mean (method eva)
    mapped: list[MappedToken] | None = None  # EVA: the assisting models' top tokens and their main tokens

    @property
    def final(self) -> torch.Tensor:
        return self.before if self.after is None else self.after


def _weights(views: Sequence[ModelView]) -> torch.Tensor:
    w = torch.tensor([view.weight for view in views], dtype=torch.float32)
    return w / w.sum()


def top_keys(view: ModelView, k: int) -> dict[Key, int]:
    """A model's top-k as {string: token id}, best first; ids spelling the same string count once."""
    top: dict[Key, int] = {}
    for token_id in torch.topk(view.logits, k).indices.tolist():
        top.setdefault(view.lm.key_of(token_id), token_id)
    return top


def _logit_of(view: ModelView, key: Key, fill: bool) -> float:
    """A model's logit for a union string: its exact token, else (UniTE) its first sub-token."""
    lm = view.lm
    if key == EOS_KEY:
        return max(view.logits[i].item() for i in lm.eos_ids) if lm.eos_ids else float("-inf")
    if isinstance(key, str):  # a special token of another model: nothing to map it to
        return float("-inf")
    token_id = first_subtoken(lm.vocab, key) if fill else lm.vocab.id_of_bytes.get(key)
    return float("-inf") if token_id is None else view.logits[token_id].item()


def first_subtoken(vocab: TokenBytes, key: bytes) -> int | None:
    """The id whose logit UniTE's fill reads for a string: its exact token, else its first sub-token.

    None when the vocabulary cannot spell the string at all.
    """
    exact = vocab.id_of_bytes.get(key)
    if exact is not None:
        return exact
    try:
        pieces = vocab.encode_bytes(key)
    except ValueError:
        return None
    # Like UniTE, skip the bare-space piece ("▁" before "James"; " \n" is read at "\n") unless nothing else is left.
    return next((i for i in pieces if vocab[i] != b" "), pieces[0] if pieces else None)


def unite_union(views: Sequence[ModelView], config: EnsembleConfig) -> tuple[list[Key], torch.Tensor]:
    """UniTE: union of each model's top-k strings, softmax over that subset per model."""
    tops = [top_keys(view, config.top_k) for view in views]
    keys = list(dict.fromkeys(key for top in tops for key in top))
    fill = config.method in ("unite", "core")  # CoRE reweights UniTE's union
    rows = []
    for view, top in zip(views, tops):
        logits = [view.logits[top[k]].item() if k in top else _logit_of(view, k, fill) for k in keys]
        rows.append(torch.softmax(torch.tensor(logits), dim=0))
    return keys, torch.stack(rows)


def gac_union(views: Sequence[ModelView], config: EnsembleConfig) -> tuple[list[Key], torch.Tensor]:
    """GaC-style: every model's full distribution mapped onto the union of all vocabularies by string.

    The table keeps the strings that matter (each model's top-k and the ensemble's own top-k); the
    argmax is taken over the full union before trimming.
    """
    union_keys, targets = VOCAB_UNIONS.get(tuple(view.lm for view in views))
    full = torch.zeros(len(views), len(union_keys))
    for row, view, target in zip(full, views, targets):
        n = min(len(target), len(view.logits))  # model heads may be padded past the tokenizer
        row.index_add_(0, target[:n], torch.softmax(view.logits.float(), dim=0)[:n])
    mean = _weights(views) @ full
    keep = set(torch.topk(mean, config.top_k).indices.tolist())
    for row in full:
        keep |= set(torch.topk(row, config.top_k).indices.tolist())
    order = sorted(keep, key=lambda i: -mean[i].item())
    return [union_keys[i] for i in order], full[:, order]


def vocabulary_union(lms: tuple[LoadedModel, ...]) -> tuple[list[Key], list[torch.Tensor]]:
    """The union of the models' vocabularies by string, and each vocabulary id's place in it."""
    index: dict[Key, int] = {}
    targets = [torch.tensor([index.setdefault(lm.key_of(i), len(index)) for i in range(len(lm.vocab))]) for lm in lms]
    return list(index), targets


VOCAB_UNIONS = ModelTupleCache(vocabulary_union)
"""The unions `gac_union` reads: GaC maps every model's full distribution onto its models' union."""

ALIGNMENTS: ModelTupleCache[VocabAlignment] = ModelTupleCache(lambda lms: vocab_alignment(*lms))
"""EVA's alignments by (main model, assisting model), read from disk or built once (`models.vocab_alignment`)."""


def main_vocab_columns(main: LoadedModel, rows: torch.Tensor, mix: torch.Tensor, top_k: int) -> dict[Key, list[int]]:
    """The drafter's tokens a table of a mix over its vocabulary shows: the mix's top-k and each row's top-k
    with mass, one column per string (ids spelling the same string together), best first."""
    keep = set(torch.topk(mix, top_k).indices.tolist())
    for row in rows:
        top = torch.topk(row, top_k)
        keep |= {i for i, p in zip(top.indices.tolist(), top.values.tolist()) if p > 0}
    columns: dict[Key, list[int]] = {}
    for i in sorted(keep, key=lambda i: -mix[i].item()):
        columns.setdefault(main.key_of(i), []).append(i)
    return columns


def _main_vocab_result(
    main: LoadedModel, rows: torch.Tensor, mix: torch.Tensor, top_k: int, core: CoreScores | None = None, **extra
) -> EnsembleResult:
    """An ensemble decided over the drafter's vocabulary, as a table of the tokens that matter; the mix's argmax
    (always among them) is the choice. CoRE's token scores are kept for the shown strings (each its first id's)."""
    columns = main_vocab_columns(main, rows, mix, top_k)
    keys = list(columns)
    per_model = torch.stack([rows[:, ids].sum(1) for ids in columns.values()], dim=1)
    before = torch.stack([mix[ids].sum() for ids in columns.values()])
    if core is not None:
        core = CoreScores(core.weights, core.token_scores[:, [ids[0] for ids in columns.values()]])
    return EnsembleResult(keys, per_model, before, None, keys[int(torch.argmax(before))], core=core, **extra)


def eva_union(views: Sequence[ModelView], config: EnsembleConfig) -> EnsembleResult:
    """EVA over the drafter's vocabulary, views[0] its main model."""
    main = views[0].lm
    alignments = [ALIGNMENTS.get((main, view.lm)) for view in views[1:]]
    logits = [view.logits for view in views]
    mix = eva_mix(logits, alignments, len(main.vocab), _weights(views), config)
    shown = mapped_tokens(logits, alignments, TOP_K_SHOWN, config.eva_top)
    return _main_vocab_result(main, mix.rows, mix.mean, config.top_k, joined=mix.joined, mapped=shown)


def main_token(main: LoadedModel, key: Key) -> int | None:
    """The drafter's token an assisting model's token is carried to by the paper's UniTE token map: the same
    string, else its first sub-token (an end token to an end token; another special token to none)."""
    if key == EOS_KEY:
        return min(main.eos_ids) if main.eos_ids else None
    return None if isinstance(key, str) else first_subtoken(main.vocab, key)


def main_vocab_projection(views: Sequence[ModelView], top_k: int) -> torch.Tensor:
    """CoRE's own frame: each model's top-k softmaxed, every assisting model's mass carried onto the drafter's
    tokens by `main_token`, not renormalised (mass with nowhere to go is dropped): [models, drafter vocab]."""
    main = views[0].lm
    size = len(main.vocab)
    rows = [top_softmax(views[0].logits, size, top_k)]
    for view in views[1:]:
        probs = top_softmax(view.logits, len(view.lm.vocab), top_k)
        row = torch.zeros(size)
        for token in probs.nonzero().flatten().tolist():
            target = main_token(main, view.lm.key_of(token))
            if target is not None:
                row[target] += probs[token]
        rows.append(row)
    return torch.stack(rows)


def core_in_main_vocab(views: Sequence[ModelView], config: EnsembleConfig) -> EnsembleResult:
    """CoRE as the paper frames it: over the drafter's vocabulary, the assisting models carried into it."""
    rows = main_vocab_projection(views, config.top_k)
    scores = core_scores(rows, _weights(views), config)
    return _main_vocab_result(views[0].lm, rows, core_mix(rows, scores), config.top_k, core=scores)


def core_union(views: Sequence[ModelView], config: EnsembleConfig) -> EnsembleResult:
    """CoRE over UniTE's union: the models' consistency weights and token scores, and their mix."""
    keys, per_model = unite_union(views, config)
    scores = core_scores(per_model, _weights(views), config)
    mix = core_mix(per_model, scores)
    return EnsembleResult(keys, per_model, mix, None, keys[int(torch.argmax(mix))], core=scores)


def mean_union(views: Sequence[ModelView], config: EnsembleConfig) -> EnsembleResult:
    """UniTE, top-k or GaC: the union and the models' weighted mean over it."""
    union = gac_union if config.method == "gac" else unite_union
    keys, per_model = union(views, config)
    before = _weights(views) @ per_model
    return EnsembleResult(keys, per_model, before, None, keys[int(torch.argmax(before))])


def core(views: Sequence[ModelView], config: EnsembleConfig) -> EnsembleResult:
    """CoRE in the frame `core_space` names: UniTE's union (union) or the drafter's vocabulary (main)."""
    return (core_in_main_vocab if config.core_space == "main" else core_union)(views, config)


MIXES = {"core": core, "eva": eva_union}


def sharpen_heuristic(keys: Sequence[Key], probs: torch.Tensor, anchors: Sequence[Key], lam: float) -> torch.Tensor:
    """SAFE's heuristic: a drafter candidate a with P(a) > λ absorbs every string that starts with a.

    No renormalisation (only the argmax is used). Like the authors' code, the single space " " is no
    anchor (every space-prefixed word starts with it); other whitespace is: "\n" absorbs "\n\n".
    """
    out = probs.clone()
    for a_index, a in enumerate(keys):
        if not isinstance(a, bytes) or a not in anchors or a == b" " or probs[a_index] <= lam:
            continue
        extra = sum(
            probs[b_index].item()
            for b_index, b in enumerate(keys)
            if b_index != a_index and isinstance(b, bytes) and b.startswith(a)
        )
        out[a_index] = probs[a_index] + extra
    return out


def sharpen_geometric(per_model: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted geometric mean of the models' probabilities, renormalised over the union."""
    log = (weights[:, None] * torch.log(per_model.clamp_min(1e-30))).sum(0)
    return torch.softmax(log, dim=0)


def ensemble(views: Sequence[ModelView], config: EnsembleConfig) -> EnsembleResult:
    """Ensemble distribution and its argmax; views[0] is the drafter (its top-k anchors sharpening, and it is
    CoRE's anchor and EVA's main model).

    The weights are the views' own (`config.weights` is in the user's model order; the run maps it).
    """
    result = MIXES.get(config.method, mean_union)(views, config)
    if config.sharpen != "none" and result.before.max().item() < 0.5:
        if config.sharpen == "heuristic":
            anchors = list(top_keys(views[0], config.top_k))
            result.after = sharpen_heuristic(result.keys, result.before, anchors, config.sharpen_lambda)
        else:
            weights = _weights(views) if result.core is None else result.core.weights
            result.after = sharpen_geometric(result.per_model, weights)
    result.chosen = result.keys[int(torch.argmax(result.final))]
    return result

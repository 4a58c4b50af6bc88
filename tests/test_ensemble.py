"""Union ensembling, sharpening worked by hand, and the consensus rule as a property."""

import gc

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tiny_models import unigram_tokenizer

from safe_engine.contract.config import EnsembleConfig
from safe_engine.decisions.ensemble import (
    ModelView,
    ensemble,
    first_subtoken,
    sharpen_geometric,
    sharpen_heuristic,
    vocabulary_union,
)
from safe_engine.decisions.model_tuples import ModelTupleCache
from safe_engine.models.loading import LoadedModel

WORDS = [" So", " Sofia", " Sol", " Paris", " Rome", " Lima", " Oslo", " Bern"]


def tokenizer_only(tokenizer, name):
    """A LoadedModel without weights: ensembling reads only logits, vocabulary and end tokens."""
    return LoadedModel(None, name, tokenizer, sessions=None, eos_ids=frozenset({tokenizer.eos_token_id}))


@pytest.fixture(scope="module")
def pair():
    a = tokenizer_only(unigram_tokenizer(WORDS), "a")
    b = tokenizer_only(unigram_tokenizer([w for w in WORDS if w != " Sofia"]), "b")  # b spells " So|fia"
    return a, b


def logits_for(lm, probs: dict[str, float]) -> torch.Tensor:
    """Logits whose softmax puts `probs` on those words and spreads the rest thinly."""
    logits = torch.full((len(lm.tokenizer),), -30.0)
    for word, p in probs.items():
        logits[lm.vocab.id_of_bytes[word.encode()]] = torch.log(torch.tensor(p))
    return logits


def test_heuristic_sharpening_by_hand():
    keys = [b" So", b" Sofia", b" Sol", b" Paris"]
    probs = torch.tensor([0.20, 0.25, 0.10, 0.30])
    after = sharpen_heuristic(keys, probs, anchors=keys, lam=0.1)
    # " So" absorbs " Sofia" and " Sol": 0.20 + 0.25 + 0.10; nothing else starts with another key.
    assert after.tolist() == pytest.approx([0.55, 0.25, 0.10, 0.30])
    # Above λ only: with λ = 0.25 " So" (0.20) may not absorb anything.
    assert sharpen_heuristic(keys, probs, anchors=keys, lam=0.25).tolist() == pytest.approx(probs.tolist())
    # Only the drafter's candidates anchor.
    assert sharpen_heuristic(keys, probs, anchors=[b" Paris"], lam=0.1).tolist() == pytest.approx(probs.tolist())


def test_the_single_space_is_no_anchor_but_a_newline_is():
    """Token 0 of "Write one sentence about the history of Kyoto." on the embedded pair, as the authors'
    code decides it: "\n" (0.103) absorbs "\n\n" (0.313) and beats "K" (0.326); " " absorbs nothing."""
    keys = [b"\n", b"\n\n", b"K", b" ", b" Kyoto"]
    probs = torch.tensor([0.103, 0.313, 0.326, 0.15, 0.05])
    after = sharpen_heuristic(keys, probs, anchors=keys, lam=0.1)
    assert after.tolist() == pytest.approx([0.416, 0.313, 0.326, 0.15, 0.05])
    assert keys[int(torch.argmax(after))] == b"\n"


def test_first_subtoken_skips_only_the_bare_space(pair):
    vocab = pair[0].vocab
    assert vocab[first_subtoken(vocab, b" \n")] == b"\n"  # UniTE reads " \n" at "\n", not at " "
    assert vocab[first_subtoken(vocab, b" Sofia")] == b" Sofia"  # a whole token is its own first sub-token
    assert vocab[first_subtoken(vocab, b"  ")] == b" "  # nothing but spaces: the space it is


def test_geometric_sharpening_by_hand():
    per_model = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    out = sharpen_geometric(per_model, torch.tensor([0.5, 0.5]))
    # sqrt(.45) = .6708, sqrt(.05) = .2236 -> normalised .75 / .25
    assert out.tolist() == pytest.approx([0.75, 0.25], abs=1e-4)


def test_unite_fills_missing_strings_with_the_first_subtoken(pair):
    a, b = pair
    views = [
        ModelView(a, logits_for(a, {" Sofia": 0.6, " Paris": 0.3})),
        ModelView(b, logits_for(b, {" So": 0.5, " Rome": 0.4})),
    ]
    result = ensemble(views, EnsembleConfig(top_k=2, sharpen="none"))
    table = dict(zip(result.keys, result.per_model[1].tolist()))
    # b has no " Sofia" token: it is scored with b's first sub-token " So".
    assert table[b" Sofia"] == pytest.approx(table[b" So"])
    assert set(result.keys) == {b" Sofia", b" Paris", b" So", b" Rome"}
    without_fill = ensemble(views, EnsembleConfig(method="topk", top_k=2, sharpen="none"))
    assert dict(zip(without_fill.keys, without_fill.per_model[1].tolist()))[b" Sofia"] == 0.0


def test_sharpening_runs_only_when_the_ensemble_is_too_smooth(pair):
    a, b = pair
    smooth = [
        ModelView(a, logits_for(a, {" So": 0.3, " Sol": 0.3, " Rome": 0.3})),
        ModelView(b, logits_for(b, {" Rome": 0.3, " Sol": 0.3, " Lima": 0.3})),
    ]
    result = ensemble(smooth, EnsembleConfig(top_k=3))
    assert result.after is not None and result.chosen == b" So"  # " So" absorbed " Sol"
    sharp = [ModelView(a, logits_for(a, {" Rome": 0.9})), ModelView(b, logits_for(b, {" Rome": 0.9}))]
    assert ensemble(sharp, EnsembleConfig(top_k=3)).after is None


def test_gac_uses_the_full_union(pair):
    a, b = pair
    views = [
        ModelView(a, logits_for(a, {" Sofia": 0.5, " Oslo": 0.4, " Rome": 0.1})),
        ModelView(b, logits_for(b, {" Oslo": 0.9, " Rome": 0.1})),
    ]
    result = ensemble(views, EnsembleConfig(method="gac", top_k=1, sharpen="none"))
    assert result.chosen == b" Oslo"
    # Full-vocabulary probabilities, not renormalised over top-k: (0.4 + 0.9) / 2.
    assert result.before[result.keys.index(b" Oslo")].item() == pytest.approx(0.65, abs=1e-3)


def test_the_vocabulary_unions_are_few_and_only_for_their_own_models(pair):
    """The cache keeps the last `size` model tuples; a union is served only to the models it was made for,
    never to later models that took a freed model's id(); a freed model's entries go."""
    a, b = pair
    cache = ModelTupleCache(vocabulary_union, size=2)
    keys, _ = cache.get((a, b))
    assert cache.get((a, b))[0] is keys and cache.get((b, a))[0] is not keys and len(cache) == 2
    c = tokenizer_only(unigram_tokenizer(WORDS[:3]), "c")
    cache.get((a, c))
    assert len(cache) == 2 and cache.get((a, b))[0] is not keys  # (a, b) had gone: the least recently used
    cache.get((a, c))
    freed = id(c)
    del c
    gc.collect()
    other = unigram_tokenizer([" Quito", " Lima"])
    held = []  # models at other addresses stay alive, so the next one cannot take theirs
    for _ in range(2000):
        d = tokenizer_only(other, "d")
        if id(d) == freed:
            break
        held.append(d)
    union, _ = cache.get((a, d))
    assert b" Quito" in union and b" Sofia" in union  # d's own union, whether or not it took c's id
    assert len(cache) == 2  # (a, c) went with c


probabilities = st.lists(st.floats(0.01, 1.0), min_size=len(WORDS), max_size=len(WORDS))


@settings(max_examples=200, deadline=None)
@given(drafter=probabilities, verifier=probabilities, method=st.sampled_from(["unite", "gac"]))
def test_consensus_skip_never_changes_the_ensemble_argmax(pair, drafter, verifier, method):
    """SAFE's Theorem 1 (aligned case): unanimity or mean p > 0.5 ⇒ the ensemble's argmax is the draft."""
    a, _ = pair

    def dist(weights):
        total = sum(weights)
        return {w: x / total for w, x in zip(WORDS, weights)}

    pd, pv = dist(drafter), dist(verifier)
    drafted = max(pd, key=pd.get)
    verifier_argmax = max(pv, key=pv.get)
    for p in (pd, pv):  # greedy decoding is only defined without ties for first place
        best, second = sorted(p.values(), reverse=True)[:2]
        assume(best - second > 1e-4)
    unanimity = verifier_argmax == drafted
    mean_p = (pd[drafted] + pv[drafted]) / 2
    views = [ModelView(a, logits_for(a, pd)), ModelView(a, logits_for(a, pv))]
    result = ensemble(views, EnsembleConfig(method=method, top_k=len(WORDS), sharpen="none"))
    if unanimity or mean_p > 0.5:
        assert result.chosen == drafted.encode()

"""CoRE's and EVA's rules pinned on hand-made distributions with known answers, as tests/test_rules.py pins SAFE's.

`python -m scripts.mutations` breaks each rule in a copy of the engine and checks that these tests fail.
"""

import math

import pytest
import torch
from scripted_models import scripted

from safe_engine.contract.config import EnsembleConfig
from safe_engine.contract.events import EnsemblePoint
from safe_engine.decisions import ensemble as ensemble_module
from safe_engine.decisions.core import consistency, core_mix, core_scores
from safe_engine.decisions.eva import eva_mix, joined, mapped
from safe_engine.decisions.model_tuples import ModelTupleCache
from safe_engine.models.vocab_alignment import (
    VocabAlignment,
    align_embeddings,
    csls_links,
    filtered,
    without_special_tokens,
)
from safe_engine.strategies.decoding import DecodeConfig, decode

P = "Q:"
LETTERS = list("abcdefghijklmnopqrstuvwxyz")
CORE = EnsembleConfig(method="core", sharpen="none")
EVEN = torch.tensor([0.5, 0.5])


def rbf(delta: float, beta: float = 2.0) -> float:
    return (math.exp(-beta * delta) - math.exp(-beta)) / (1 - math.exp(-beta))


def entropy(p) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def run(models, config: EnsembleConfig, strategy="per-token"):
    return list(decode(models, P, DecodeConfig(strategy=strategy, ensemble=config, max_new_tokens=4)))


def points(events) -> list[EnsemblePoint]:
    return [e for e in events if isinstance(e, EnsemblePoint)]


# ---------------------------------------------------------------- CoRE
def test_the_consistency_scores_by_hand():
    delta = torch.tensor([0.0, 0.2, 1.0])
    assert consistency(delta, CORE).tolist() == pytest.approx([1.0, rbf(0.2), 0.0])  # rbf, β = 2
    assert consistency(delta, EnsembleConfig(core_beta=5.0)).tolist() == pytest.approx([1.0, rbf(0.2, 5.0), 0.0])
    assert consistency(delta, EnsembleConfig(core_score="linear")).tolist() == pytest.approx([1.0, 0.8, 0.0])
    power = EnsembleConfig(core_score="power", core_alpha=3.0)
    assert consistency(delta, power).tolist() == pytest.approx([1.0, 0.8**3, 0.0])


def test_two_models_weigh_by_their_inverse_entropy():
    """Two models are equally far from their mean, so their summed token scores match and the model score
    S/H leaves 1/H: the main model, the sharper one, weighs H₁/(H₀ + H₁) and no clip is needed."""
    per_model = torch.tensor([[0.8, 0.1, 0.1], [0.4, 0.3, 0.3]])
    scores = core_scores(per_model, EVEN, CORE)
    h0, h1 = entropy([0.8, 0.1, 0.1]), entropy([0.4, 0.3, 0.3])
    assert scores.weights.tolist() == pytest.approx([h1 / (h0 + h1), h0 / (h0 + h1)])
    # δ = |p − mean| = (0.2, 0.1, 0.1) for both; scores normalised to mean 1 over the three candidates.
    raw = [rbf(0.2), rbf(0.1), rbf(0.1)]
    expected = [3 * r / sum(raw) for r in raw]
    assert scores.token_scores[1].tolist() == pytest.approx(expected)
    assert scores.token_scores.mean(1).tolist() == pytest.approx([1.0, 1.0])
    # The mix: the main model as it is, the assist scaled by its token scores.
    w0, w1 = scores.weights.tolist()
    mix = [w0 * a + w1 * s * b for a, b, s in zip(per_model[0].tolist(), per_model[1].tolist(), expected)]
    assert core_mix(per_model, scores).tolist() == pytest.approx(mix)


def test_the_anchor_clip_keeps_the_main_model_at_half_at_least():
    """A flat main model and two sharp assists: their raw weights outvote it, so the clip sets the main
    model's weight to theirs together, ½ after normalising; the two identical assists share the rest."""
    per_model = torch.tensor([[0.4, 0.3, 0.3], [0.9, 0.05, 0.05], [0.9, 0.05, 0.05]])
    scores = core_scores(per_model, torch.ones(3) / 3, CORE)
    assert scores.weights.tolist() == pytest.approx([0.5, 0.25, 0.25])
    # The run's weights scale the raw weights before the clip: favouring the main model 8:1:1 lifts it past ½.
    favoured = core_scores(per_model, torch.tensor([0.8, 0.1, 0.1]), CORE)
    assert favoured.weights[0].item() > 0.52 and favoured.weights[1].item() == pytest.approx(favoured.weights[2].item())


def test_a_candidate_off_both_supports_scores_nothing():
    """A candidate neither the assist nor the main model gives mass to is off the support (score 0), and the
    scores average 1 over the support only."""
    per_model = torch.tensor([[0.6, 0.4, 0.0], [0.5, 0.5, 0.0]])
    scores = core_scores(per_model, EVEN, CORE)
    assert scores.token_scores[1, 2].item() == 0.0
    assert scores.token_scores[1, :2].mean().item() == pytest.approx(1.0)


CORE_DRAFTER = {"": {"x": 0.6, "y": 0.4}}
CORE_VERIFIER = {"": {"x": 0.05, "y": 0.25, "z": 0.7}}


def test_core_decides_what_at_an_ensemble_point():
    """Over the union {x, y, z}: UniTE's mean picks z (0.35); CoRE clips the sharper verifier to ½ and scores
    its tokens by their distance to the mean, so y wins (≈ 0.378 against x ≈ 0.322 and z ≈ 0.248). The event
    carries the weights and each model's token scores."""
    models = scripted("a", [], CORE_DRAFTER, P), scripted("b", [], CORE_VERIFIER, P)
    assert run(models, EnsembleConfig(sharpen="none"))[-1].text == "z"
    events = run(models, CORE)
    assert events[-1].text == "y"
    point = points(events)[0]
    assert point.method == "core" and point.model_weights == pytest.approx({"a": 0.5, "b": 0.5})
    raw = {"x": rbf(0.275), "y": rbf(0.075), "z": rbf(0.35)}
    rows = {row.text: row for row in point.table}
    for letter, r in raw.items():
        assert rows[letter].scores["b"] == pytest.approx(3 * r / sum(raw.values()), abs=1e-5)
    assert rows["y"].before == pytest.approx(0.2 + 0.5 * 0.25 * 3 * raw["y"] / sum(raw.values()), abs=1e-5)
    assert [row.text for row in point.table[:3]] == ["y", "x", "z"]


def test_core_composes_with_safes_gate():
    """SAFE decides where (here: the first token, where the verifier disagrees), CoRE what."""
    models = scripted("a", [], CORE_DRAFTER, P), scripted("b", [], CORE_VERIFIER, P)
    events = run(models, CORE, strategy="safe")
    assert [p.chosen for p in points(events)] == ["y"] and events[-1].text == "y"


SPLIT_DRAFTER = {"": {"x": 0.35, "y": 0.65}}
SPLIT_VERIFIER = {"": {"xy": 0.35, "xz": 0.35, "y": 0.3}}


def test_core_in_the_drafters_vocabulary_pools_what_the_union_splits():
    """The verifier's "xy" and "xz" (0.35 each) are not drafter tokens. Over UniTE's union they stay two strings
    and the drafter's first-sub-token fill reads its "x" for each, so y wins (CoRE as the plain mean). In the
    paper's frame both are carried to the drafter's "x" (0.7): x 0.525, y 0.475 (both weigh ½ after the clip,
    every token score 1, as both models are equally far from the mean), so x wins, a drafter token."""
    models = scripted("a", [], SPLIT_DRAFTER, P), scripted("b", ["xy", "xz"], SPLIT_VERIFIER, P)
    assert run(models, CORE)[-1].text == "y"
    events = run(models, EnsembleConfig(method="core", core_space="main", sharpen="none"))
    assert events[-1].text == "x"
    point = points(events)[0]
    rows = {row.text: row for row in point.table}
    assert rows["x"].per_model == pytest.approx({"a": 0.35, "b": 0.7}) and rows["x"].before == pytest.approx(0.525)
    assert rows["y"].per_model == pytest.approx({"a": 0.65, "b": 0.3}) and rows["y"].before == pytest.approx(0.475)
    assert "xy" not in rows and point.model_weights == pytest.approx({"a": 0.5, "b": 0.5})
    assert rows["x"].scores == pytest.approx({"a": 1.0, "b": 1.0})


# ---------------------------------------------------------------- EVA: the offline alignment
def test_the_alignment_recovers_a_known_rotation_across_widths():
    """An assisting vocabulary that is the main one shuffled, rotated and embedded in more dimensions: half
    of the tokens as the seed dictionary, and every token's best link is its counterpart."""
    torch.manual_seed(0)
    n, d = 120, 12
    main = torch.randn(n, d)
    rotation, _ = torch.linalg.qr(torch.randn(d + 4, d + 4))
    order = torch.randperm(n)
    aux = torch.cat([main[order], torch.zeros(n, 4)], 1) @ rotation
    pairs = torch.stack([torch.arange(0, n, 2), order[0:n:2]], 1)
    alignment = align_embeddings(aux, main, pairs)
    assert torch.equal(alignment.index[:, 0], order)
    assert alignment.weight[:, 0].tolist() == pytest.approx([1.0] * n, abs=1e-4)  # 2·cos − its own best cos


def test_csls_prefers_the_match_to_a_hub():
    """cos(x₀, hub) = cos 20° beats cos(x₀, true) = cos 22°, but the hub is nearer still to x₁ (5°):
    CSLS = 2·cos − the main token's best cosine gives hub 2cos20° − cos5° < true 2cos22° − cos22°."""

    def at(degrees):
        return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees))]

    aux = torch.tensor([at(0), at(-25)])
    main = torch.tensor([at(-20), at(22)])  # hub, true
    scores, index = csls_links(aux, main)
    assert index[0].tolist() == [1, 0]
    cos = math.cos
    assert scores[0].tolist() == pytest.approx(
        [cos(math.radians(22)), 2 * cos(math.radians(20)) - cos(math.radians(5))], abs=1e-6
    )


def test_the_link_filters():
    """Links under 0.1 go; a row keeping more than 5 links within 0.01 of each other goes whole (a token
    close to everything); five such links stay."""
    weak = [0.5, 0.09, 0.2] + [0.0] * 7
    flat6 = [0.300, 0.302, 0.304, 0.306, 0.308, 0.310, 0.05, 0.0, 0.0, 0.0]
    flat5 = [0.300, 0.302, 0.304, 0.306, 0.308, 0.05, 0.0, 0.0, 0.0, 0.0]
    spread6 = [0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.0, 0.0, 0.0, 0.0]
    out = filtered(torch.tensor([weak, flat6, flat5, spread6])).tolist()
    assert out[0] == pytest.approx([0.5, 0.0, 0.2] + [0.0] * 7)
    assert out[1] == [0.0] * 10
    assert out[2] == pytest.approx(flat5[:5] + [0.0] * 5)
    assert out[3] == pytest.approx(spread6)


def test_tokens_without_text_neither_link_nor_are_linked_but_end_tokens_meet():
    """Every token of the assist linked to the main model's <unk> (no text) and to "x": only "x" stays; the
    assist's <unk> links to nothing and its end token to the main end token alone."""
    aux, main = scripted("b", [], {}, P), scripted("a", [], {}, P)
    unk, x = main.tokenizer.unk_token_id, main.vocab.id_of_bytes[b"x"]
    size = len(aux.vocab)
    linked = VocabAlignment(torch.tensor([[unk, x]] * size), torch.tensor([[0.9, 0.5]] * size))
    out = without_special_tokens(linked, aux, main)
    y = aux.vocab.id_of_bytes[b"y"]
    assert out.weight[y].tolist() == [0.0, 0.5]
    assert out.weight[aux.tokenizer.unk_token_id].tolist() == [0.0, 0.0]
    eos = aux.tokenizer.eos_token_id
    assert out.index[eos, 0].item() == main.tokenizer.eos_token_id and out.weight[eos].tolist() == [1.0, 0.0]


# ---------------------------------------------------------------- EVA: one point
def test_an_assisting_distribution_is_carried_by_the_alignment_weights():
    """Aux token 0 → main 2 (0.9) and main 0 (0.3); aux token 1 → main 1 (1.0); unnormalised, as EVA does."""
    alignment = VocabAlignment(torch.tensor([[2, 0], [1, 0]]), torch.tensor([[0.9, 0.3], [1.0, 0.0]]))
    assert mapped(torch.tensor([0.75, 0.25]), alignment, 3).tolist() == pytest.approx([0.225, 0.25, 0.675])


def test_the_drop_filter():
    rows = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    # Model 1's top token (3) is in no other model's top 2; 0's and 2's (token 0) are in each other's.
    assert joined(rows, 2) == [True, False, True]
    assert joined(rows, 4) == [True, True, True]
    assert joined(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), 1) == [True, True]  # none joins: all do


def test_eva_keeps_each_models_top_tokens_only():
    """The assist's 3rd token is outside its top 2: its mass is not mapped (the top 2 are renormalised)."""
    alignment = VocabAlignment(torch.tensor([[0], [1], [2]]), torch.ones(3, 1))
    logits = [torch.log(torch.tensor([0.5, 0.3, 0.2])), torch.log(torch.tensor([0.5, 0.3, 0.2]))]
    mix = eva_mix(logits, [alignment], 3, EVEN, EnsembleConfig(eva_top=2))
    assert mix.rows.flatten().tolist() == pytest.approx([0.625, 0.375, 0.0] * 2)


EVA_DRAFTER = {"": {"x": 0.55, "y": 0.45}}
EVA_VERIFIER = {"": {"z": 0.9, "x": 0.1}}


def test_eva_decides_in_the_drafters_vocabulary(monkeypatch):
    """The verifier's "z" means the drafter's "y" (a hand-made alignment; every other letter maps to
    itself): UniTE's string union picks z (0.45), EVA maps z onto y and picks y (0.45/2 + 0.9/2 = 0.675)."""
    drafter, verifier = scripted("a", [], EVA_DRAFTER, P), scripted("b", [], EVA_VERIFIER, P)

    def alignment(lms):
        main, aux = lms
        ids = main.vocab.id_of_bytes
        index = torch.zeros(len(aux.vocab), 1, dtype=torch.long)
        weight = torch.zeros(len(aux.vocab), 1)
        for i in range(len(aux.vocab)):
            key = b"y" if aux.vocab[i] == b"z" else aux.vocab[i]
            if key in ids:
                index[i, 0], weight[i, 0] = ids[key], 1.0
        return VocabAlignment(index, weight)

    monkeypatch.setattr(ensemble_module, "ALIGNMENTS", ModelTupleCache(alignment))
    models = drafter, verifier
    assert run(models, EnsembleConfig(sharpen="none"))[-1].text == "z"
    events = run(models, EnsembleConfig(method="eva", sharpen="none"))
    assert events[-1].text == "y"
    point = points(events)[0]
    rows = {row.text: row for row in point.table}
    assert rows["y"].per_model == pytest.approx({"a": 0.45, "b": 0.9}) and rows["y"].before == pytest.approx(0.675)
    assert point.joined == ["a", "b"]
    z = next(m for m in point.mapped if m.text == "z")
    assert z.model == "b" and z.p == pytest.approx(0.9) and [(t.text, t.p) for t in z.targets] == [("y", 1.0)]


# ---------------------------------------------------------------- the pages show what the methods did
def test_the_details_and_tips_show_cores_weights_and_evas_mapping_escaped(monkeypatch):
    """The pinned details and the hover tip of an ensembled token, from the events as a trace holds them;
    model output in the methods' fields is escaped."""
    from safe_engine.pages.transcript import details_html, transcript_html
    from safe_engine.pages.view import RunView

    models = scripted("a", [], CORE_DRAFTER, P), scripted("b", [], CORE_VERIFIER, P)
    events = [e.to_dict() for e in run(models, CORE)]
    point = next(e for e in events if e["kind"] == "ensemble_point")
    point["table"][0]["text"] = "<b>y"
    point["mapped"] = [{"model": "b", "text": "<i>z", "p": 0.9, "targets": [{"text": "<u>y", "p": 1.0}]}]
    point["joined"] = ["a"]
    view = RunView.of(events)
    details = details_html(view, 0)
    assert "CoRE's model weights (after the anchor clip): a 0.500, b 0.500" in details and "score b" in details
    assert "&lt;b&gt;y" in details and "&lt;i&gt;z" in details and "&lt;u&gt;y" in details
    assert "<b>y" not in details and "<i>z" not in details and "<u>y" not in details
    tip = transcript_html(view)
    assert "CoRE weighed the models by consistency: a 0.50, b 0.50" in tip and "EVA left b out" in tip


# ---------------------------------------------------------------- the embedded pair
@pytest.mark.real_models
@pytest.mark.timeout(3600)  # a fresh machine builds EVA's alignment of the pair first: 15-27 min measured under load
@pytest.mark.parametrize("method", ["core", "eva"])
def test_generate_runs_each_method_on_the_embedded_pair(embedded_pair, method, tmp_path):
    """`generate --ensemble-method core|eva` on the embedded pair, 6 tokens per-token (an ensemble point at
    each): the trace's points carry CoRE's weights (Gemma, the drafter, at ½ or more) or EVA's mapping.
    EVA reads the pair's alignment from the cache, building it first when it is not there (minutes)."""
    import json

    from safe_engine.cli import main

    trace = tmp_path / "run.jsonl"
    argv = ["generate", "--prompt", "The capital of France is", "--max-new-tokens", "6", "--strategy", "per-token"]
    assert main([*argv, "--ensemble-method", method, "--trace", str(trace)]) == 0
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    found = [e for e in events if e["kind"] == "ensemble_point"]
    assert found and all(p["method"] == method for p in found) and events[-1]["text"]
    if method == "core":
        assert all(p["model_weights"]["gemma-3-270m"] >= 0.5 - 1e-6 for p in found)
        assert all(row["scores"] is not None for p in found for row in p["table"])
    else:
        assert all(p["mapped"] and p["joined"] for p in found)
        assert any(c["targets"] for p in found for c in p["mapped"])

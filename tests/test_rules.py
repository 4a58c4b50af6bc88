"""Every SAFE rule pinned on its own, decode-level, with scripted models (exact, hand-written probabilities).

`python scripts/mutations.py` breaks each rule in a copy of the engine and checks that these tests fail.
"""

import pytest
from scripted_models import scripted

from safe_engine.cli import build_parser
from safe_engine.contract.config import EnsembleConfig
from safe_engine.contract.errors import ConfigError
from safe_engine.contract.events import EnsemblePoint, PositionVerified, RunStarted, TextCommitted, TokensDrafted
from safe_engine.strategies.decoding import DecodeConfig, decode

P = "Q:"
LETTERS = list("abcdefghijklmnopqrstuvwxyz")


def run(models, **config):
    return list(decode(models, P, DecodeConfig(**config)))


def checks(events) -> list[tuple[str, str, str | None]]:
    return [(e.token, e.decision, e.reason) for e in events if isinstance(e, PositionVerified)]


def commits(events) -> list[list[str]]:
    return [[t.text for t in e.tokens] for e in events if isinstance(e, TextCommitted)]


def drafts(events) -> list[list[str]]:
    return [[t.text for t in e.tokens] for e in events if isinstance(e, TokensDrafted)]


def points(events) -> list[EnsemblePoint]:
    return [e for e in events if isinstance(e, EnsemblePoint)]


def text(events) -> str:
    return events[-1].text


def pair(drafter: dict, verifier: dict, pieces=()):
    """A drafter and a verifier over the same tiny vocabulary (single letters, plus `pieces`)."""
    return scripted("a", list(pieces), drafter, P), scripted("b", list(pieces), verifier, P)


# ---------------------------------------------------------------- rule 1: stability (OOV-like)
INCORRECT_DRAFTER = {"": {"Inc": 1.0}, "Inc": {"orr": 1.0}, "Incorr": {"ect": 1.0}, "Incorrect": {"!": 0.6, "?": 0.4}}
INCORRECT_VERIFIER = {"": {"Incorrect": 0.9}, "Incorrect": {"?": 0.8, "!": 0.2}}


@pytest.fixture(scope="module")
def incorrect():
    """The paper's example: the drafter writes Inc|orr|ect, the verifier has one token Incorrect."""
    return (
        scripted("a", ["Inc", "orr", "ect", "!", "?"], INCORRECT_DRAFTER, P),
        scripted("b", ["Incorrect", "!", "?"], INCORRECT_VERIFIER, P),
    )


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_ensembling_needs_the_boundary_before_the_drafted_token(incorrect, mode):
    events = run(incorrect, safe_mode=mode)
    # "orr" and "ect" start where the verifier has no boundary (after "Inc", after "Incorr"): never
    # ensembled, although the verifier disagrees; "!" starts after "Incorrect": ensembled and replaced.
    assert checks(events)[:4] == [
        ("Inc", "skipped-consensus", "unanimity"),
        ("orr", "skipped-oov", "boundary missing for b"),
        ("ect", "skipped-oov", "boundary missing for b"),
        ("!", "ensembled", "no consensus"),
    ]
    assert text(events) == "Incorrect?"
    assert events[-1].stats["oov_skips"] == {"b": 2}


@pytest.fixture(scope="module")
def three(incorrect):
    """A third model that splits like the drafter: only the verifier "b" lacks the inner boundaries."""
    like_drafter = {"": {"Inc": 0.9}, "Inc": {"orr": 0.9}, "Incorr": {"ect": 0.9}, "Incorrect": {"?": 0.8, "!": 0.2}}
    return [*incorrect, scripted("c", ["Inc", "orr", "ect", "!", "?"], like_drafter, P)]


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_a_position_is_safe_only_when_it_is_safe_for_every_verifier(three, mode):
    events = run(three, safe_mode=mode)
    blocked = [e for e in events if isinstance(e, PositionVerified) and e.token == "orr"][0]
    assert (blocked.decision, blocked.reason) == ("skipped-oov", "boundary missing for b")
    b, c = blocked.verifiers
    assert (b.model, b.oov_like) == ("b", True)
    assert (c.model, c.oov_like, c.token, c.p) == ("c", False, "orr", None)  # c has the boundary; nothing was scored
    committed = [t for e in events if isinstance(e, TextCommitted) for t in e.tokens]
    assert [t.oov_like_for for t in committed[1:3]] == [["b"], ["b"]]
    assert events[-1].stats["oov_skips"] == {"b": 2, "c": 0}
    assert text(events) == "Incorrect?"


def test_unanimity_needs_every_verifier():
    """b's argmax is its own token, c's is not: no unanimity, and the mean p (0.283) is below ½."""
    agree = {"": {"x": 0.3, "y": 0.25, "z": 0.25, "w": 0.2}}
    a, b = scripted("a", [], agree, P), scripted("b", [], agree, P)
    c = scripted("c", [], {"": {"y": 0.3, "x": 0.25, "z": 0.25, "w": 0.2}}, P)
    assert checks(run([a, b, c]))[0] == ("x", "ensembled", "no consensus")
    assert checks(run([a, b, b]))[0] == ("x", "skipped-consensus", "unanimity")


# ---------------------------------------------------------------- rule 2: need (consensus)
def test_unanimity_keeps_the_draft_even_when_mean_p_is_below_half():
    a, b = pair(
        {"": {"x": 0.3, "y": 0.25, "z": 0.25, "w": 0.2}, "x": {"y": 0.3, "z": 0.25, "w": 0.25, "x": 0.2}},
        {"": {"x": 0.3, "y": 0.25, "z": 0.25, "w": 0.2}, "x": {"z": 0.3, "y": 0.25, "w": 0.25, "x": 0.2}},
    )
    events = run([a, b])
    first, second = [e for e in events if isinstance(e, PositionVerified)][:2]
    assert (first.token, first.decision, first.reason) == ("x", "skipped-consensus", "unanimity")
    assert first.mean_p == pytest.approx(0.3)
    # Same probabilities of their own tokens, but the verifier's argmax is another token: ensembled.
    assert (second.token, second.decision) == ("y", "ensembled")


def test_mean_above_half_is_strict_and_half_is_not_sharpened():
    a, b = pair({"": {"x": 1.0}, "x": {"z": 0.9, "y": 0.1}}, {"": {"y": 1.0}, "x": {"z": 0.2, "w": 0.8}})
    events = run([a, b])
    at_half, above = [e for e in events if isinstance(e, PositionVerified)][:2]
    assert at_half.mean_p == 0.5 and at_half.decision == "ensembled"  # (1.0 + 0.0) / 2 is not above ½
    assert points(events)[0].sharpening is None  # the ensemble's max is exactly ½: not too smooth
    assert (above.token, above.decision, above.reason) == ("z", "skipped-consensus", "mean>0.5")
    assert above.mean_p == pytest.approx(0.55)


WEIGHTED_DRAFTER = {"": {"x": 0.9, "y": 0.1}}
WEIGHTED_VERIFIER = {"": {"y": 0.8, "x": 0.2}}


def test_the_consensus_threshold_is_weighted():
    a, b = pair(WEIGHTED_DRAFTER, WEIGHTED_VERIFIER)
    equal = checks(run([a, b]))[0]
    assert equal == ("x", "skipped-consensus", "mean>0.5")  # (0.9 + 0.2) / 2 = 0.55
    weighted = [e for e in run([a, b], ensemble=EnsembleConfig(weights=(0.3, 0.7))) if isinstance(e, PositionVerified)][
        0
    ]
    assert weighted.decision == "ensembled" and weighted.mean_p == pytest.approx(0.3 * 0.9 + 0.7 * 0.2)


def test_the_consensus_threshold_is_the_runs_and_strict():
    """mean p = 0.55 here: kept at the default ½ and at 0.54, ensembled at exactly 0.55 (strict) and above; a
    lower threshold keeps a draft that ½ ensembles (mean p 0.5)."""
    a, b = pair(WEIGHTED_DRAFTER, WEIGHTED_VERIFIER)
    assert checks(run([a, b], consensus_threshold=0.54))[0] == ("x", "skipped-consensus", "mean>0.5")
    for threshold in (0.55, 0.7):
        assert checks(run([a, b], consensus_threshold=threshold))[0] == ("x", "ensembled", "no consensus")
    c, d = pair({"": {"x": 1.0}, "x": {"z": 0.9, "y": 0.1}}, {"": {"y": 1.0}, "x": {"z": 0.2, "w": 0.8}})
    assert checks(run([c, d], consensus_threshold=0.4))[0] == ("x", "skipped-consensus", "mean>0.5")


def test_the_consensus_threshold_is_an_option_at_half_by_default():
    args = build_parser().parse_args(["generate", "--prompt", "x"])
    assert DecodeConfig().consensus_threshold == args.consensus_threshold == 0.5
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ConfigError, match="consensus threshold"):
            DecodeConfig(consensus_threshold=bad).validate(2)


def test_weights_belong_to_models_not_to_roles():
    a, b = pair(WEIGHTED_DRAFTER, WEIGHTED_VERIFIER)
    # b is listed first and weighs 0.7; a drafts. By role the drafter would get 0.7 and skip (0.69 > ½).
    events = run([b, a], drafter=1, ensemble=EnsembleConfig(weights=(0.7, 0.3)))
    started = events[0]
    assert isinstance(started, RunStarted)
    assert [(m["name"], m["role"], m["weight"]) for m in started.models] == [
        ("a", "drafter", pytest.approx(0.3)),
        ("b", "verifier", pytest.approx(0.7)),
    ]
    first = [e for e in events if isinstance(e, PositionVerified)][0]
    assert first.decision == "ensembled" and first.mean_p == pytest.approx(0.41)
    assert points(events)[0].chosen == "y"  # 0.3·0.1 + 0.7·0.8 for y against 0.3·0.9 + 0.7·0.2 for x


# ---------------------------------------------------------------- what a round commits
KEPT = {  # at "a" the verifier disagrees, but the ensemble keeps the drafter's "b"
    "drafter": {"": {"a": 1.0}, "a": {"b": 0.6, "c": 0.4}, "ab": {"d": 1.0}, "abd": {"e": 1.0}, "abde": {"f": 1.0}},
    "verifier": {
        "": {"a": 1.0},
        "a": {"c": 0.45, "b": 0.35, "e": 0.2},
        "ab": {"d": 1.0},
        "abd": {"e": 1.0},
        "abde": {"f": 1.0},
    },
}


def test_exact_mode_drops_the_draft_after_an_ensemble_that_kept_the_token():
    a, b = pair(KEPT["drafter"], KEPT["verifier"])
    events = run([a, b], safe_mode="exact")
    assert drafts(events)[0] == ["a", "b", "d", "e", "f"]
    assert points(events)[0].changed is False
    assert commits(events)[0] == ["a", "b"]  # one ensemble per round; "d e f" are drafted again
    assert drafts(events)[1][:3] == ["d", "e", "f"]
    assert text(events) == "abdef"


def test_fast_mode_keeps_scanning_a_draft_the_ensemble_confirmed():
    a, b = pair(KEPT["drafter"], KEPT["verifier"])
    events = run([a, b], safe_mode="fast")
    assert commits(events)[0] == ["a", "b", "d", "e", "f"]
    assert text(events) == "abdef"


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_a_replacement_drops_the_rest_of_the_draft(mode):
    a, b = pair(
        {"": {"a": 1.0}, "a": {"b": 0.55, "c": 0.45}, "ab": {"d": 1.0}, "abd": {"e": 1.0}, "ac": {"g": 1.0}},
        {"": {"a": 1.0}, "a": {"c": 0.9, "b": 0.1}, "ac": {"g": 1.0}},
    )
    events = run([a, b], safe_mode=mode)
    assert drafts(events)[0] == ["a", "b", "d", "e", "<eos>"]
    assert commits(events)[0] == ["a", "c"]
    replaced = [e for e in events if isinstance(e, TextCommitted)][0].tokens[1]
    assert (replaced.decision, replaced.drafted) == ("ensembled", "b")
    assert drafts(events)[1][0] == "g"
    assert text(events) == "acg"


def test_eos_ends_a_draft():
    a, b = pair({"": {"a": 1.0}}, {"": {"a": 1.0}})
    events = run([a, b], lookahead=5)
    assert drafts(events) == [["a", "<eos>"]]
    assert events[-1].stop_reason == "eos" and events[-1].stats["tokens"] == 2 and text(events) == "a"


# ---------------------------------------------------------------- defaults: n = 5, k = 10
def descending(letters: str) -> dict[str, float]:
    weights = range(len(letters), 0, -1)
    return {c: w / sum(weights) for c, w in zip(letters, weights)}


def test_defaults_are_the_papers_n5_and_k10_with_the_measured_draft_gate():
    config, cli = DecodeConfig(), build_parser().parse_args(["generate", "--prompt", "x"])
    assert (config.lookahead, config.ensemble.top_k, config.safe_mode, config.draft_gate) == (5, 10, "exact", 0.3)
    assert (cli.lookahead, cli.top_k, cli.safe_mode, cli.draft_gate) == (5, 10, "exact", 0.3)
    chain = {
        "": descending("abcdefghijkl"),
        "a": {"b": 1.0},
        "ab": {"c": 1.0},
        "abc": {"d": 1.0},
        "abcd": {"e": 1.0},
        "abcde": {"f": 1.0},
    }
    a, b = pair(chain, {"": descending("mnopqrstuvwx")})
    events = run([a, b], draft_gate=0.0)  # the paper's loop: full drafts
    assert drafts(events)[0] == ["a", "b", "c", "d", "e"]
    assert drafts(run([a, b]))[0] == ["a"]  # the default gate: "a" was drafted with p < 0.3
    assert {row.text for row in points(events)[0].table} == set("abcdefghij") | set("mnopqrstuv")


# ---------------------------------------------------------------- sharpening
def test_sharpening_runs_when_the_ensemble_is_too_smooth():
    # Ensemble before sharpening: a .275, ab .325, c .4 (max < ½); the drafter's "a" absorbs "ab".
    a, b = pair(
        {"": {"a": 0.45, "ab": 0.35, "c": 0.2}, "a": {"x": 1.0}},
        {"": {"c": 0.6, "ab": 0.3, "a": 0.1}, "a": {"x": 1.0}},
        pieces=["ab"],
    )
    point = points(run([a, b]))[0]
    assert point.sharpening == "heuristic" and point.chosen == "a"
    rows = {row.text: row for row in point.table}
    assert rows["a"].after == pytest.approx(0.6) and rows["c"].before == pytest.approx(0.4)
    assert points(run([a, b], ensemble=EnsembleConfig(sharpen="none")))[0].chosen == "c"


def test_geometric_sharpening_is_the_geometric_mean():
    # Arithmetic: x .455, y .3, z .245; geometric: x √.009, y √.05, z 0.
    a, b = pair({"": {"x": 0.9, "y": 0.1}}, {"": {"y": 0.5, "z": 0.49, "x": 0.01}})
    geometric = points(run([a, b], ensemble=EnsembleConfig(sharpen="geometric")))[0]
    assert (geometric.sharpening, geometric.chosen, geometric.changed) == ("geometric", "y", True)
    assert points(run([a, b], ensemble=EnsembleConfig(sharpen="heuristic")))[0].chosen == "x"


# ---------------------------------------------------------------- rule 3: GaC's gate
GATE_DRAFTER = {"": {"x": 0.6, "y": 0.4}}
GATE_VERIFIER = {"": {"y": 0.9, "x": 0.1}}


@pytest.mark.parametrize("strategy", ["safe", "per-token"])
def test_gac_ensembles_only_where_the_drafter_is_unsure(strategy):
    a, b = pair(GATE_DRAFTER, GATE_VERIFIER)
    gated = run([a, b], strategy=strategy, ensemble=EnsembleConfig(method="gac"))
    first = [t for e in gated if isinstance(e, TextCommitted) for t in e.tokens][0]
    assert (first.text, first.decision, first.reason) == ("x", "skipped-consensus", "gate")
    assert gated[-1].stats["ensembled"] == 0 and gated[-1].stats["consensus_skips"]["gate"] >= 1
    for ungated in (EnsembleConfig(method="gac", gate=False), EnsembleConfig(method="unite")):
        first = [
            t
            for e in run([a, b], strategy=strategy, ensemble=ungated)
            if isinstance(e, TextCommitted)
            for t in e.tokens
        ][0]
        assert (first.text, first.decision) == ("y", "ensembled")


# ---------------------------------------------------------------- per-token ensembling (UniTE)
SOFIA = {  # the verifier's " Sofia" wins; the drafter spells it " So" + "fia"
    "drafter": {"": {" x": 0.6, " So": 0.4}, " So": {"fia": 0.45, "x": 0.55}},
    "verifier": {"": {" Sofia": 0.9, " x": 0.1}, " So": {"x": 1.0}},
}


@pytest.mark.parametrize("commit, first, final", [("first-subtoken", " So", " Sox"), ("full", " Sofia", " Sofia")])
def test_per_token_commits_the_drafters_first_subtoken_like_unite(commit, first, final):
    a = scripted("a", [" x", " So", "fia"], SOFIA["drafter"], P)
    b = scripted("b", [" x", " Sofia", "x"], SOFIA["verifier"], P)
    events = run([a, b], strategy="per-token", per_token_commit=commit, ensemble=EnsembleConfig(sharpen="none"))
    assert points(events)[0].chosen == " Sofia"
    assert commits(events)[0] == [first]
    assert text(events) == final  # UniTE's way leaves the verifier after " So": an OOV-like state


ACCENT = {  # the drafter spells "ễ" in three bytes; the verifier (weight 0.6) has it as one token
    "drafter": {"": {b"\xe1": 0.6, "n": 0.4}, b"\xe1": {b"\xbb": 1.0}, b"\xe1\xbb": {b"\x85": 1.0}, "ễ": {"n": 1.0}},
    "verifier": {"": {"ễ": 1.0}, "ễ": {"n": 1.0}},
}


@pytest.mark.parametrize("commit", ["first-subtoken", "full"])
def test_per_token_lets_the_drafter_finish_a_character(commit):
    a = scripted("a", ["n"], ACCENT["drafter"], P)
    b = scripted("b", ["ễ", "n"], ACCENT["verifier"], P)
    # Given the text with the started character held back, the verifier would predict all of "ễ" again.
    events = run([a, b], strategy="per-token", per_token_commit=commit, ensemble=EnsembleConfig(weights=(0.4, 0.6)))
    assert text(events) == "ễn" and "\ufffd" not in text(events)
    committed = [t for e in events if isinstance(e, TextCommitted) for t in e.tokens]
    inside = [t for t in committed if t.reason == "inside a character"]
    assert len(inside) == (2 if commit == "first-subtoken" else 0)
    assert all(t.decision == "skipped-oov" and t.oov_like_for == ["b"] for t in inside)


def test_safe_never_ensembles_inside_a_character():
    # A verifier that spells "ễ" in bytes too has boundaries inside it; they are still no place to ensemble.
    a = scripted("a", ["n"], ACCENT["drafter"], P)
    b = scripted("b", ["n"], {"": {b"\xe1": 0.9, "n": 0.1}, "ễ": {"n": 1.0}}, P)
    events = run([a, b])
    assert checks(events)[1:3] == [
        ("<0xBB>", "skipped-oov", "inside a character"),
        ("<0x85>", "skipped-oov", "inside a character"),
    ]
    assert text(events).startswith("ễ")


def test_a_special_token_without_text_is_never_ensembled():
    """The drafter emits a special token that spells nothing and is no end token: no verifier can see it."""
    a, b = pair({"": {"a": 1.0}, "a": {"<unk>": 0.6, "b": 0.4}}, {"": {"a": 1.0}, "a": {"b": 1.0}})
    events = run([a, b], max_new_tokens=5)
    assert checks(events)[1:] == [("<unk>", "skipped-oov", "a special token with no text")] * 4


def test_the_verdict_applies_the_rules_in_algorithm_1s_order():
    """Stability before need, need before GaC's gate, the gate before the acceptance draw (drawn only then)."""
    from safe_engine.contract.reasons import Decision, Reason
    from safe_engine.decisions.rules import Position, Verdict, verdict

    draws = []

    def accept(p):
        draws.append(p)
        return p > 0.5

    def at(**numbers):
        return Position(None, (1.0, 1.0), **({"own_ps": (0.2, 0.2), "agrees": (False,)} | numbers))

    never = Position(Reason.BOUNDARY_MISSING, drafter_top_p=0.9)
    assert verdict(never, True, True, accept, 0.5) == Verdict(Decision.SKIPPED_OOV, Reason.BOUNDARY_MISSING)
    unanimous = verdict(at(agrees=(True,), drafter_top_p=0.9), greedy=True, gated=True, accept=accept, threshold=0.5)
    assert (unanimous.reason, unanimous.mean_p) == (Reason.UNANIMITY, pytest.approx(0.2))  # need before the gate
    assert verdict(at(drafter_top_p=0.9), True, True, accept, 0.5).reason == Reason.GATE
    assert verdict(at(drafter_top_p=0.9), True, False, accept, 0.5).reason == Reason.NO_CONSENSUS
    assert verdict(at(agrees=(True,), drafter_top_p=0.9), False, True, accept, 0.5).reason == Reason.GATE and not draws
    kept = verdict(
        at(own_ps=(0.6, 0.6), agrees=(True,), drawn_p=0.8), greedy=False, gated=False, accept=accept, threshold=0.5
    )
    assert (kept.decision, kept.reason, kept.accept_p, draws) == (
        Decision.SKIPPED_CONSENSUS,
        Reason.ACCEPTED,
        pytest.approx(0.75),
        [pytest.approx(0.75)],
    )
    resampled = verdict(at(drawn_p=0.8), greedy=False, gated=False, accept=accept, threshold=0.5)
    assert (resampled.decision, resampled.reason, resampled.accept_p) == (
        Decision.ENSEMBLED,
        Reason.RESAMPLED,
        pytest.approx(0.25),
    )

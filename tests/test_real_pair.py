"""The strategies and the CLI end to end on the real embedded pair (Gemma drafts, SmolLM2 verifies)."""

import json

import pytest

from safe_engine.cli import main
from safe_engine.contract.events import (
    EVENT_TYPES,
    EnsemblePoint,
    PositionVerified,
    RunFinished,
    RunStarted,
    TextCommitted,
)
from safe_engine.strategies.decoding import DecodeConfig, decode

pytestmark = pytest.mark.real_models
PROMPT = "The capital of Madagascar is"


@pytest.fixture(scope="module")
def runs(embedded_pair):
    """Each strategy twice (determinism), SAFE in both modes."""
    out = {}
    for key, config in {
        "single": DecodeConfig(strategy="single", max_new_tokens=24),
        "per-token": DecodeConfig(strategy="per-token", max_new_tokens=24),
        "safe": DecodeConfig(strategy="safe", max_new_tokens=24),
        "safe-exact": DecodeConfig(strategy="safe", max_new_tokens=24, safe_mode="exact"),
    }.items():
        out[key] = [list(decode(embedded_pair, PROMPT, config)) for _ in range(2 if key != "safe-exact" else 1)]
    return out


@pytest.mark.parametrize("key", ["single", "per-token", "safe", "safe-exact"])
def test_runs_end_to_end_with_well_formed_events(runs, key):
    events = runs[key][0]
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    started = events[0]
    assert started.drafter == "gemma-3-270m" and set(started.prompts) >= {"gemma-3-270m"}
    if key != "single":
        assert "<|im_start|>" in started.prompts["smollm2-135m-instruct"]  # SmolLM2 uses its chat template
    for event in events:
        data = json.loads(event.to_json())
        assert set(data) >= {"kind"} and data["kind"] in EVENT_TYPES
    assert events[-1].text.strip()


def _decided(events) -> list[tuple]:
    """Each ensemble point's decision and the probability of its top candidate."""
    points = [e.to_dict() for e in events if isinstance(e, EnsemblePoint)]
    keys = ("round", "position", "drafted", "chosen", "changed", "method")
    return [(*(p[k] for k in keys), p["table"][0]["text"], p["table"][0]["before"]) for p in points]


@pytest.mark.parametrize("key", ["single", "per-token", "safe"])
def test_deterministic(runs, key):
    """The same tokens and decisions twice. Not the same floats: the second run adopts the first's prompt
    slot and feeds only the rest, so its passes have other shapes (the CPU linears pick their product by
    row count, attention by query count), and the default int8 head's logits are bf16, so probabilities
    move in their third or fourth digit."""
    first, second = runs[key]
    assert first[-1].text == second[-1].text
    assert [t.ids for e in first if isinstance(e, TextCommitted) for t in e.tokens] == [
        t.ids for e in second if isinstance(e, TextCommitted) for t in e.tokens
    ]
    a, b = _decided(first), _decided(second)
    assert [point[:-1] for point in a] == [point[:-1] for point in b]
    assert [point[-1] for point in a] == pytest.approx([point[-1] for point in b], abs=1e-2)


def test_ensemble_rates(runs):
    assert runs["per-token"][0][-1].stats["e_t"] == 1.0
    for key in ("safe", "safe-exact"):
        stats = runs[key][0][-1].stats
        assert 0 < stats["e_t"] < 1
        assert stats["forward"]["gemma-3-270m"]["passes"] >= stats["tokens"] * 0.8
    decisions = {e.decision for e in runs["safe"][0] if isinstance(e, PositionVerified)}
    assert "skipped-consensus" in decisions and "ensembled" in decisions


def test_cli_generate_json(embedded_pair, capsys):
    code = main(["generate", "--prompt", PROMPT, "--max-new-tokens", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {
        "text",
        "strategy",
        "models",
        "drafter",
        "tokens",
        "ensembled",
        "e_t",
        "oov_skips",
        "consensus_skips",
        "wall_s",
        "tokens_per_s",
    } <= set(out)
    assert out["models"] == ["gemma-3-270m", "smollm2-135m-instruct"] and out["tokens"] == 8


def test_cli_compare_json_and_trace(embedded_pair, capsys, tmp_path):
    code = main(["compare", "--prompt", PROMPT, "--max-new-tokens", "6", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    labels = [run["label"] for run in out["runs"]]
    assert labels == ["single:gemma-3-270m", "single:smollm2-135m-instruct", "per-token", "safe"]  # Gemma: no bytes
    assert out["ratios"]["single:gemma-3-270m"] == 1.0 and out["ratios"]["safe"] > 0
    trace = tmp_path / "run.jsonl"
    assert main(["generate", "--prompt", PROMPT, "--max-new-tokens", "4", "--trace", str(trace)]) == 0
    kinds = [json.loads(line)["kind"] for line in trace.read_text().splitlines()]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--prompt", ""], "prompt is empty"),
        (["generate", "--prompt", "x", "--models", "embedded:nope", "embedded:gemma-3-270m"], "unknown embedded model"),
        (["generate", "--prompt", "x", "--max-new-tokens", "0"], "max new tokens"),
        (["generate", "--prompt", "x", "--strategy", "beam"], "invalid choice"),
        (["compare"], "required"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0]


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_cli_three_models_in_both_modes(embedded_pair, capsys, mode):
    """The issue's command: Gemma drafts, two SmolLM2 verifiers (each with its own session)."""
    argv = [
        "generate",
        "--models",
        "embedded:gemma-3-270m",
        "embedded:smollm2-135m-instruct",
        "embedded:smollm2-135m-instruct",
        "--strategy",
        "safe",
        "--safe-mode",
        mode,
        "--max-new-tokens",
        "12",
        "--prompt",
        PROMPT,
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["models"] == ["gemma-3-270m", "smollm2-135m-instruct", "smollm2-135m-instruct#2"]
    assert set(out["oov_skips"]) == {"smollm2-135m-instruct", "smollm2-135m-instruct#2"} and out["tokens"] == 12

"""Reasons are codes: every one has its sentence, reads back from code or (older traces) sentence, and the UI
explains each by its code; no layer above the engine spells a reason's sentence."""

import ast
from pathlib import Path

import pytest

from safe_engine.contract.reasons import Decision, Reason, StopReason
from safe_engine.pages.transcript import EXPLAINED, why
from safe_engine.pages.view import RunView, TokenView

ROOT = Path(__file__).resolve().parents[1]
DECISION_OF = {
    Reason.UNANIMITY: Decision.SKIPPED_CONSENSUS,
    Reason.MEAN: Decision.SKIPPED_CONSENSUS,
    Reason.GATE: Decision.SKIPPED_CONSENSUS,
    Reason.ACCEPTED: Decision.SKIPPED_CONSENSUS,
    Reason.NO_CONSENSUS: Decision.ENSEMBLED,
    Reason.RESAMPLED: Decision.ENSEMBLED,
    Reason.INSIDE_CHARACTER: Decision.SKIPPED_OOV,
    Reason.NO_TEXT: Decision.SKIPPED_OOV,
    Reason.BOUNDARY_MISSING: Decision.SKIPPED_OOV,
    Reason.BYTE_LEVEL: Decision.ENSEMBLED,
}


def _token(reason: str | None, decision: str) -> TokenView:
    verify = {"mean_p": 0.25, "accept_p": 0.5}
    return TokenView(0, 1, "x", 0, 1, False, decision, None, reason, False, ["m2"], False, verify=verify)


def test_every_reason_reads_back_from_its_code_and_from_its_sentence():
    assert set(DECISION_OF) == set(Reason)
    for reason in Reason:
        assert Reason.parse(reason.value) is reason and Reason.parse(reason.text(["m2", "m3"])) is reason
    assert Reason.BOUNDARY_MISSING.text(["m2", "m3"]) == "boundary missing for m2, m3"
    assert Reason.parse(None) is None and Reason.parse("a sentence no run ever wrote") is None
    assert len({reason.text() for reason in Reason}) == len(Reason)


def test_the_ui_explains_every_reason_by_its_code_and_old_traces_by_their_sentence():
    view = RunView(started={"strategy": "safe"})
    sentences = {}
    for reason in Reason:
        decision = DECISION_OF[reason]
        sentence = why(_token(reason.value, decision), view)
        assert sentence == why(_token(reason.text(["m2"]), decision), view), reason  # an older trace
        assert sentence.startswith(EXPLAINED[reason].split("{")[0]), reason
        sentences[reason] = sentence
    assert len(set(sentences.values())) == len(Reason)
    assert "OOV-like for m2" in sentences[Reason.BOUNDARY_MISSING] and "0.25" in sentences[Reason.MEAN]
    assert "0.50" in sentences[Reason.ACCEPTED]


@pytest.mark.parametrize("folder", ["components", "app.py"])
def test_no_layer_above_the_engine_spells_a_reason_sentence_or_the_byte_display(folder):
    """String constants in the UI never hold a reason's sentence, so nothing there can match one."""
    sentences = {reason.text() for reason in Reason} - {reason.value for reason in Reason}
    sentences.add(Reason.BOUNDARY_MISSING.text().strip())
    paths = [ROOT / folder] if folder.endswith(".py") else sorted((ROOT / folder).glob("*.py"))
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in sentences, f"{path.name}:{node.lineno} matches the prose {node.value!r}"
                assert "<0x" not in node.value, f"{path.name}:{node.lineno} parses the <0xNN> display"


def test_stop_reasons_keep_the_values_every_trace_carries():
    assert [r.value for r in StopReason] == ["eos", "stop", "max_new_tokens", "stopped"]

"""Our bench's scorers against the maintained libraries on every shipped and test row: math-verify for MATH
answers, lm-eval's GSM8K filters (flexible-extract / strict-match + exact_match). They agree everywhere but
in two GSM8K answer forms, pinned here with the reason: the difference is the scorer's, by design."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("math_verify")

from lm_eval.api.metrics import exact_match_hf_evaluate  # noqa: E402
from lm_eval.filters.extraction import RegexFilter  # noqa: E402

from safe_engine.bench import builtin_tasks, load_task, score  # noqa: E402
from safe_engine.integrations.lm_eval_tasks import utils  # noqa: E402

DATA = utils.DATA
TEST_ROW_GOLDS = ["0.5", "\\frac{14}{3}", "-3/4", "\\left( 3, \\frac{\\pi}{2} \\right)", "1250", "72"]  # test_bench.py
NUMERIC_GOLDS = [e.gold for name in builtin_tasks() for e in load_task(name) if e.scorer == "numeric"]
MATH_GOLDS = NUMERIC_GOLDS + [json.loads(line)["answer"] for line in open(DATA / "math500_sample.jsonl")]
GSM8K_GOLDS = NUMERIC_GOLDS + [
    json.loads(line)["answer"].split("####")[-1].strip() for line in open(DATA / "gsm8k_sample.jsonl")
]


@pytest.mark.parametrize("gold", MATH_GOLDS + TEST_ROW_GOLDS)
def test_math_verify_and_our_numeric_scorer_agree(gold):
    for response, right in [(f"So the answer is $\\boxed{{{gold}}}$.", True), ("It is $\\boxed{999}$.", False)]:
        ours = score("numeric", response, gold)[1]
        assert ours == utils.math_equal(f"${gold}$", response) == right


def test_math_verify_runs_under_our_time_limit_off_the_main_thread(monkeypatch):
    monkeypatch.setattr(utils, "verify", lambda *args, **kwargs: time.sleep(5) or True)
    started = time.perf_counter()
    assert utils.math_equal("$1$", "1", limit_s=0.2) is False  # an overrun counts as wrong
    assert time.perf_counter() - started < 2


FLEXIBLE = RegexFilter(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select=-1)  # gsm8k_cot's flexible-extract
STRICT = RegexFilter(r"The answer is (\-?[0-9\.\,]+).")  # its strict-match
IGNORED = [",", "\\$", "(?s).*#### ", "\\.$"]  # its exact_match settings


def lm_eval_gsm8k(response: str, gold: str, extractor=FLEXIBLE) -> bool:
    extracted = extractor.apply([[response]], [{}])[0][0]
    return bool(
        exact_match_hf_evaluate([extracted], [gold], regexes_to_ignore=IGNORED, ignore_case=True)["exact_match"]
    )


@pytest.mark.parametrize("gold", GSM8K_GOLDS)
def test_lm_evals_gsm8k_filters_and_our_numeric_scorer(gold):
    wrong = str(int(gold) + 1)
    agree = [f"The answer is {gold}.", f"We get {gold}", f"${gold}", f"so 2 + 2 = 4 and then {gold}.", wrong]
    for response in agree:
        assert score("numeric", response, gold)[1] == lm_eval_gsm8k(response, gold), response
    # Ours compares numbers, lm-eval strings: "12.0" is 12 for us, not for exact_match.
    assert score("numeric", f"It is {gold}.0", gold)[1] and not lm_eval_gsm8k(f"It is {gold}.0", gold)
    # Ours reads the stated answer; flexible-extract the last number (its strict-match reads the stated one).
    stated = f"The answer is {gold}. Next, 5 apples"
    assert score("numeric", stated, gold)[1] and lm_eval_gsm8k(stated, gold, STRICT)
    assert lm_eval_gsm8k(stated, gold) == (gold == "5")

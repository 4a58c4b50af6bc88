"""lm-evaluation-harness's `safe-ensemble` model: the front door, simple_evaluate with an instance, offline tasks
(ours and a user's own YAML), loglikelihood against hand-computed values, edge cases, provenance."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.tasks import TaskManager  # noqa: E402
from scripted_models import scripted  # noqa: E402
from tiny_models import EOS  # noqa: E402
from tiny_pair import tiny_pair_folders  # noqa: E402

from safe_engine import cli  # noqa: E402
from safe_engine.bench import load_task, run_example  # noqa: E402
from safe_engine.contract.config import DecodeConfig  # noqa: E402
from safe_engine.contract.errors import ConfigError  # noqa: E402
from safe_engine.integrations import LM_EVAL_TASKS_DIR, likelihood  # noqa: E402
from safe_engine.integrations.lm_eval import CHAT_PREFIX, SafeEnsembleLM, with_shipped_tasks  # noqa: E402

TASKS = str(LM_EVAL_TASKS_DIR)


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return tiny_pair_folders(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def lm(specs, tmp_path_factory):
    return SafeEnsembleLM(models="|".join(specs), strategy="safe", lookahead=3)


@pytest.fixture(scope="module")
def users_folder(tmp_path_factory):
    """A user's own task: their YAML over their local JSONL, in a folder of theirs."""
    folder = tmp_path_factory.mktemp("mine")
    rows = [{"q": "What is 1 + 1?", "a": "2"}, {"q": "What is 2 + 1?", "a": "3"}]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / "mine.yaml").write_text(
        "task: my_sums\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {folder / 'rows.jsonl'}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: 'Q: {{q}}\\nA:'\ndoc_to_target: '{{a}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 4\n"
        "metric_list:\n  - metric: exact_match\n",
        encoding="utf-8",
    )
    return folder


@pytest.fixture(scope="module")
def task_manager(users_folder):
    return TaskManager(include_path=[TASKS, str(users_folder)])  # indexing every task takes seconds: once


def _request(kind, args, doc_id=0):
    return SimpleNamespace(args=args, request_type=kind, task_name="t", doc_id=doc_id, idx=0)


# ---------------------------------------------------------------- the front door and simple_evaluate
@pytest.mark.parametrize("strategy", ["per-token"])  # all three run on the embedded pair below
def test_front_door_prints_the_results_table(strategy, specs, capsys):
    argv = [
        "lm-eval",
        "run",
        "--model",
        "safe-ensemble",
        "--model_args",
        f"models={'|'.join(specs)},strategy={strategy}",
    ]
    argv += ["--tasks", "safe_gsm8k_cot", "--include_path", TASKS, "--limit", "2", "--num_fewshot", "0"]
    assert cli.main(argv + ["--gen_kwargs", "max_gen_toks=6"]) == 0
    out = capsys.readouterr().out
    assert "|safe_gsm8k_cot|" in out and "flexible-extract" in out and "exact_match" in out
    assert f"strategy={strategy}" in out or f"'strategy': '{strategy}'" in out


def test_registering_keeps_lm_evals_own_models():
    from lm_eval.api.registry import get_model

    assert get_model("safe-ensemble") is SafeEnsembleLM
    assert get_model("local-completions").__name__ == "LocalCompletionsAPI"  # lm-eval fills only an empty registry


def test_bad_model_args_fail_with_the_cli_message(specs):
    with pytest.raises(cli.UsageError, match="argument --lookahead: invalid int value: 'x'"):
        SafeEnsembleLM.create_from_arg_string(f"models={'|'.join(specs)},lookahead=x")
    with pytest.raises(cli.UsageError, match="unknown decoding option 'lookahed'"):
        SafeEnsembleLM.create_from_arg_string(f"models={'|'.join(specs)},lookahed=3")


def test_simple_evaluate_with_an_instance_runs_generation_and_multiple_choice(lm, task_manager, tmp_path):
    lm.provenance_file = str(tmp_path / "provenance.jsonl")
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["safe_arithmetic", "safe_arc_challenge"],
        limit=2,
        task_manager=task_manager,
        gen_kwargs="max_gen_toks=5",
    )
    assert set(results["results"]["safe_arc_challenge"]) >= {"acc,none", "acc_norm,none"}
    assert "bench_correct,none" in results["results"]["safe_arithmetic"]
    lines = [json.loads(line) for line in (tmp_path / "provenance.jsonl").read_text().splitlines()]
    generated = [line for line in lines if line["type"] == "generate_until"]
    assert sorted(line["doc_id"] for line in generated) == [0, 1]  # keyed by doc id
    first = generated[0]
    assert {"e_t", "ensembled", "replaced", "time_split", "stop_reason"} <= first.keys()
    assert set(first["oov_skips"]) == {"tiny-gemma"}  # per verifier
    assert set(first["consensus_skips"]) == {"unanimity", "mean", "gate", "accepted"}  # by reason
    scored = [line for line in lines if line["type"] == "loglikelihood"]
    assert len(scored) == sum(len(d["choices"]["text"]) for d in _arc_docs()[:2])
    for line in scored:  # every choice's ensemble score is the weighted mixture of the models' own scores
        per_model = line["per_model"].values()
        mixture = math.log(sum(0.5 * math.exp(m["logprob"]) for m in per_model))
        assert line["logprob"] == pytest.approx(mixture)
        assert line["greedy"] == all(m["greedy"] for m in per_model)


def _arc_docs():
    path = f"{TASKS}/data/arc_sample.jsonl"
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_a_users_own_yaml_over_local_jsonl(lm, task_manager):
    results = lm_eval.simple_evaluate(model=lm, tasks=["my_sums"], task_manager=task_manager)
    assert results["results"]["my_sums"]["exact_match,none"] in (0.0, 0.5, 1.0)
    assert len(results["samples"]["my_sums"]) == 2


# ---------------------------------------------------------------- loglikelihood, by hand
CONTEXT = "Capital:"


@pytest.fixture
def scripted_pair():
    # The first model spells " Paris" as one token, the second as " Par" + "is".
    first = scripted("one", [" Paris", " Rome"], {"": {" Paris": 0.6, " Rome": 0.4}}, CONTEXT)
    second = scripted("two", [" Par", "is", " Rome"], {"": {" Par": 0.8, " Rome": 0.2}, " Par": {"is": 0.5}}, CONTEXT)
    return first, second


def test_each_model_scores_under_its_own_tokenization(scripted_pair):
    first, second = scripted_pair
    ctx1, cont1 = likelihood.encode_pair(first, CONTEXT, " Paris")
    ctx2, cont2 = likelihood.encode_pair(second, CONTEXT, " Paris")
    assert (len(cont1), len(cont2)) == (1, 2)
    one, two = likelihood.score(first, ctx1, cont1), likelihood.score(second, ctx2, cont2)
    assert one.logprob == pytest.approx(math.log(0.6)) and one.greedy
    assert two.logprob == pytest.approx(math.log(0.8 * 0.5)) and two.greedy
    logprob, greedy = likelihood.combine([one, two], [1.0, 3.0])
    assert logprob == pytest.approx(math.log(0.25 * 0.6 + 0.75 * 0.4)) and greedy


def test_greedy_is_combined_conservatively(scripted_pair):
    first, second = scripted_pair
    scores = [likelihood.score(m, *likelihood.encode_pair(m, CONTEXT, " Rome")) for m in scripted_pair]
    assert [s.logprob for s in scores] == pytest.approx([math.log(0.4), math.log(0.2)])
    assert likelihood.combine(scores, [1.0, 1.0]) == (pytest.approx(math.log(0.3)), False)


def test_trailing_space_of_the_context_moves_into_the_continuation(scripted_pair):
    first, _ = scripted_pair
    assert likelihood.encode_pair(first, CONTEXT + " ", "Paris") == likelihood.encode_pair(first, CONTEXT, " Paris")


def test_empty_continuation_has_probability_one_and_empty_context_conditions_on_the_prefix(scripted_pair):
    first, _ = scripted_pair
    assert likelihood.score(first, *likelihood.encode_pair(first, CONTEXT, "")) == likelihood.Scored(0.0, True, 0)
    ctx, cont = likelihood.encode_pair(first, "", "Capital:")
    assert ctx == [first.tokenizer.convert_tokens_to_ids(EOS)]  # no BOS in this vocabulary: its end token
    assert first.tokenizer.decode(cont) == "Capital:"


def test_loglikelihood_edge_cases_on_the_lm(lm):
    over = "the answer " * 400  # over the tiny models' 512-token context: the context keeps its last tokens
    results = lm.loglikelihood([_request("loglikelihood", (over, " is")), _request("loglikelihood", ("Q:", ""))])
    assert math.isfinite(results[0][0]) and results[1] == (0.0, True)
    with pytest.raises(ConfigError, match="the continuation alone is .* over its context of 512"):
        lm.loglikelihood([_request("loglikelihood", ("Q:", " the" * 600))])
    (rolling,) = lm.loglikelihood_rolling([_request("loglikelihood_rolling", ("the answer is " * 100,))])
    assert math.isfinite(rolling) and rolling < 0


def test_generation_refuses_a_context_over_the_window_before_running(lm):
    request = _request("generate_until", ("the answer " * 400, {"until": ["\n"], "max_gen_toks": 8}), doc_id=7)
    with pytest.raises(ConfigError, match="t doc 7: the prompt is .* exceeds the model's context of 512"):
        lm.generate_until([request])


def test_chat_path_refuses_an_assistant_prefill(lm):
    with pytest.raises(ConfigError, match="cannot prefill"):
        lm.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False)


def test_until_is_cut_off_and_generation_is_deterministic(lm):
    requests = [_request("generate_until", ("Q: the", {"until": ["e"], "max_gen_toks": 12, "do_sample": False}))] * 3
    texts = lm.generate_until(requests)
    assert len(set(texts)) == 1 and "e" not in texts[0].lstrip()


# ---------------------------------------------------------------- the same rows through the bench and lm-eval
@pytest.mark.real_models
def test_bench_and_lm_eval_generate_the_same_text_item_by_item(embedded_pair):
    config = DecodeConfig(strategy="safe", max_new_tokens=16)
    model = SafeEnsembleLM(models="embedded:gemma-3-270m|embedded:smollm2-135m-instruct", strategy="safe")
    examples = load_task("facts", limit=2)
    from safe_engine.integrations.lm_eval_tasks import utils as task_utils

    docs = list(task_utils.bench_dataset("facts")["test"])[:2]
    requests = [
        _request(
            "generate_until",
            (
                model.apply_chat_template([{"role": "user", "content": d["prompt"]}]),
                {"until": ["\n"], "max_gen_toks": 16},
            ),
            doc_id=i,
        )
        for i, d in enumerate(docs)
    ]
    assert all(r.args[0].startswith(CHAT_PREFIX) for r in requests)
    texts = model.generate_until(requests)
    bench = [run_example(e, "safe", embedded_pair, config, "direct") for e in examples]
    assert [t.strip() for t in texts] == [b["prediction"].strip() for b in bench]
    assert [task_utils.process_bench(d, [t])["bench_correct"] for d, t in zip(docs, texts)] == [
        int(b["correct"]) for b in bench
    ]


@pytest.mark.real_models
@pytest.mark.parametrize("strategy", ["safe", "per-token", "single"])
def test_front_door_on_the_embedded_pair(strategy, embedded_pair, capsys):
    args = f"models=embedded:gemma-3-270m|embedded:smollm2-135m-instruct,strategy={strategy}"
    argv = ["lm-eval", "run", "--model", "safe-ensemble", "--model_args", args, "--tasks", "safe_gsm8k_cot"]
    assert cli.main(argv + ["--include_path", TASKS, "--limit", "1", "--gen_kwargs", "max_gen_toks=8"]) == 0
    assert "|safe_gsm8k_cot|" in capsys.readouterr().out


def test_the_front_door_includes_the_shipped_tasks_unless_told_another_folder():
    shipped = ["--include_path", str(LM_EVAL_TASKS_DIR)]
    assert with_shipped_tasks(["ls", "tasks"]) == ["ls", "tasks", *shipped]
    assert with_shipped_tasks(["run", "--tasks", "safe_facts"]) == ["run", "--tasks", "safe_facts", *shipped]
    assert with_shipped_tasks(["--tasks", "safe_facts"]) == ["--tasks", "safe_facts", *shipped]  # lm-eval adds run
    for own in (["run", "--include_path", "mine"], ["ls", "tasks", "--include_path=mine"]):
        assert with_shipped_tasks(own) == own
    assert with_shipped_tasks(["run"]) == ["run"]  # prints run's help
    assert {"safe_arithmetic.yaml", "utils.py", "_bench_template_yaml"} <= {p.name for p in LM_EVAL_TASKS_DIR.iterdir()}

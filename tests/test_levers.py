"""The speed levers and stop sequences are correct: what each one changes, and what it must not."""

import pytest
import torch
from scripted_models import EOS, scripted
from tiny_models import char_tokenizer, tiny_model, tiny_model_folder

from safe_engine.contract.events import TextCommitted, TokensDrafted
from safe_engine.models.loading import LoadOptions, load_model
from safe_engine.strategies.decoding import DecodeConfig, decode

P = "Q:"
ANSWER = {
    "": {"\n": 1.0},
    "\n": {" Par": 1.0},
    "\n Par": {"is": 1.0},
    "\n Paris": {"\nQ": 1.0},
    "\n Paris\nQ": {"uestion": 1.0},
    "\n Paris\nQuestion": {":": 1.0},
}
PIECES = ["\n", " Par", "is", "\nQ", "uestion", ":"]


def run(models, **config):
    return list(decode(models, P, DecodeConfig(**config)))


def committed(events):
    return [t.text for e in events if isinstance(e, TextCommitted) for t in e.tokens]


@pytest.mark.parametrize("strategy", ["single", "per-token", "safe"])
def test_a_stop_sequence_ends_the_run_right_after_it(strategy):
    a, b = scripted("a", PIECES, ANSWER, P), scripted("b", PIECES, ANSWER, P)
    models = [a] if strategy == "single" else [a, b]
    events = run(models, strategy=strategy, stop=("\n",))
    assert events[-1].stop_reason == "stop"
    assert events[-1].text == "\n Paris\n"  # the leading newline does not count; "\nQ" is cut after its "\n"
    assert committed(events) == ["\n", " Par", "is", "\nQ"]  # nothing is committed after the stop
    spanning = run(models, strategy=strategy, stop=("Paris",))
    assert spanning[-1].text == "\n Paris" and committed(spanning)[-1] == "is"
    assert run(models, strategy=strategy, stop=("nowhere",))[-1].stop_reason == "eos"


GATED = {
    "": {"a": 1.0},
    "a": {"b": 0.3, "c": 0.25, "d": 0.25, "e": 0.2},
    "ab": {"c": 1.0},
    "abc": {"d": 1.0},
    "abcd": {"e": 1.0},
    "abcde": {EOS: 1.0},
}


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_a_gated_round_never_drafts_past_a_low_probability_token(mode):
    a, b = scripted("a", [], GATED, P), scripted("b", [], GATED, P)
    drafts = [
        [t.text for t in e.tokens] for e in run([a, b], safe_mode=mode, draft_gate=0.5) if isinstance(e, TokensDrafted)
    ]
    assert drafts[0] == ["a", "b"]  # p(b) = 0.3 < 0.5: the round verifies what it has
    ungated = [
        [t.text for t in e.tokens] for e in run([a, b], safe_mode=mode, draft_gate=0.0) if isinstance(e, TokensDrafted)
    ]
    assert ungated[0] == ["a", "b", "c", "d", "e"]


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return [
        tiny_model(tmp_path_factory.mktemp("p0"), char_tokenizer(), seed=1),
        tiny_model(tmp_path_factory.mktemp("p1"), char_tokenizer(), seed=4),
    ]


@pytest.mark.alone
def test_a_gate_that_never_fires_is_the_ungated_loop(tiny_pair):
    plain = [e.to_dict() for e in decode(tiny_pair, "the cat", DecodeConfig(max_new_tokens=24, draft_gate=0.0))]
    never = [e.to_dict() for e in decode(tiny_pair, "the cat", DecodeConfig(max_new_tokens=24, draft_gate=1e-12))]
    strip = lambda events: [{k: v for k, v in e.items() if k not in ("elapsed_s", "stats", "config")} for e in events]  # noqa: E731
    assert strip(plain) == strip(never)


def test_int8_weights_load_and_decode_close_to_float(tmp_path):
    folder = tiny_model_folder(tmp_path / "m", char_tokenizer(), seed=1)
    fp32, int8 = load_model(str(folder)), load_model(str(folder), LoadOptions(cpu_int8=True))
    assert int8.describe()["dtype"] == "int8" and type(int8.model.lm_head).__module__.startswith(
        "torch.ao.nn.quantized"
    )
    ids = torch.tensor([fp32.encode_prompt("the cat sat")])
    with torch.inference_mode():
        p = torch.log_softmax(fp32.model(ids).logits[0, -1], -1)
        q = torch.log_softmax(int8.model(ids).logits[0, -1], -1)
    assert float((p.exp() * (p - q)).sum()) < 0.05
    for strategy in ("single", "per-token", "safe"):
        events = list(
            decode(
                [int8, fp32][: 1 if strategy == "single" else 2],
                "the cat",
                DecodeConfig(strategy=strategy, max_new_tokens=12),
            )
        )
        assert events[-1].stats["tokens"] == 12 or events[-1].stop_reason == "eos"


def test_warm_up_pays_the_once_per_process_costs(tmp_path):
    from safe_engine.orchestration.comparison import warm_up

    fresh = [
        load_model(str(tiny_model_folder(tmp_path / name, char_tokenizer(), seed=seed)))
        for name, seed in (("x", 1), ("y", 2))
    ]
    assert not any("id_of_bytes" in lm.vocab.__dict__ for lm in fresh)
    warm_up(fresh, DecodeConfig(max_new_tokens=8))
    assert all(
        "id_of_bytes" in lm.vocab.__dict__ for lm in fresh
    )  # the token-byte tables, seconds for a 262k vocabulary

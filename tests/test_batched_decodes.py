"""The batched test mode (`SAFE_TEST_BATCHED=1`, conftest.py) really batches, and a batched run is the run alone."""

import pytest
from conftest import BATCHED
from scripted_models import scripted
from tiny_models import char_tokenizer, tiny_model

from safe_engine.contract.events import RunFinished, TextCommitted
from safe_engine.strategies import decoding
from safe_engine.strategies.decoding import DecodeConfig, decode

P = "Q:"


@pytest.fixture(scope="module")
def scripted_pair():
    drafter = {"": {"Inc": 1.0}, "Inc": {"orr": 1.0}, "Incorr": {"ect": 1.0}, "Incorrect": {"!": 0.6, "?": 0.4}}
    verifier = {"": {"Incorrect": 0.9}, "Incorrect": {"?": 0.8, "!": 0.2}}
    return [
        scripted("a", ["Inc", "orr", "ect", "!", "?"], drafter, P),
        scripted("b", ["Incorrect", "!", "?"], verifier, P),
    ]


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return [tiny_model(tmp_path_factory.mktemp(f"t{seed}"), char_tokenizer(), seed=seed) for seed in (1, 4)]


def shown(events) -> list[dict]:
    """What a run shows, less its timing, pass counts (they depend on what shared the passes) and config (a
    greedy run still draws and reports a seed)."""
    return [{k: v for k, v in e.to_dict().items() if k not in ("elapsed_s", "stats", "config")} for e in events]


def committed(events) -> list[tuple[list[int], str]]:
    return [(t.ids, t.decision) for e in events if isinstance(e, TextCommitted) for t in e.tokens]


def forward(events) -> dict[str, dict]:
    assert isinstance(events[-1], RunFinished)
    return events[-1].stats["forward"]


@pytest.mark.parametrize("strategy", ["single", "per-token", "safe"])
def test_a_batched_run_shares_its_passes_and_gives_the_events_it_gives_alone(
    batched_decode, scripted_pair, tiny_pair, strategy
):
    config = DecodeConfig(strategy=strategy, max_new_tokens=16)
    for models, prompt in ((scripted_pair, P), (tiny_pair, "the cat")):
        alone = list(decoding.decode(models, prompt, config))
        batched = list(batched_decode(models, prompt, config))
        if models is scripted_pair:  # exact probabilities, whatever the batch
            assert shown(batched) == shown(alone)
        else:  # real weights: float sums differ between batch shapes, the tokens do not
            assert committed(batched) == committed(alone) and batched[-1].text == alone[-1].text
        drafter = forward(batched)[models[0].name]
        assert drafter["rows"] >= drafter["passes"] + 2  # its first pass at least held all three runs


def test_this_modules_decode_is_batched_exactly_in_the_batched_mode(scripted_pair):
    events = list(decode(scripted_pair, P, DecodeConfig(max_new_tokens=16)))  # swapped by conftest when batched
    drafter = forward(events)[scripted_pair[0].name]
    assert (drafter["rows"] > drafter["passes"]) == BATCHED

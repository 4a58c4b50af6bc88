"""The architecture matrix: tiny random-weight models of nine transformers families (tests/architectures.py)
through the runtime under the default numerics, each checked against transformers itself.

- `single` gives what transformers' own greedy `generate` gives on the same prompt ids, token for token, in
  fp32 and in bf16, alone and inside a batch of runs at other lengths and phases; the family took the
  batched KV-slot runtime.
- Rolled-back rows in shared passes get a fresh forward's logits, past every window.
- SAFE and per-token between families with different tokenizers (Gemma 3 with Gemma's, GPT-NeoX and Mistral
  with SmolLM2's) give the tokens they give on transformers' own cache, alone and in a batch.
- Real families the KV slots cannot hold (Falcon and Bloom: attention code of their own; LFM2: a convolution
  state) run one run at a time on their own cache, with transformers' tokens.
- What decides is what a model does in the probes, never a parameter's name: a state-space model (Mamba), whose
  cache gets a chunk wrong, and a model whose forward takes no cache are refused at load with a message that says
  why; a transformers that named the cache in a way the runtime does not know is named as the cause, not the
  model.
"""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
from architectures import (
    FAMILIES,
    FP32_MARGIN,
    NEW_TOKENS,
    OWN_CACHE_FAMILIES,
    PROMPT,
    REFUSED_FAMILIES,
    SLOT_FAMILIES,
    WINDOW,
    Reference,
    build,
    clear_of_ties,
    load,
    transformers_greedy,
)
from architectures import tokenizer as family_tokenizer
from passes import full_forward, queued, together, wait_for

from safe_engine import DecodeRequest, decode_many
from safe_engine.cli import main
from safe_engine.contract.errors import ModelLoadError
from safe_engine.contract.events import EnsemblePoint, RunFinished, TextCommitted
from safe_engine.runtime.batching import ModelExecutor
from safe_engine.runtime.executors import KV_SLOTS, OWN_CACHE, RuntimePath, runtime_path
from safe_engine.runtime.own_cache import OwnCacheExecutor
from safe_engine.runtime.scheduler import Scheduler
from safe_engine.runtime.session import LocalSessions
from safe_engine.strategies.decoding import DecodeConfig, decode

pytestmark = pytest.mark.architectures

COMPANIONS = ("Hi.", "List every planet of the solar system, from the closest to the sun to the farthest, with a fact.")
DTYPES = ("float32", "bfloat16")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Every family's tiny model saved once (a folder named after the family)."""
    root = tmp_path_factory.mktemp("architectures")
    tokenizers = {}
    out = {}
    for name, family in FAMILIES.items():
        if family.tokenizer not in tokenizers:
            tokenizers[family.tokenizer] = family_tokenizer(family.tokenizer)
        out[name] = build(family, root / name, tokenizers[family.tokenizer])
    return out


@pytest.fixture(scope="module")
def loaded(folders):
    """`loaded(family, dtype)`: the family's model loaded once per dtype with the default options."""
    cache = {}

    def get(name: str, dtype: str = "float32"):
        if (name, dtype) not in cache:
            lm = cache[name, dtype] = load(folders[name], dtype)
            built = [other for (n, _), other in cache.items() if n == name and other is not lm]
            if built:  # the same folder's tokenizer: its byte table (seconds for Gemma's) is not built again
                lm.vocab = built[0].vocab
        return cache[name, dtype]

    return get


@pytest.fixture(scope="module")
def references(folders, loaded):
    cache = {}

    def get(name: str, dtype: str) -> Reference:
        if (name, dtype) not in cache:
            cache[name, dtype] = transformers_greedy(folders[name], loaded(name, dtype).encode_prompt(PROMPT), dtype)
        return cache[name, dtype]

    return get


def generated(events) -> list[int]:
    assert isinstance(events[-1], RunFinished)
    return [i for e in events if isinstance(e, TextCommitted) for t in e.tokens for i in t.ids]


def forward(events, lm) -> dict:
    return events[-1].stats["forward"][lm.name]


def single(n: int, **config) -> DecodeConfig:
    return DecodeConfig(strategy="single", max_new_tokens=n, **config)


def check_clear(ref: Reference, window: int | None) -> None:
    """The comparison means something: clear of near-ties where it compares, and past every window."""
    problem = clear_of_ties(ref)
    assert problem is None, f"{problem}: pick another seed (python -m tests.architectures)"
    if window:
        assert len(ref.prompt_ids) + ref.compared > 2 * window


def single_alone_and_in_a_batch(lm, ref: Reference) -> tuple[list, list]:
    """The run alone, then among companions at other lengths and phases: a short run that ends early (the
    fourth run joins when it does), one with another draft length, a long prompt."""
    n = ref.compared
    alone = list(decode([lm], PROMPT, single(n), scheduler=Scheduler()))
    scheduler = Scheduler()
    requests = [
        DecodeRequest(COMPANIONS[0], single(6, lookahead=2)),
        DecodeRequest(PROMPT, single(n)),
        DecodeRequest(COMPANIONS[1], single(n, lookahead=3)),
        DecodeRequest(COMPANIONS[0], single(n // 2, lookahead=4)),
    ]
    with scheduler.device(lm.device):  # the first three start in one pass
        handles = decode_many([lm], requests, max_parallel=3, scheduler=scheduler)
        wait_for(lambda: queued(scheduler, lm) == 3)
    events = [handle.result(120) for handle in handles]
    assert all(isinstance(e[-1], RunFinished) for e in events)
    return alone, events[1]


# ---------------------------------------------------------------- single against transformers' generate


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(SLOT_FAMILIES))
def test_single_gives_transformers_tokens_alone_and_in_a_batch(loaded, references, name, dtype):
    lm, ref = loaded(name, dtype), references(name, dtype)
    check_clear(ref, SLOT_FAMILIES[name].window)
    assert lm.sessions.path == RuntimePath(KV_SLOTS) and lm.describe()["runtime"] == KV_SLOTS
    alone, batched = single_alone_and_in_a_batch(lm, ref)
    expected = ref.tokens[: ref.compared]
    assert generated(alone) == expected
    assert generated(batched) == expected
    stats = forward(batched, lm)
    assert stats["rows"] > stats["passes"]  # it shared passes: the batched runtime, not one run at a time
    assert isinstance(lm.sessions.executor(Scheduler()), ModelExecutor)


@pytest.mark.parametrize("name", list(OWN_CACHE_FAMILIES))
def test_families_outside_the_kv_slots_run_on_their_own_cache_with_transformers_tokens(loaded, references, name):
    lm, ref = loaded(name), references(name, "float32")
    check_clear(ref, None)
    path = lm.sessions.path
    assert path.name == OWN_CACHE and lm.describe()["runtime_reason"] == path.reason
    assert {"falcon": "attention interface", "lfm2": "kind conv", "bloom": "attention interface"}[name] in path.reason
    alone, batched = single_alone_and_in_a_batch(lm, ref)
    assert generated(alone) == generated(batched) == ref.tokens
    stats = forward(batched, lm)
    assert stats["rows"] == stats["passes"]  # one run at a time
    assert isinstance(lm.sessions.executor(Scheduler()), OwnCacheExecutor)


# ---------------------------------------------------------------- rollback


@pytest.mark.parametrize("name", [*SLOT_FAMILIES, *OWN_CACHE_FAMILIES])
def test_rows_rolled_back_get_fresh_forward_logits_past_the_window(loaded, name):
    """Four runs past the window extending, rolling back and re-feeding on their own, each step one shared pass."""
    lm = loaded(name)
    scheduler = Scheduler()
    rng = random.Random(0)
    vocab = list(range(3, len(lm.tokenizer)))
    sessions = [lm.sessions.open(scheduler) for _ in range(4)]
    ids = [[rng.choice(vocab) for _ in range(rng.randint(2 * WINDOW, 2 * WINDOW + 8))] for _ in sessions]
    for _ in range(6):
        for i in range(len(ids)):
            if rng.random() < 0.4:  # a rollback: a SAFE replacement, a dropped draft
                cut = max(1, len(ids[i]) - rng.randint(1, 6))
                ids[i] = ids[i][:cut] + [rng.choice(vocab) for _ in range(rng.randint(1, 5))]
            else:
                ids[i] = ids[i] + [rng.choice(vocab) for _ in range(rng.randint(1, 4))]
        starts = [sorted({rng.randint(1, len(x)), len(x)}) for x in ids]
        calls = [lambda s=s, x=list(x), t=t: s.next_token_logits(x, t) for s, x, t in zip(sessions, ids, starts)]
        assert min(len(x) for x in ids) > WINDOW + 6  # every row past the window, a rollback too
        results, errors = together(scheduler, lm, calls)
        assert errors == [None] * len(calls)
        for got, x, t in zip(results, ids, starts):
            torch.testing.assert_close(got, full_forward(lm, x, t), atol=1e-4, rtol=1e-4)
    on_slots = name in SLOT_FAMILIES
    assert lm.sessions.path.name == (KV_SLOTS if on_slots else OWN_CACHE)
    assert {s.stats.rows / s.stats.passes for s in sessions} == ({4.0} if on_slots else {1.0})
    for session in sessions:
        session.close()


# ---------------------------------------------------------------- SAFE and per-token across tokenizers

# Gemma 3 (Gemma's tokenizer) drafts for a windowed family and is verified by one with partial rotary: both
# directions across the two tokenizers, and Gemma 3 takes part in both runs, so the batch shares its passes.
PAIRS = [("gemma3", "gpt_neox"), ("mistral", "gemma3")]
ENSEMBLE_TOKENS = 20


def on_own_cache(lm):
    """The same weights served one run at a time on transformers' cache: the reference for the KV slots."""
    forced = dataclasses.replace(
        lm, sessions=LocalSessions(lm.sessions.weights, RuntimePath(OWN_CACHE, "the test's reference"))
    )
    forced.vocab = lm.vocab  # the same tokenizer: its byte table (seconds for Gemma's) is not built again
    return forced


@pytest.mark.parametrize("strategy", ["safe", "per-token"])
def test_safe_and_per_token_across_tokenizers_give_transformers_cache_tokens(loaded, strategy):
    config = DecodeConfig(strategy=strategy, max_new_tokens=ENSEMBLE_TOKENS)
    pairs = [[loaded(a), loaded(b)] for a, b in PAIRS]
    assert all(len(drafter.tokenizer) != len(verifier.tokenizer) for drafter, verifier in pairs)
    on_slots = [list(decode(pair, PROMPT, config, scheduler=Scheduler())) for pair in pairs]
    on_cache = [list(decode(list(map(on_own_cache, pair)), PROMPT, config, scheduler=Scheduler())) for pair in pairs]
    handles = decode_many([], [DecodeRequest(PROMPT, config, pair) for pair in pairs], scheduler=Scheduler())
    in_a_batch = [handle.result(300) for handle in handles]
    for (a, b), slots, cache, batch in zip(PAIRS, on_slots, on_cache, in_a_batch):
        assert generated(slots) == generated(cache) == generated(batch), (a, b)
        assert any(isinstance(e, EnsemblePoint) for e in slots), (a, b)  # the models were ensembled
    gemma3 = loaded("gemma3")
    assert any(forward(events, gemma3)["rows"] > forward(events, gemma3)["passes"] for events in in_a_batch)


# ---------------------------------------------------------------- how the path is chosen


@pytest.mark.parametrize("name", list(REFUSED_FAMILIES))
def test_a_state_space_model_is_refused_at_load_with_what_its_cache_got_wrong(folders, capsys, name):
    pattern = "kind linear_attention keep what the KV slots do not hold; on its own cache: its logits on its own"
    with pytest.raises(ModelLoadError, match=f"{name} cannot run here .*{pattern} cache differ from its own forward"):
        load(folders[name])
    assert main(["generate", "--prompt", "hi", "--models", str(folders[name]), "--strategy", "single"]) == 2
    err = capsys.readouterr().err  # transformers' progress bars, then one line
    assert err.splitlines()[-1].startswith("error: ") and "cannot run here" in err and "Traceback" not in err


def test_a_model_whose_forward_takes_no_cache_is_refused_at_load_with_a_message(folders, capsys, monkeypatch):
    """Falcon's forward stripped of its cache argument (as code that never caches would be): off the KV slots
    (attention code of its own) and unable to keep a cache, it is refused, and the message says why."""
    from transformers import FalconForCausalLM

    original = FalconForCausalLM.forward

    def uncached(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=0):
        return original(self, input_ids, attention_mask, position_ids=position_ids, logits_to_keep=logits_to_keep)

    monkeypatch.setattr(FalconForCausalLM, "forward", uncached)
    refused = r"falcon cannot run here \(.*; on its own cache: FalconForCausalLM.forward takes no cache"
    with pytest.raises(ModelLoadError, match=refused):
        load(folders["falcon"])
    assert main(["generate", "--prompt", "hi", "--models", str(folders["falcon"]), "--strategy", "single"]) == 2
    err = capsys.readouterr().err  # transformers' progress bars, then one line
    assert err.splitlines()[-1].startswith("error: ") and "takes no cache" in err and "Traceback" not in err


def test_a_transformers_that_renamed_the_cache_again_is_named_as_the_cause(folders, capsys, monkeypatch):
    """A version whose outputs call the cache by a name the runtime has never seen: a model off the KV slots is
    refused with the version and what it lacks, not blamed itself."""
    import transformers
    from transformers import modeling_outputs

    from safe_engine.runtime import transformers_api

    @dataclasses.dataclass
    class Renamed(modeling_outputs.ModelOutput):
        logits: torch.Tensor | None = None
        kv_state: object = None

    monkeypatch.setattr(modeling_outputs, "CausalLMOutputWithPast", Renamed)
    transformers_api.installed_cache_name.cache_clear()
    try:
        with pytest.raises(transformers_api.UnsupportedTransformers) as refused:
            load(folders["bloom"])
        assert main(["generate", "--prompt", "hi", "--models", str(folders["bloom"]), "--strategy", "single"]) == 2
    finally:
        transformers_api.installed_cache_name.cache_clear()
    message = str(refused.value)
    assert message.startswith(f"transformers {transformers.__version__} names a causal LM's cache none of cache")
    assert message.endswith("this version is not supported") and "bloom" not in message.lower()
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {message}"
    assert load(folders["llama"]).sessions.path.name == KV_SLOTS  # the KV slots take no cache from transformers


def test_a_layer_writing_no_slot_sends_the_model_to_its_own_cache(folders, references):
    """One layer's attention taken off transformers' attention interface (its own copy of the config,
    still naming plain SDPA): the probe sees that layer write no slot."""
    lm = load(folders["llama"])
    layer = lm.model.model.layers[1].self_attn
    layer.config = copy.copy(layer.config)
    layer.config._attn_implementation = "sdpa"
    path = runtime_path(lm.sessions.weights)
    assert path.name == OWN_CACHE and "wrote the KV slots in 1 of its 2 layers" in path.reason
    lm.sessions = LocalSessions(lm.sessions.weights, path)
    ref = references("llama", "float32")
    assert generated(list(decode([lm], PROMPT, single(NEW_TOKENS), scheduler=Scheduler()))) == ref.tokens


def test_a_model_that_loses_its_positions_in_a_shared_pass_runs_on_its_own_cache(folders, monkeypatch):
    """A Llama whose rotary embedding counts positions on from the first of its forward, as code that takes a
    forward for one sequence would: alone it is right, but a packed row's positions run on from the row before.
    Only the probe's logits see it."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaRotaryEmbedding.forward

    def counted_here(self, x, position_ids):
        counted = position_ids[..., :1] + torch.arange(position_ids.shape[-1], device=x.device)[None]
        return original(self, x, counted)

    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", counted_here)
    lm = load(folders["llama"])
    path = lm.sessions.path
    assert path.name == OWN_CACHE and "differ from its own forward's" in path.reason
    ref = transformers_greedy(folders["llama"], lm.encode_prompt(PROMPT), "float32")
    assert min(ref.margins) >= FP32_MARGIN
    alone, batched = single_alone_and_in_a_batch(lm, ref)
    assert generated(alone) == generated(batched) == ref.tokens

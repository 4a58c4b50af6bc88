"""Cached, cropped and re-fed logits equal a fresh full forward pass."""

import random

import pytest
import torch
from passes import full_forward
from tiny_models import char_tokenizer, tiny_model

from safe_engine.runtime.session import common_prefix


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    # Gemma 3 with a sliding window of 8: the edits below crop far past the window.
    return tiny_model(tmp_path_factory.mktemp(request.param), char_tokenizer(), arch=request.param, sliding_window=8)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_random_edits_match_fresh_forward(tiny):
    """Drafting, rewinding and re-tokenising the tail, as SAFE's rounds do, over 60+ tokens."""
    rng = random.Random(0)
    vocab = list(range(3, len(tiny.tokenizer)))
    session = tiny.sessions.open()
    ids = [rng.choice(vocab) for _ in range(5)]
    for step in range(40):
        if step % 3 == 2:  # a re-tokenisation changed the last few tokens
            cut = max(1, len(ids) - rng.randint(1, 6))
            ids = ids[:cut] + [rng.choice(vocab) for _ in range(rng.randint(1, 7))]
        else:
            ids = ids + [rng.choice(vocab) for _ in range(rng.randint(1, 3))]
        starts = sorted(rng.sample(range(1, len(ids) + 1), k=min(3, len(ids))))
        got = session.next_token_logits(ids, starts)
        torch.testing.assert_close(got, full_forward(tiny, ids, starts), atol=1e-4, rtol=1e-4)
    assert len(ids) > 16 and session.stats.passes < 40 + 1


def test_logits_of_a_cached_prefix_are_not_recomputed(tiny):
    session = tiny.sessions.open()
    ids = list(range(3, 15))
    session.next_token_logits(ids, [len(ids)])
    passes = session.stats.passes
    for t in range(1, 4):  # draft three tokens, then rewind to the first (exact-mode SAFE)
        ids = ids + [3 + t]
        session.next_token_logits(ids, [len(ids)])
    rewound = ids[:-2]
    again = session.next_token_logits(rewound, [len(rewound)])
    assert session.stats.passes == passes + 3  # the rewind was answered from memory
    torch.testing.assert_close(again, full_forward(tiny, rewound, [len(rewound)]), atol=1e-4, rtol=1e-4)


def test_a_rollback_only_shortens_the_slot(tiny):
    session = tiny.sessions.open()
    ids = list(range(3, 23))
    session.next_token_logits(ids, [len(ids)])
    slot = session.slot
    assert slot.length == 20
    edited = ids[:12] + [5, 6]
    got = session.next_token_logits(edited, [len(edited)])
    assert slot.length == 14 and session.stats.positions == 20 + 2  # only the two new ids were fed
    torch.testing.assert_close(got, full_forward(tiny, edited, [len(edited)]), atol=1e-4, rtol=1e-4)


@pytest.mark.real_models
def test_real_gemma_past_its_sliding_window(fp32_pair):
    """Gemma 3 slides a 512-token window: crop and re-feed past it must stay exact."""
    gemma = fp32_pair[0]
    ids = gemma.encode_prompt("Count slowly: " + " ".join(str(i) for i in range(400)))
    assert len(ids) > 600
    session = gemma.sessions.open()
    session.next_token_logits(ids, [len(ids)])
    edited = ids[:-7] + ids[-3:]
    got = session.next_token_logits(edited, [len(edited) - 1, len(edited)])
    torch.testing.assert_close(got, full_forward(gemma, edited, [len(edited) - 1, len(edited)]), atol=2e-3, rtol=1e-3)

"""Byte-level ensembling: next-byte distributions against brute force, and the strategy end to end.

The tiny byte-level BPE below has the 256 byte tokens, merges learned on a few sentences and a "é" split
over two bytes, so its covering trees hold several paths at once and a character cut by a token boundary.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from scripted_models import scripted_over
from tiny_models import EOS, byte_bpe_tokenizer, tiny_model, unigram_tokenizer

from safe_engine.cli import main
from safe_engine.contract.config import DecodeConfig
from safe_engine.contract.errors import ConfigError
from safe_engine.orchestration.comparison import comparison_plan
from safe_engine.pages.page import run_page
from safe_engine.pages.traces import read_trace, to_jsonl
from safe_engine.pages.transcript import details_html, metrics_html, run_card_html
from safe_engine.pages.view import RunView
from safe_engine.strategies.byte_level import combine
from safe_engine.strategies.decoding import decode
from safe_engine.tokenization.canonical import PairRule, canonical, refusal
from safe_engine.tokenization.next_byte import STOP, SYMBOLS, ByteTokens, CoveringTree

CORPUS = ["the answer is 12", "the question is", "an answer", "café au lait", "is the answer 1 or 2?"] * 3
PROMPT = "Q: the answer"


@pytest.fixture(scope="module")
def tokenizer():
    return byte_bpe_tokenizer(CORPUS)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("byte-pair")
    return [tiny_model(root / "a", tokenizer, seed=1, layers=1), tiny_model(root / "b", tokenizer, seed=2, layers=1)]


def _sequence_logps(lm, prompt_ids, seqs):
    """log P(seq) and the next-token log-probabilities after it, for each response token sequence."""
    session = lm.open_session()
    out = {}
    for seq in seqs:
        ids = prompt_ids + list(seq)
        rows = torch.log_softmax(session.next_token_logits(ids, list(range(len(prompt_ids), len(ids) + 1))), -1)
        logp = sum(float(rows[i][t]) for i, t in enumerate(seq))
        out[tuple(seq)] = (logp, rows[-1].double()[: len(lm.vocab)])
    session.close()
    return out


def brute_force_next_byte(lm, prompt_ids, x: bytes) -> torch.Tensor:
    """Next-byte log-probabilities of `x` by enumeration: every token sequence u spelling a prefix x[:k] of x,
    followed by a token t covering x[k:] and at least one byte more (or by the end token where k = |x|),
    kept iff the whole sequence is the tokenizer's own spelling of its bytes (no pairwise shortcut)."""
    vocab = lm.vocab
    spelled = [i for i in range(len(vocab)) if vocab[i] and i not in vocab.special_ids]
    prefixes, frontier = [()], [()]
    while frontier:  # every sequence of tokens that spells a prefix of x
        grown = []
        for seq in frontier:
            at = len(vocab.join(seq))
            grown += [(*seq, t) for t in spelled if x.startswith(vocab[t], at) and len(vocab[t]) + at <= len(x)]
        prefixes += grown
        frontier = grown
    logps = _sequence_logps(lm, prompt_ids, prefixes)
    scores = torch.full((SYMBOLS,), -math.inf, dtype=torch.float64)
    for u in prefixes:
        k = len(vocab.join(u))
        logp, rows = logps[u]
        if canonical(vocab, vocab.join(u)) != list(u):
            continue
        for t in spelled:
            full = vocab.join(u) + vocab[t]
            if len(full) > len(x) and full.startswith(x) and canonical(vocab, full) == [*u, t]:
                b = full[len(x)]
                scores[b] = torch.logaddexp(scores[b], torch.tensor(logp + float(rows[t]), dtype=torch.float64))
        if k == len(x):
            stop = torch.logsumexp(rows[sorted(lm.eos_ids)], 0)
            scores[STOP] = torch.logaddexp(scores[STOP], logp + stop)
    return torch.log_softmax(scores, -1)


def _tree(lm, prompt_ids):
    session = lm.open_session()

    def logprobs(ids):
        row = session.next_token_logits(prompt_ids + list(ids), [len(prompt_ids) + len(ids)])[0]
        return torch.log_softmax(row.float(), -1)[: len(lm.vocab)]

    return CoveringTree(ByteTokens(lm.vocab, lm.eos_ids), PairRule(lm.vocab), logprobs)


@pytest.mark.parametrize("text", ["the ans", " café", "an sw"])
def test_next_byte_distribution_equals_brute_force(pair, text):
    lm = pair[0]
    prompt_ids = lm.encode_prompt(PROMPT)
    tree = _tree(lm, prompt_ids)
    raw = text.encode("utf-8")
    # every prefix, mid-token and mid-character ones included ("caf" + the first byte of "é")
    for end in range(len(raw) + 1):
        if end:
            tree.push(raw[end - 1])
        if end in (0, 3, len(raw) - 1, len(raw)) or end == raw.find(b"\xc3") + 1:
            ours = torch.log_softmax(tree.scores(), -1)
            expected = brute_force_next_byte(lm, prompt_ids, raw[:end])
            assert torch.equal(torch.isfinite(ours), torch.isfinite(expected)), raw[:end]
            live = torch.isfinite(expected)
            assert torch.allclose(ours[live].exp(), expected[live].exp(), atol=1e-6), raw[:end]
            assert abs(float(ours.exp().sum()) - 1) < 1e-9


def test_pairwise_rule_keeps_only_canonical_pairs(tokenizer, pair):
    vocab = pair[0].vocab
    rule = PairRule(vocab)
    the, space_answer = vocab.id_of_bytes[b"the"], vocab.id_of_bytes[b" answer"]
    assert rule.valid_after(the)[space_answer]
    assert rule.valid_after(vocab.id_of_bytes[b"an"])[vocab.id_of_bytes[b"swer"]]  # "answer" is an + swer
    # " an" then "swer" is not how the tokenizer spells " answer" (one token)
    assert not rule.valid_after(vocab.id_of_bytes[b" an"])[vocab.id_of_bytes[b"swer"]]
    # the two bytes of "é" are one token of this vocabulary, so byte then byte is not canonical
    assert not rule.valid_after(vocab.id_of_bytes[b"\xc3"])[vocab.id_of_bytes[b"\xa9"]]


def _scripted_byte_model(tokenizer, table):
    return scripted_over("s", tokenizer, table, "x")


def _texts(models, **config):
    events = list(decode(models, "x", DecodeConfig(max_new_tokens=12, **config)))
    return events[-1].text, events


def test_greedy_bytes_follow_a_model_sure_of_its_canonical_tokens(tokenizer):
    # Where the two must agree: every step, the greedy token holds more than half of the model's mass and
    # the rest lies on canonical tokens that start with other bytes, so the greedy token's first byte wins
    # at the boundary and its own bytes are the only covering paths inside it.
    table = {
        "": {"the": 0.7, "is": 0.3},
        "the": {" answer": 0.6, " question": 0.4},
        "the answer": {" is": 0.9, EOS: 0.1},
        "the answer is": {" 12": 0.8, " 2": 0.2},
        "the answer is 12": {EOS: 1.0},
    }
    lm = _scripted_byte_model(tokenizer, table)
    token_text, _ = _texts([lm], strategy="single")
    byte_text, events = _texts([lm], strategy="byte-level")
    assert token_text == byte_text == "the answer is 12"
    assert events[-1].stop_reason == "eos"


def test_byte_greedy_differs_from_token_greedy_when_mass_splits(tokenizer):
    # Token greedy takes "is" (0.4); the bytes "t" carry 0.6 over "the" and "tio", so byte greedy spells "the".
    table = {"": {"is": 0.4, "the": 0.35, "tio": 0.25}, "is": {EOS: 1.0}, "the": {EOS: 1.0}, "tio": {EOS: 1.0}}
    lm = _scripted_byte_model(tokenizer, table)
    assert _texts([lm], strategy="single")[0] == "is"
    assert _texts([lm], strategy="byte-level")[0] == "the"


def test_mixture_of_a_model_with_itself_is_the_model(pair):
    alone, _ = _texts(pair[:1], strategy="byte-level")
    for how in ("mixture", "product"):
        assert _texts([pair[0], pair[0]], strategy="byte-level", byte_combine=how)[0] == alone


def test_combinations_on_hand_made_distributions():
    a = torch.tensor([0.5, 0.5, 0.0]).log()
    b = torch.tensor([0.0, 0.2, 0.8]).log()
    assert torch.allclose(combine([a, b], [0.5, 0.5], "mixture"), torch.tensor([0.25, 0.35, 0.4]))
    assert torch.allclose(combine([a, b], [0.5, 0.5], "product"), torch.tensor([0.0, 1.0, 0.0]))
    disjoint = torch.tensor([0.0, 0.0, 1.0]).log()
    assert torch.allclose(
        combine([torch.tensor([1.0, 0, 0]).log(), disjoint], [0.5, 0.5], "product"), torch.tensor([0.5, 0.0, 0.5])
    )


def test_a_run_shows_its_bytes_paths_and_cost(pair):
    text, events = _texts(pair, strategy="byte-level", byte_combine="product", temperature=0.8, seed=3)
    steps = [e for e in events if e.kind == "byte_step"]
    committed = "".join(e.delta for e in events if e.kind == "text_committed")
    assert committed == text and steps
    assert all(step.combine == "product" and step.sampled for step in steps)
    assert all(len(step.models) == 2 and all(m.paths for m in step.models) for step in steps[:-1])
    stats = events[-1].stats
    assert stats["tokens"] <= 12 and stats["passes_per_token"] > 1
    again, _ = _texts(pair, strategy="byte-level", byte_combine="product", temperature=0.8, seed=3)
    assert again == text


def test_sentencepiece_family_is_refused_with_a_message(tmp_path):
    lm = tiny_model(tmp_path / "sp", unigram_tokenizer(["the", " answer"]), layers=1)
    assert refusal(lm.vocab)
    with pytest.raises(ConfigError, match="exact only for byte-level BPE"):
        list(decode([lm], "x", DecodeConfig(strategy="byte-level")))


@pytest.mark.real_models
def test_gemma_byte_pieces_pass_every_pair_yet_are_not_canonical(gemma):
    """The measurement behind the refusal: "日" is one Gemma token, and its three byte-fallback pieces pass
    every pairwise check, so a pairwise covering tree would give them mass Gemma never spells."""
    vocab = gemma.vocab
    char = "日".encode()
    pieces = [i for i in vocab.byte_piece_ids if vocab[i] in (char[:1], char[1:2], char[2:])]
    ordered = sorted(pieces, key=lambda i: char.index(vocab[i]))
    assert canonical(vocab, char) == [vocab.id_of_bytes[char]]
    assert all(canonical(vocab, vocab[a] + vocab[b]) == [a, b] for a, b in zip(ordered, ordered[1:]))
    assert refusal(vocab)


def test_the_page_and_a_replayed_trace_show_each_tokens_bytes_escaped(pair, tmp_path):
    events = list(decode(pair, "x", DecodeConfig(strategy="byte-level", max_new_tokens=6)))
    trace = tmp_path / "run.jsonl"
    trace.write_text(to_jsonl([e.to_dict() for e in events]), encoding="utf-8")
    replayed = RunView.of(read_trace(trace))
    live = RunView.of([e.to_dict() for e in events])
    assert [t.byte_steps for t in replayed.tokens] == [t.byte_steps for t in live.tokens]
    for token, committed in zip(live.tokens, [t for e in events if e.kind == "text_committed" for t in e.tokens]):
        steps = [live.byte_steps[i]["chosen"] for i in token.byte_steps]
        if token.special:  # the end token holds the step that chose to stop
            assert steps == ["<eos>"]
            continue
        spelled = b"".join(bytes([int(c[3:5], 16)]) if c.startswith("<0x") else c.encode() for c in steps)
        assert spelled == (bytes.fromhex(committed.raw_hex) if committed.raw_hex else committed.text.encode())
    html = details_html(live, 0)
    assert "bytes chosen (mixture" in html and "paths kept" in html
    # a hostile model output stays text
    step = live.byte_steps[live.tokens[0].byte_steps[0]]
    step["models"][0]["paths"] = [["<script>alert(1)</script>"]]
    html = details_html(live, 0)
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    card = run_card_html(live)
    assert "passes/token" in metrics_html(live) and "passes/token" in card and "over a, b" in card
    assert live.metrics()["e_t"] == events[-1].stats["e_t"] > 1  # every byte is an ensemble
    assert "passes/token" in run_page(events).html()


def test_compare_gives_byte_level_its_own_column_when_it_can_read_every_model(pair, tmp_path):
    plan = comparison_plan(pair, DecodeConfig(force=((0, "x"),)))
    assert [label for label, _, _ in plan] == ["single:a", "single:b", "byte-level", "per-token", "safe"]
    assert plan[2][1] == pair and plan[2][2].force == ()
    refused = tiny_model(tmp_path / "sp", unigram_tokenizer(["the"]), layers=1)
    assert "byte-level" not in [label for label, _, _ in comparison_plan([refused, pair[1]], DecodeConfig())]


@pytest.mark.real_models
def test_cli_generates_byte_level_with_smollm2_and_refuses_gemma_in_one_line(smollm, capsys):
    argv = ["generate", "--prompt", "The capital of France is", "--strategy", "byte-level", "--max-new-tokens", "4"]
    assert main([*argv, "--models", "embedded:smollm2-135m-instruct", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"] == "byte-level" and 1 <= out["tokens"] <= 4 and out["text"]
    assert out["passes_per_token"] >= 1
    assert main(argv) == 2  # the embedded pair: Gemma drafts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gemma-3-270m" in err[0] and "exact only for byte-level BPE" in err[0]

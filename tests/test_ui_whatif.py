"""What-if branching without a browser: the candidates offered, the branch's config, the first difference,
and the Live tab's branch handler run on tiny models (bad input, the forced token, Stop)."""

from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import pytest
from test_ui_render import EVIL, synthetic_run
from tiny_models import char_tokenizer, tiny_model_folder, unigram_tokenizer

from components.panel import RunPanel
from components.pool import ModelPool
from components.run_stream import Runner
from components.stops import Stops
from components.whatif import CANDIDATES, Origin, WhatIf, branch_config, candidates
from safe_engine.contract.errors import ConfigError
from safe_engine.pages.transcript import transcript_html
from safe_engine.pages.view import RunView, first_difference
from safe_engine.strategies.decoding import DecodeConfig, decode

PROMPT = "the cat sat on"
WORDS = [" the", " cat", " sat", " on", " mat", " dog", " at", "the", "cat", "sat", "on", "ma", "t"]


def test_candidates_come_from_the_union_table_or_the_draft():
    view = RunView.of(synthetic_run())
    # token 4 was ensembled: its union table, without the committed text and without repeats
    assert candidates(view, 4) == [("“␣a”  p 0.200", " a")]
    # token 0 was kept as drafted: the drafter's top-k, without the committed text; markup stays a plain value
    assert candidates(view, 0) == [(f"“{EVIL}”  p 0.010", EVIL)]
    # the end marker cannot be forced as text
    assert candidates(view, 5) == []


def test_candidates_are_capped_and_skip_what_cannot_be_forced_as_text():
    view = RunView.of(synthetic_run())
    pieces = (("<eos>", None), ("<0xE2>", "e2"), ("a<0x9C>", "619c"))  # the engine sends a piece's bytes with it
    table = [{"text": text, "per_model": {}, "before": 0.9, "after": None, "raw_hex": raw} for text, raw in pieces]
    table += [{"text": f"w{i}", "per_model": {}, "before": 1 / (i + 2), "after": None} for i in range(20)]
    view.points[1]["table"] = table
    texts = [text for _, text in candidates(view, 4)]
    assert texts == [f"w{i}" for i in range(CANDIDATES)]


def test_branch_config_repeats_the_original_and_forces_the_text():
    view = RunView.of(synthetic_run())
    view.started["config"]["seed"] = 1234
    origin = Origin("Hi", ("a", "b"), DecodeConfig(max_new_tokens=16, force=((1, "x"), (4, "y"), (9, "z"))))
    config = branch_config(origin, view, 4, " there")
    assert config.force == ((1, "x"), (4, " there")) and config.seed == 1234
    assert (config.max_new_tokens, config.strategy) == (16, "safe")
    with pytest.raises(ConfigError, match="pick a candidate or type"):
        branch_config(origin, view, 4, "")
    with pytest.raises(ConfigError, match="below max new tokens"):
        branch_config(origin, view, 16, "x")


def _tokens(texts: list[str], stop_reason: str | None) -> RunView:
    view = RunView()
    view.tokens = [SimpleNamespace(index=i, text=t) for i, t in enumerate(texts)]
    view.finished = {"stop_reason": stop_reason} if stop_reason else None
    return view


@pytest.mark.parametrize(
    "a, b, a_done, b_done, expected",
    [
        (["x", "y", "z"], ["x", "q"], "eos", None, 1),
        (["x", "y"], ["x", "y"], "eos", None, None),  # the branch still runs
        (["x", "y"], ["x", "y", "z"], "eos", None, 2),  # the original ended where the branch goes on
        (["x", "y", "z"], ["x", "y"], "eos", None, None),  # the branch may still commit "z"
        (["x", "y", "z"], ["x", "y"], "eos", "eos", 2),
        (["x", "y", "z"], ["x", "y"], "eos", "stopped", None),  # stopping is not where a run ends
        (["x", "y"], ["x", "y"], "max_new_tokens", "max_new_tokens", None),
    ],
)
def test_first_difference(a, b, a_done, b_done, expected):
    assert first_difference(_tokens(a, a_done), _tokens(b, b_done)) == expected


def test_the_first_difference_is_marked_and_forced_text_is_escaped():
    view = RunView.of(synthetic_run())
    view.diverge = 3
    html = transcript_html(view)
    assert html.count(" diverge") == 1 and 'class="tok ens diverge"' in html
    assert "first token where this run and the other run" in html
    forced = synthetic_run()
    next(e for e in forced if e["kind"] == "text_committed")["tokens"][4] |= {"decision": "forced", "drafted": EVIL}
    html = transcript_html(RunView.of(forced))
    assert 'class="tok forced' in html and "<script" not in html


# ---------------------------------------------------------------- the branch handler on tiny models
@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    """A drafter with whole-word tokens and a verifier that spells by characters (no byte fallback; "H" added
    for the pool's warm-up prompt "Hi")."""
    letters = char_tokenizer()
    letters.add_tokens(["H"])
    words = tiny_model_folder(tmp_path_factory.mktemp("words"), unigram_tokenizer(WORDS), seed=2)
    chars = tiny_model_folder(tmp_path_factory.mktemp("chars"), letters, seed=1)
    return str(words), str(chars)


@pytest.fixture(scope="module")
def tab(specs):
    """The Live panel and the what-if controls, as the Live tab builds them (outside a server)."""
    with gr.Blocks():
        whatif = WhatIf(Runner(ModelPool(), Stops()))
        live = RunPanel("live", below_details=whatif.controls)
        whatif.section()
        whatif.wire(live)
    return whatif


def _original(pool: ModelPool, specs, config: DecodeConfig) -> tuple[Origin, RunView]:
    models = pool.load(list(specs), lambda _: None)
    return Origin(PROMPT, tuple(specs), config), RunView.of([e.to_dict() for e in decode(models, PROMPT, config)])


def _branch(tab, origin, original, index, text, session="s", on_busy=None) -> list[dict]:
    outputs = []
    for out in tab.branch(SimpleNamespace(session_hash=session), origin, original, index, text):
        outputs.append(out)
        if on_busy and "busy" in str(out.get(tab.status, "")) and "What-if" in str(out.get(tab.status, "")):
            on_busy()
    return outputs


def test_bad_branch_input_is_a_message_and_keeps_the_run(tab, specs):
    origin, original = _original(tab.runner.pool, specs, DecodeConfig(max_new_tokens=6))
    shown = transcript_html(original)
    running = RunView.of(original.events[:-1])
    spelled_by_chars = replace(
        origin, config=replace(origin.config, drafter=1)
    )  # no byte fallback: "ß" has no spelling
    cases = [
        (None, original, 2, "x", "no finished run to branch from"),
        (origin, running, 2, "x", "no finished run to branch from"),
        (origin, original, None, "x", "pin a token"),
        (origin, original, 2, "", "pick a candidate or type"),
        (spelled_by_chars, original, 2, "ß", "cannot spell"),
    ]
    for case_origin, view, index, text, message in cases:
        outputs = _branch(tab, case_origin, view, index, text)
        assert message in outputs[-1][tab.status] and "warn" in outputs[-1][tab.status]
        assert all(tab.original.transcript not in out and tab.panel.view not in out for out in outputs)
    assert transcript_html(original) == shown and original.diverge is None


def test_a_branch_forces_the_text_and_marks_the_first_difference(tab, specs):
    origin, original = _original(tab.runner.pool, specs, DecodeConfig(max_new_tokens=8))
    index = 2
    text = (candidates(original, index) + [("", " dog")])[0][1]
    outputs = _branch(tab, origin, original, index, text)
    last = outputs[-1]
    branch = last[tab.panel.view]
    forced = branch.tokens[index]
    assert (forced.decision, forced.text) == ("forced", text)
    assert [t.text for t in branch.tokens[:index]] == [t.text for t in original.tokens[:index]]
    assert branch.diverge == original.diverge == index
    marked = [out[tab.original.transcript] for out in outputs if tab.original.transcript in out][-1]
    assert marked.count(" diverge") == 1 and f'data-i="{index}"' in marked.split(" diverge")[1][:40]
    assert " diverge" in last[tab.panel.transcript] and "first differ at token #2" in last[tab.status]
    assert tab.damage in last and last[tab.download].value["path"].endswith("what-if-trace.jsonl")


def test_stop_ends_a_branch(tab, specs):
    origin, original = _original(tab.runner.pool, specs, DecodeConfig(max_new_tokens=6))
    outputs = _branch(
        tab, origin, original, 0, " dog", session="stopper", on_busy=lambda: tab.runner.stops.stop("stopper")
    )
    branch = outputs[-1][tab.panel.view]
    assert branch.finished["stop_reason"] == "stopped" and len(branch.tokens) < 6
    assert "stopped" in outputs[-1][tab.status]


def test_forcing_the_committed_text_marks_nothing(tab, specs):
    origin, original = _original(tab.runner.pool, specs, DecodeConfig(max_new_tokens=6))
    committed = [c for e in original.events if e["kind"] == "text_committed" for c in e["tokens"]]
    token = next(t for t, c in zip(original.tokens, committed) if c["raw_hex"] is None and not t.special)  # a text
    outputs = _branch(tab, origin, original, token.index, token.text)
    branch = outputs[-1][tab.panel.view]
    assert [t.text for t in branch.tokens] == [t.text for t in original.tokens] and branch.tokens[
        token.index
    ].decision == "forced"
    assert branch.diverge is original.diverge is None and " diverge" not in outputs[-1][tab.panel.transcript]
    assert "no token differs from the original" in outputs[-1][tab.status]


def test_a_new_live_run_resets_the_branch_and_a_refused_one_keeps_it(tab, specs):
    origin, original = _original(tab.runner.pool, specs, DecodeConfig(max_new_tokens=6))
    original.pinned = 2  # pinned while the run streamed
    assert tab._follow(None, None, original) == gr.skip()  # no Live run yet
    shown = tab._follow(origin, None, original)
    assert shown[tab.followed] is origin and shown[tab.box].visible is False and "No branch yet" in shown[tab.status]
    assert shown[tab.index] == 2 and "token #2" in shown[tab.hint]  # the pin is offered once the run has finished
    assert shown[tab.panel.view].tokens == []
    # a refused Live event leaves the origin as it was: the branch shown stays
    assert tab._follow(origin, origin, original) == gr.skip()


def test_the_live_event_streams_none_of_the_what_if_section():
    """Gradio rebuilds every output an update leaves out, at every frame: the What-if section catches up in
    an event of its own, after the Live run."""
    from components import studio

    demo = studio.build_demo()
    live = next(fn for fn in demo.fns.values() if fn.api_name == "generate")
    follow = next(fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "_follow")
    assert all(block.elem_id.startswith("live-") for block in live.outputs if not block.stateful)
    assert not {block._id for block in live.outputs} & {block._id for block in follow.outputs}
    assert follow.trigger_after == live._id

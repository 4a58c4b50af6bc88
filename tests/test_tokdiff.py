"""Tokenizer debugger: hand-checked boundaries on the real embedded pair, corpus scan, word list,
vocabulary overlap, the conditioning probe, the rendering and the `tokdiff` CLI."""

import json
import time

import pytest

from benchmarks.tokdiff_speed import sample_text
from components.tokenizer_view import (
    corpus_frame,
    pair_view_html,
    probe_frame,
    rates_frame,
    stats_html,
    token_length_figure,
    words_frame,
)
from safe_engine.analysis.tokdiff import (
    common_words,
    corpus_scan,
    load_vocabs,
    pair_view,
    probe,
    unite_fill,
    visible,
    vocab_overlap,
    word_agreement,
)
from safe_engine.cli import main
from safe_engine.contract.errors import ConfigError

GEMMA, SMOL = "gemma-3-270m", "smollm2-135m-instruct"
G2S, S2G = f"{GEMMA}->{SMOL}", f"{SMOL}->{GEMMA}"


@pytest.fixture(scope="module")
def vocabs():
    return load_vocabs(["embedded:gemma-3-270m", "embedded:smollm2-135m-instruct"])


def texts(tokens):
    return [t.text for t in tokens]


def covers_text_exactly(view):
    """Each model's tokens lie end to end over every byte of the text."""
    size = len(view.text.encode("utf-8"))
    for tokens in view.tokens.values():
        edges = [0] + [t.end_byte for t in tokens]
        assert [t.start_byte for t in tokens] == edges[:-1] and edges[-1] == size


@pytest.mark.real_models
def test_one_gemma_token_is_two_smollm_tokens(vocabs):
    view = pair_view(" unbelievable", vocabs)
    assert texts(view.tokens[GEMMA]) == [" unbelievable"]
    assert texts(view.tokens[SMOL]) == [" unbelie", "vable"]
    data = view.to_dict()
    assert data["shared_boundaries"] == [] and data["only_boundaries"] == {GEMMA: [], SMOL: [8]}
    assert data["oov_like"] == {G2S: [], S2G: [view.tokens[SMOL][0]._asdict()]}
    assert view.tokens[SMOL][0].oov_for == (GEMMA,) and view.tokens[SMOL][1].oov_for == ()
    assert view.counts()["shared_ratio"] == 0.0


@pytest.mark.real_models
def test_identical_splits_share_every_boundary(vocabs):
    view = pair_view(" Antananarivo", vocabs)
    assert texts(view.tokens[GEMMA]) == texts(view.tokens[SMOL]) == [" Ant", "anan", "ar", "ivo"]
    assert view.to_dict()["shared_boundaries"] == [4, 8, 10]
    assert view.oov_like == {G2S: [], S2G: []}
    assert view.counts()["shared_ratio"] == 1.0


@pytest.mark.real_models
def test_rare_name_boundaries_and_oov_like_both_ways(vocabs):
    view = pair_view(" Ouagadougou", vocabs)
    assert texts(view.tokens[GEMMA]) == [" Ou", "agad", "oug", "ou"]
    assert texts(view.tokens[SMOL]) == [" O", "uag", "ad", "ou", "g", "ou"]
    assert view.to_dict()["shared_boundaries"] == [7, 10]
    assert texts(view.oov_like[G2S]) == [" Ou"]
    assert texts(view.oov_like[S2G]) == [" O", "uag", "ou"]
    assert [(t.start, t.end) for t in view.oov_like[S2G]] == [(0, 2), (2, 5), (7, 9)]
    assert view.counts() == {
        "tokens": {GEMMA: 4, SMOL: 6},
        "boundaries": {GEMMA: 3, SMOL: 5},
        "shared_boundaries": 2,
        "shared_ratio": 2 / 6,
        "oov_like": {G2S: 1, S2G: 3},
    }


@pytest.mark.real_models
def test_byte_fallback_pieces_are_readable_and_placed_inside_their_character(vocabs):
    view = pair_view("𓀀 ꙮ", vocabs)  # no model has these characters: both fall back to bytes
    assert texts(view.tokens[GEMMA]) == ["<0xF0>", "<0x93>", "<0x80>", "<0x80>", " ", "<0xEA>", "<0x99>", "<0xAE>"]
    assert texts(view.tokens[SMOL]) == ["<0xF0>", "<0x93>", "<0x80>", "<0x80>", " <0xEA>", "<0x99>", "<0xAE>"]
    assert [t.partial for t in view.tokens[SMOL]] == [True] * 7
    assert [(t.start, t.end) for t in view.tokens[SMOL]] == [(0, 1)] * 4 + [(1, 3), (2, 3), (2, 3)]
    assert texts(view.oov_like[G2S]) == [" "] and view.oov_like[S2G] == []
    # Boundaries inside a character are shared too, but only those between characters get a char offset.
    assert view.counts()["shared_boundaries"] == 6 and view.to_dict()["shared_boundaries"] == [1]
    assert view.to_dict()["only_boundaries"] == {GEMMA: [2], SMOL: []}
    covers_text_exactly(view)


@pytest.mark.real_models
def test_emoji_and_cjk(vocabs):
    view = pair_view("Hello 😀 世界", vocabs)
    assert texts(view.tokens[GEMMA]) == ["Hello", " 😀", " 世界"]
    smol = view.tokens[SMOL]
    assert texts(smol[:3]) == ["Hello", " <0xF0><0x9F><0x98>", "<0x80>"]
    assert [(t.start, t.end, t.partial) for t in smol[1:3]] == [(5, 7, True), (6, 7, True)]
    assert smol[1].oov_for == (GEMMA,) and smol[2].oov_for == ()
    assert any(t.partial for t in smol[3:]) and not any(t.partial for t in view.tokens[GEMMA])
    covers_text_exactly(view)


@pytest.mark.real_models
def test_empty_text(vocabs):
    view = pair_view("", vocabs)
    assert view.tokens == {GEMMA: [], SMOL: []}
    assert view.counts()["shared_ratio"] == 1.0 and view.oov_like == {G2S: [], S2G: []}
    assert corpus_scan(view).spans == [] and corpus_scan(view).oov_rate == {G2S: 0.0, S2G: 0.0}
    assert "Empty text" in pair_view_html(view)


@pytest.mark.real_models
def test_very_long_text_in_bounded_time(vocabs):
    text = sample_text(200_000)
    started = time.perf_counter()
    view = pair_view(text, vocabs)
    scan = corpus_scan(view)
    html = pair_view_html(view)
    assert time.perf_counter() - started < 60  # about 3 s on 2 busy cores
    covers_text_exactly(view)
    assert scan.spans[0].count > 1000 and "Showing the first 4000 of 200000 characters" in html
    assert len(html) < 2_000_000


@pytest.mark.real_models
def test_pair_view_of_2000_characters_is_well_under_a_second(vocabs):
    text = sample_text(2000)
    pair_view(text, vocabs)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        pair_view_html(pair_view(text, vocabs))
        times.append(time.perf_counter() - started)
    assert sorted(times)[2] < 0.5


@pytest.mark.real_models
def test_corpus_scan_counts_the_spans_that_break(vocabs):
    scan = corpus_scan(pair_view("Ouagadougou is far. Ouagadougou is hot. Antananarivo is not.", vocabs))
    rows = {row.span: row for row in scan.spans}
    assert rows["Ouagadougou"].breaks == rows["Ouagadougou"].count == 2
    assert rows["Ouagadougou"].pieces == {GEMMA: "Ou|agad|oug|ou", SMOL: "O|uag|ad|ou|g|ou"}
    assert "Antananarivo" not in rows and "is" not in rows
    assert scan.oov_like[S2G] > scan.oov_like[G2S] and 0 < scan.oov_rate[S2G] < 1
    frame = corpus_frame(scan)
    assert list(frame.columns) == ["span", "count", "breaks", "break rate", GEMMA, SMOL]
    assert frame.iloc[0]["span"] == "Ouagadougou" and "span" in frame.to_csv()
    assert list(rates_frame(scan)["direction"]) == [G2S, S2G]


@pytest.mark.real_models
def test_word_list_agreement_on_a_real_word_list(vocabs):
    words = common_words()
    assert len(words) > 4000 and words[:3] == ("the", "to", "and")
    agreement = word_agreement(vocabs)
    assert agreement.words == len(words) and 0.5 < agreement.rate < 1.0
    assert len(agreement.differing) == round((1 - agreement.rate) * len(words))
    exact = word_agreement(vocabs, ["unbelievable", "the"])
    assert exact.rate == 0.5 and [(r.span, r.pieces) for r in exact.differing] == [
        ("unbelievable", {GEMMA: "␣unbelievable", SMOL: "␣unbelie|vable"})
    ]
    assert list(words_frame(exact).columns) == ["word", GEMMA, SMOL]


@pytest.mark.real_models
def test_vocabulary_overlap_and_unite_fill(vocabs):
    overlap = vocab_overlap(vocabs)
    assert 0 < overlap["shared"] < overlap["sizes"][SMOL] < overlap["sizes"][GEMMA]
    assert overlap["share"][SMOL] == overlap["shared"] / overlap["sizes"][SMOL]
    fill = unite_fill(" unbelievable", vocabs)
    assert fill[GEMMA]["text"] == " unbelievable" and fill[GEMMA]["exact"]
    assert fill[SMOL]["text"] == " unbelie" and not fill[SMOL]["exact"]
    assert unite_fill("", vocabs) == {GEMMA: None, SMOL: None}


@pytest.mark.real_models
def test_everything_from_the_text_and_the_names_is_escaped(vocabs):
    evil = '<script>alert(1)</script> & "x" <b>'
    hostile = {"<i>g</i>": vocabs[GEMMA], 'sm"ol': vocabs[SMOL]}
    view = pair_view(evil, hostile)
    html = pair_view_html(view) + stats_html(view, word_agreement(hostile, ["the"]))
    assert "<script" not in html and "<b>" not in html and "<i>" not in html
    assert "&lt;b&gt;" in html and ")&lt;/" in html and "&lt;i&gt;g&lt;/i&gt;" in html and "sm&quot;ol" in html
    assert 'title="' in html and "OOV-like for" in html


@pytest.mark.real_models
def test_rendering_marks_oov_like_tokens_and_one_sided_boundaries(vocabs):
    html = pair_view_html(pair_view(" unbelievable", vocabs))
    assert html.count('class="td-tok oov one"') == 1  # SmolLM2's " unbelie", ending where Gemma has none
    assert html.count('class="td-ch bo"') == 1  # the ruler's one-sided boundary, before the "v"
    figure = token_length_figure(pair_view(" Ouagadougou", vocabs))
    assert [trace.name for trace in figure.data] == [GEMMA, SMOL]
    assert list(figure.data[1].x) == [2, 3, 2, 2, 1, 2]


def test_visible_whitespace():
    assert visible(" a\n\tb") == "␣a↵→b"


def test_pair_view_needs_two_tokenizers():
    with pytest.raises(ConfigError, match="two models"):
        load_vocabs(["embedded:gemma-3-270m"])
    with pytest.raises(ConfigError, match="must differ"):
        load_vocabs(["embedded:gemma-3-270m", "embedded:gemma-3-270m"])


@pytest.mark.real_models
def test_probe_shifts_the_distribution_only_where_boundaries_differ(gemma, vocabs):
    smol = vocabs[SMOL]
    text = "The capital of Burkina Faso is Ouagadougou, a city"
    start = text.index(" Ouagadougou")
    broken = probe(gemma, text, (start, start + len(" Ouagadougou")), smol)
    assert broken.canonical == [" Ou", "agad", "oug", "ou"]
    assert broken.imposed[0] == " O" and "".join(broken.imposed) == " Ouagadougou"
    assert broken.kl > 0.05
    assert broken.continuation == "," and broken.rank_canonical >= 1 and broken.rank_imposed >= 1
    assert broken.top_canonical != broken.top_imposed
    text = "The capital of Madagascar is Antananarivo, a city"
    start = text.index(" Antananarivo")
    same = probe(gemma, text, (start, start + len(" Antananarivo")), smol)
    assert same.canonical == same.imposed == [" Ant", "anan", "ar", "ivo"]
    assert same.kl < 1e-6 and same.rank_canonical == same.rank_imposed
    assert list(probe_frame(same).columns)[1:4:2] == ["own tokenization", "imposed tokenization"]
    with pytest.raises(ConfigError, match="span"):
        probe(gemma, text, (5, 5), smol)


@pytest.mark.real_models
def test_cli_json_shape(vocabs, capsys):
    assert main(["tokdiff", "--text", " Ouagadougou", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["models"] == [GEMMA, SMOL]
    assert [(t["text"], t["start"], t["end"]) for t in data["tokens"][GEMMA]] == [
        (" Ou", 0, 3),
        ("agad", 3, 7),
        ("oug", 7, 10),
        ("ou", 10, 12),
    ]
    assert data["shared_boundaries"] == [7, 10]
    assert [t["text"] for t in data["oov_like"][S2G]] == [" O", "uag", "ou"]
    assert {"text", "start", "end"} <= set(data["oov_like"][G2S][0])
    assert 0.5 < data["agreement"] < 1.0


@pytest.mark.real_models
def test_cli_plain_output_reads_a_file(vocabs, tmp_path, capsys):
    path = tmp_path / "t.txt"
    path.write_text("It was unbelievable.", encoding="utf-8")
    assert main(["tokdiff", "--file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "␣unbelie|vable" in out and "word-list agreement" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tokdiff", "--text", ""], "the text is empty"),
        (["tokdiff", "--text", "x", "--models", "embedded:gemma-3-270m"], "at least two models"),
        (["tokdiff", "--file", "/definitely/missing.txt"], "cannot read"),
        (["tokdiff"], "--text --file"),
        (["tokdiff", "--text", "x", "--models", "embedded:nope", "embedded:gemma-3-270m"], "unknown embedded model"),
    ],
)
def test_cli_bad_input_is_one_error_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and err.count("\n") == 1

"""Tokenizer debugger → HTML, a Plotly figure and pandas tables (pure functions; the app tab mounts them).

The pair view is a CSS grid with one column per character of the text, so every model's tokens sit on
the same character ruler. Tokens that share characters (byte-fallback pieces of one character) are
grouped into one cell. Every string from a tokenizer or a person goes through `text.esc`; hover
details ride in `title` attributes, so they need no script.
"""

from __future__ import annotations

import bisect
from itertools import takewhile

import pandas as pd
import plotly.graph_objects as go

from safe_engine.analysis.tokdiff import CorpusScan, PairView, ProbeResult, Token, WordAgreement, direction, visible
from safe_engine.pages.text import esc, plot_label

COLUMNS = 64  # characters per ruler line
MAX_CHARS = 4000  # longer texts: the view shows their start (the corpus scan covers all of it)
COLORS = ("#4477AA", "#66CCEE", "#228833", "#CCBB44")  # Paul Tol "bright", as components/charts.py

_CSS = """<style>
.tokdiff .td-grid { display: grid; justify-content: start; gap: 3px 0; margin: 0 0 14px;
  font: 14px/1.5 ui-monospace, monospace; }
.tokdiff .td-label { padding-right: 10px; color: #555; font: 12px/1.9 system-ui, sans-serif; white-space: nowrap; }
.tokdiff .td-tick { color: #999; font-size: 10px; border-left: 1px solid #ccc; padding-left: 1px; }
.tokdiff .td-ch { grid-row: 2; min-width: 0.6em; text-align: center; border-left: 2px solid transparent;
  white-space: pre; }
.tokdiff .td-ch.ws { color: #aaa; }
.tokdiff .td-ch.bs { border-left-color: #228833; }
.tokdiff .td-ch.bo { border-left: 2px dashed #EE7733; }
.tokdiff .td-ch.bi { text-decoration: underline dotted #EE7733 2px; }
.tokdiff .td-group { display: flex; contain: inline-size; overflow: hidden; white-space: pre; }
.tokdiff .td-tok { flex: 1 1 0; min-width: 0; overflow: hidden; padding: 0 1px; background: #eeeeee;
  border-right: 2px solid #228833; border-radius: 2px; }
.tokdiff .td-tok.one { border-right: 2px dashed #EE7733; }
.tokdiff .td-tok.oov { background: #ffcccc; outline: 1px dashed #aa3377; outline-offset: -1px; }
.tokdiff .td-tok.part { font-style: italic; font-size: 0.8em; }
.tokdiff .td-tok.cont { border-right-color: transparent; }
.tokdiff .td-legend span { margin-right: 12px; padding: 0 4px; }
.tokdiff .td-note { color: #666; font-size: 12px; }
</style>"""

_LEGEND = (
    '<div class="td-legend td-note">'
    '<span class="td-tok">token</span>'
    '<span class="td-tok oov">OOV-like for another model (no boundary of theirs where it ends)</span>'
    '<span class="td-tok part">&lt;0xNN&gt; part of a character</span>'
    '<span style="border-left: 2px solid #228833">boundary every model has</span>'
    '<span style="border-left: 2px dashed #EE7733">boundary only some models have</span>'
    "</div>"
)


def _groups(tokens: list[Token]) -> list[list[tuple[int, Token]]]:
    """Consecutive tokens that share a character (byte-fallback pieces) form one cell of the ruler;
    each token comes with its 1-based number."""
    groups: list[list[tuple[int, Token]]] = []
    for number, token in enumerate(tokens, start=1):
        if groups and token.start < groups[-1][-1][1].end:
            groups[-1].append((number, token))
        else:
            groups.append([(number, token)])
    return groups


def _token_title(name: str, number: int, token: Token) -> str:
    lines = [
        f"{name} #{number} (id {token.id}) “{visible(token.text)}”",
        f"chars {token.start}–{token.end}, bytes {token.start_byte}–{token.end_byte}",
    ]
    if token.partial:
        lines.append("part of a character (byte fallback)")
    if token.oov_for:
        lines.append(f"OOV-like for {', '.join(token.oov_for)}: no token of theirs ends at byte {token.end_byte}")
    return "\n".join(lines)


def _char_cell(view: PairView, c: int, inside: list[str]) -> str:
    ch, start = view.text[c], view.index.byte_of_char(c)
    models = [name for name, bounds in view.boundaries.items() if start in bounds]
    classes = ["td-ch"] + (["ws"] if ch.isspace() else [])
    notes = []
    if start in view.shared:
        classes.append("bs")
        notes.append("boundary before it: every model")
    elif models:
        classes.append("bo")
        notes.append(f"boundary before it: only {', '.join(models)}")
    if inside:
        classes.append("bi")
        notes.append(f"split inside by {', '.join(inside)}")
    title = f' title="{esc(f"character {c}, U+{ord(ch):04X}: " + "; ".join(notes))}"' if notes else ""
    return f'<span class="{" ".join(classes)}"{title}>{esc(visible(ch))}</span>'


def _model_row(view: PairView, name: str, row: int, groups: list, ends: list[int], first: int, last: int) -> list[str]:
    """One model's token cells between characters `first` and `last` (groups: `_groups`, ends: their ends)."""
    text_bytes = view.index.byte_of_char(len(view.text))
    color = COLORS[(row - 3) % len(COLORS)]
    parts = [
        f'<span class="td-label" style="grid-row:{row};grid-column:1;border-left:4px solid {color};'
        f'padding-left:4px">{esc(name)}</span>'
    ]
    for group in groups[bisect.bisect_right(ends, first) : bisect.bisect_left(ends, last) + 1]:
        start, end = max(group[0][1].start, first), min(group[-1][1].end, last)
        if start >= end:
            continue
        cells = []
        for number, token in group:
            classes = ["td-tok"]
            classes += ["oov"] if token.oov_for else []
            classes += ["part"] if token.partial else []
            classes += ["one"] if token.end_byte < text_bytes and token.end_byte not in view.shared else []
            classes += ["cont"] if group[-1][1].end > last else []
            title = _token_title(name, number, token)
            cells.append(f'<span class="{" ".join(classes)}" title="{esc(title)}">{esc(visible(token.text))}</span>')
        parts.append(
            f'<span class="td-group" style="grid-row:{row};grid-column:{start - first + 2} / span {end - start}">'
            + "".join(cells)
            + "</span>"
        )
    return parts


def pair_view_html(view: PairView, columns: int = COLUMNS, max_chars: int = MAX_CHARS) -> str:
    """Every model's tokens on one character ruler, `columns` characters per line, the first `max_chars`."""
    shown = min(len(view.text), max_chars)
    groups = {name: _groups(list(takewhile(lambda t: t.start < shown, toks))) for name, toks in view.tokens.items()}
    ends = {name: [group[-1][1].end for group in model_groups] for name, model_groups in groups.items()}
    split_inside: dict[int, list[str]] = {}  # character → the models with a boundary inside it
    for name, bounds in view.boundaries.items():
        for c in {view.index.char_of_byte(b) for b in bounds if not view.index.is_char_boundary(b)}:
            split_inside.setdefault(c, []).append(name)
    parts = ['<div class="tokdiff">', _CSS, _LEGEND]
    if not view.text:
        parts.append('<p class="td-note">Empty text: nothing to compare.</p>')
    for first in range(0, shown, columns):
        last = min(first + columns, shown)
        parts.append(f'<div class="td-grid" style="grid-template-columns: max-content repeat({last - first}, auto)">')
        parts.append('<span class="td-label" style="grid-row:1;grid-column:1">char</span>')
        parts += [
            f'<span class="td-tick" style="grid-row:1;grid-column:{c - first + 2} / span {min(10, last - c)}">'
            f"{c}</span>"
            for c in range(first, last, 10)
        ]
        parts.append('<span class="td-label" style="grid-row:2;grid-column:1">text</span>')
        parts += [_char_cell(view, c, split_inside.get(c, [])) for c in range(first, last)]
        for row, name in enumerate(view.names, start=3):
            parts += _model_row(view, name, row, groups[name], ends[name], first, last)
        parts.append("</div>")
    if shown < len(view.text):
        parts.append(f'<p class="td-note">Showing the first {shown} of {len(view.text)} characters.</p>')
    parts.append("</div>")
    return "".join(parts)


def stats_html(view: PairView, agreement: WordAgreement | None = None) -> str:
    """Tokens, boundaries and OOV-like counts per model, the shared-boundary ratio, the word-list agreement."""
    counts = view.counts()
    rows = "".join(
        f"<tr><td>{esc(name)}</td><td>{counts['tokens'][name]}</td><td>{counts['boundaries'][name]}</td>"
        f"<td>{len(view.only(name))}</td></tr>"
        for name in view.names
    )
    directions = "".join(
        f"<li>{esc(a)}’s tokens OOV-like for {esc(b)}: {counts['oov_like'][direction(a, b)]}"
        f" of {counts['tokens'][a]}</li>"
        for a in view.names
        for b in view.names
        if a != b
    )
    lines = [
        f"<li>shared boundaries: {counts['shared_boundaries']} ({counts['shared_ratio']:.1%} of all boundaries)</li>"
    ]
    if agreement is not None:
        lines.append(
            f"<li>word-list agreement: {agreement.rate:.1%} of {agreement.words} common English words"
            " split identically</li>"
        )
    return (
        '<div class="tokdiff"><table><tr><th>model</th><th>tokens</th><th>boundaries</th>'
        f"<th>not shared by all</th></tr>{rows}</table><ul>{''.join(lines)}{directions}</ul></div>"
    )


def corpus_html(scan: CorpusScan, agreement: WordAgreement, overlap: dict) -> str:
    """The corpus scan's headline numbers next to the pair's word-list agreement and vocabulary overlap."""
    tokens = ", ".join(f"{esc(name)} {n:,}" for name, n in scan.tokens.items())
    shares = "".join(
        f"<li>{esc(name)}: {overlap['sizes'][name]:,} token strings, {overlap['share'][name]:.1%} of them shared</li>"
        for name in overlap["sizes"]
    )
    return (
        f'<div class="tokdiff"><ul><li>tokens in the corpus: {tokens}</li>'
        f"<li>words and punctuation runs that break at least once: {len(scan.spans):,} distinct</li>"
        f"<li>word-list agreement: {agreement.rate:.1%} of {agreement.words:,} common English words split "
        "identically</li>"
        f"<li>vocabulary overlap: {overlap['shared']:,} token strings in every vocabulary</li>{shares}</ul></div>"
    )


def token_length_figure(view: PairView) -> go.Figure:
    """How long each model's tokens are, in characters: shorter tokens on the same text mean more boundaries."""
    fig = go.Figure()
    for i, (name, tokens) in enumerate(view.tokens.items()):
        fig.add_histogram(
            x=[t.end - t.start for t in tokens],
            name=plot_label(name),
            marker_color=COLORS[i % len(COLORS)],
            xbins=dict(start=0.5, size=1),
        )
    fig.update_layout(
        template="none",
        barmode="group",
        height=300,
        margin=dict(l=52, r=20, t=40, b=44),
        title=dict(text="Token length per model", font=dict(size=14)),
        legend=dict(orientation="h", y=-0.22),
    )
    fig.update_xaxes(title="characters per token", dtick=1)
    fig.update_yaxes(title="tokens")
    return fig


def corpus_frame(scan: CorpusScan) -> pd.DataFrame:
    """The words and punctuation runs whose tokenizations disagree, most breaks first (sortable, CSV-ready)."""
    names = list(scan.tokens)
    return pd.DataFrame(
        [[r.span, r.count, r.breaks, r.breaks / r.count] + [r.pieces[n] for n in names] for r in scan.spans],
        columns=["span", "count", "breaks", "break rate"] + names,
    )


def rates_frame(scan: CorpusScan) -> pd.DataFrame:
    """OOV-like tokens per direction: how often one model's token ends where another has no boundary."""
    return pd.DataFrame(
        [[key, n, scan.oov_rate[key]] for key, n in scan.oov_like.items()],
        columns=["direction", "OOV-like tokens", "share of its tokens"],
    )


def words_frame(agreement: WordAgreement) -> pd.DataFrame:
    """The common words the tokenizers split differently, each model's pieces side by side."""
    names = list(agreement.differing[0].pieces) if agreement.differing else []
    rows = [[r.span] + [r.pieces[n] for n in names] for r in agreement.differing]
    return pd.DataFrame(rows, columns=["word"] + names)


def probe_frame(result: ProbeResult) -> pd.DataFrame:
    """The model's top-k after its own tokenization next to its top-k after the imposed one."""
    rows = [
        [rank, visible(a), pa, visible(b), pb]
        for rank, ((a, pa), (b, pb)) in enumerate(zip(result.top_canonical, result.top_imposed), start=1)
    ]
    return pd.DataFrame(rows, columns=["rank", "own tokenization", "p (own)", "imposed tokenization", "p (imposed)"])

"""Run view → HTML: the coloured transcript, its legend, the pinned-token details, metrics, status lines.

Every piece of model output or user input is escaped here (`esc`), never in templates. Transcript HTML
only grows by appending spans, which Gradio streams as "append" diffs.
"""

from __future__ import annotations

from ..contract.config import DecodeConfig
from ..contract.reasons import Decision, Reason
from ..run.damage import degenerate
from .text import esc, glyphs, quoted
from .view import RunView, TokenView

LEGEND = (
    ("acc", "single model", "drafted and committed; nothing checks it"),
    ("cons", "kept: unanimity", "every verifier's top token is its own token here"),
    ("cons mean", "kept: mean p > threshold", "dotted underline; the threshold is ½ unless the run set another"),
    ("oov", "not ensembled: OOV-like", "dashed outline; a verifier has no token boundary here"),
    ("ens", "ensembled, draft kept", "solid underline"),
    ("ens repl", "ensembled, replaced", "the struck-out draft precedes the ensemble's choice"),
    ("ens sharp", "ensemble sharpened", "double underline"),
    ("ens damage", "per-token damage", "dashed outline: OOV-like for another model after this commit"),
    ("forced", "forced (what-if)", "solid frame and a flag: you committed this text here"),
    ("diverge", "first difference", "a bar and ≠: the first token where a run and its what-if branch differ"),
)


def token_classes(t: TokenView) -> str:
    names = {
        "accepted": ["acc"],
        "skipped-consensus": ["cons"],
        "skipped-oov": ["oov"],
        "ensembled": ["ens"],
        "forced": ["forced"],
    }[t.decision]
    if Reason.parse(t.reason) is Reason.MEAN:
        names.append("mean")
    if t.changed:
        names.append("repl")
    if t.sharpened:
        names.append("sharp")
    if t.oov_like_for and t.decision != "skipped-oov":
        names.append("damage")
    if t.special:
        names.append("special")
    return " ".join(names)


CONSENSUS_DEFAULT = DecodeConfig().consensus_threshold  # traces recorded before the threshold was an option
EXPLAINED = {
    Reason.UNANIMITY: "kept: every verifier's top token is its own token here (unanimity)",
    Reason.MEAN: "kept: mean p {mean:.2f} > {threshold:g}, the consensus threshold",
    Reason.GATE: "kept: GaC's gate, the drafter's top p is at least 0.5",
    Reason.ACCEPTED: (
        "kept with probability {accept:.2f} = min(1, mean p / the drafter's p), as speculative sampling does"
    ),
    Reason.NO_TEXT: "not ensembled: a special token that writes no text, so no other model can see it",
    Reason.INSIDE_CHARACTER: (
        "not ensembled: the drafter is in the middle of spelling a character in bytes, where no other model has "
        "a position"
    ),
    Reason.BOUNDARY_MISSING: (
        "not ensembled: OOV-like for {models} (its tokenization has no boundary before this token)"
    ),
    Reason.RESAMPLED: (
        "ensembled: the draft was not kept (kept with probability {accept:.2f}), so the ensemble was sampled"
    ),
    Reason.NO_CONSENSUS: "ensembled: no consensus (mean p {mean:.2f} ≤ {threshold:g} and the top tokens differ)",
    Reason.BYTE_LEVEL: (
        "ensembled byte by byte: each of its bytes is the ensemble's choice over every model's exact next-byte "
        "distribution"
    ),
}
# A token whose trace names no reason (hand-made or cut short) is explained by its decision.
BY_DECISION = {Decision.SKIPPED_OOV: Reason.BOUNDARY_MISSING, Decision.ENSEMBLED: Reason.NO_CONSENSUS}


def why(t: TokenView, view: RunView) -> str:
    """What happened at this token and why, in one plain sentence."""
    verify = t.verify or {}
    mean, accept = verify.get("mean_p"), verify.get("accept_p") or 0
    reason = Reason.parse(t.reason) or BY_DECISION.get(t.decision)
    if t.decision == Decision.ACCEPTED:
        text = "committed as drafted: one model decodes alone and nothing checks it"
    elif t.decision == Decision.FORCED:
        text = "forced: you committed this text here" + (
            f" instead of {quoted(t.drafted)}" if t.drafted is not None else " (the strategy picked it too)"
        )
    elif t.decision == Decision.ENSEMBLED and view.strategy == "per-token":
        text = "ensembled: per-token ensembling runs every model at every step"
    elif reason is None:
        text = "kept"
    elif reason is Reason.NO_CONSENSUS and mean is None:
        text = "ensembled"
    else:
        threshold = ((view.started or {}).get("config") or {}).get("consensus_threshold", CONSENSUS_DEFAULT)
        text = EXPLAINED[reason].format(
            mean=mean or 0, accept=accept, threshold=threshold, models=", ".join(t.oov_like_for)
        )
    if t.decision == Decision.ENSEMBLED and t.point is not None:
        point = view.points[t.point]
        if t.drafted is not None:
            text += f"; the ensemble chose {quoted(point['chosen'])} over the draft {quoted(t.drafted)}"
        elif t.changed:
            text += f"; the ensemble overruled the drafter's own choice with {quoted(point['chosen'])}"
        else:
            text += "; the ensemble kept the drafter's token"
        if point["sharpening"]:
            text += f"; sharpened ({point['sharpening']}) because the ensemble was too flat (max p < 0.5)"
        text += method_note(point, view.models)
    if t.oov_like_for and t.decision != Decision.SKIPPED_OOV:
        text += f"; OOV-like for {', '.join(t.oov_like_for)}: its tokenizer would not split the text here"
    return text


def method_note(point: dict, models: list[str]) -> str:
    """What CoRE or EVA did at an ensemble point, as a clause of `why` (empty for the other methods and for
    traces recorded before the methods' fields)."""
    note = ""
    if point.get("model_weights"):
        weights = ", ".join(f"{name} {w:.2f}" for name, w in point["model_weights"].items())
        note += f"; CoRE weighed the models by consistency: {weights}"
    if point.get("joined") is not None:
        left_out = [name for name in models if name not in point["joined"]]
        note += f"; EVA left {', '.join(left_out)} out (its top token is in no other model's top)" if left_out else ""
    return note


def _tip(t: TokenView, view: RunView) -> str:
    lines = [f"#{t.index} {quoted(t.text)} · round {t.round}", why(t, view)]
    if t.index == view.diverge:
        lines.append("the first token where this run and the other run of the what-if differ")
    if t.draft:
        lines.append(f"drafter p {t.draft['p']:.3f}")
    if t.byte_steps:
        steps = [view.byte_steps[i] for i in t.byte_steps]
        lines.append("bytes: " + " · ".join(f"{quoted(s['chosen'])} p {s['p']:.3f}" for s in steps))
    for v in (t.verify or {}).get("verifiers", []):
        if v["oov_like"]:
            lines.append(f"{v['model']}: OOV-like")
        elif v["p"] is None:  # another verifier blocked this position, so it was not scored
            lines.append(f"{v['model']}: own {quoted(v['token'])}, not scored")
        else:
            lines.append(f"{v['model']}: own {quoted(v['token'])} p {v['p']:.3f}, top {quoted(v['argmax'])}")
    lines.append("click or Enter to pin")
    return "\n".join(lines)


def _pill_text(text: str) -> str:
    """Spaces stay spaces inside the pill; a token of only spaces, newlines and tabs get glyphs."""
    if text and not text.strip(" "):
        return f'<span class="ws">{"␣" * len(text)}</span>'
    return esc(text).replace("\t", '<span class="ws">→</span>\t').replace("\n", '<span class="ws">↵</span>\n')


def token_html(t: TokenView, view: RunView, pinnable: bool = True) -> str:
    was = f'<del class="was">{esc(glyphs(t.drafted))}</del>' if t.drafted is not None else ""  # glyphs: no line breaks
    attrs = f' tabindex="0" data-i="{t.index}"' if pinnable else ' tabindex="0"'
    classes = token_classes(t) + (" diverge" if t.index == view.diverge else "")
    return f'<span class="tok {classes}"{attrs} data-tip="{esc(_tip(t, view))}">{was}{_pill_text(t.text)}</span>'


def transcript_html(view: RunView, pinnable: bool = True) -> str:
    return "".join(token_html(t, view, pinnable) for t in view.tokens)


def legend_html() -> str:
    items = "".join(
        f'<span class="legend-item" title="{esc(note)}"><span class="tok {cls}">{esc(label)}</span></span>'
        for cls, label, note in LEGEND
    )
    return f'<div class="legend" role="list">{items}</div>'


def _fmt(value, spec: str, unit: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{unit}"


def metrics_html(view: RunView) -> str:
    if not view.started:
        return '<div class="metrics empty">No run yet: its numbers and damage appear here once it starts.</div>'
    m = view.metrics()
    cards = [
        ("tokens", str(m["tokens"])),
        ("E/T", f"{m['e_t']:.1%}"),
        ("OOV-like skips", str(m["oov_skips"])),
        ("consensus skips", str(m["consensus_skips"])),
        ("tokens/s", _fmt(m["tokens_per_s"], ".1f")),
        ("wall time", _fmt(m["wall_s"], ".1f", " s")),
    ]
    if view.strategy == "byte-level":
        cards[1:4] = [("bytes", str(m["bytes"])), ("passes/token", _fmt(m["passes_per_token"], ".1f"))]
    state = f"finished: {m['stop_reason']}" if m["stop_reason"] else "running…"
    prompts = "".join(
        f"<dt>{esc(name)}</dt><dd><pre>{esc(text)}</pre></dd>" for name, text in view.started["prompts"].items()
    )
    roles = ", ".join(f"{esc(x['name'])} ({x['role']})" for x in view.started["models"])
    damage = damage_text(view)
    return (
        '<div class="metrics">'
        + "".join(
            f'<div class="metric"><span class="value">{esc(v)}</span><span class="name">{esc(k)}</span></div>'
            for k, v in cards
        )
        + f'<div class="run-info"><b>{esc(view.label)}</b> · {roles} · {esc(state)}'
        + (f'<div class="damage-line"><b>Damage</b> · {esc(damage)}</div>' if damage else "")
        + f"<details><summary>prompt as each model sees it</summary><dl>{prompts}</dl></details></div></div>"
    )


def degeneration_text(measures: dict) -> str:
    """`damage.degenerate`'s verdict with the measures it looked at."""
    facts = (
        f"repeated 4-grams {measures['repeated_4gram_rate']:.0%}, longest token run {measures['longest_token_run']}, "
        f"longest line run {measures['longest_line_run']}, whitespace tokens {measures['whitespace_share']:.0%}, "
        f"U+FFFD {measures['replacement_chars']}"
    )
    return f"{'yes' if degenerate(measures) else 'none'} ({facts})"


def damage_text(view: RunView) -> str:
    """The run's damage measures in one line of plain text; empty for a trace recorded before runs measured damage."""
    d = view.damage_summary()
    if d is None:
        return ""
    kl = "—" if d["kl_mean"] is None else f"{d['kl_mean']:.3f} nats (mean of {d['kl_sampled']} measured)"
    parts = [
        f"drafter {d['drafter']} non-canonical {d['non_canonical']} (max {d['non_canonical_max']})",
        f"KL {kl}",
        f"OOV-like predictions {d['oov_like_predictions']}",
    ]
    if d["degeneration"] is not None:
        parts.append(f"degeneration: {degeneration_text(d['degeneration'])}")
    return " · ".join(parts)


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def details_html(view: RunView, index: int | None) -> str:
    """Everything the events say about one committed token (the click-to-pin panel)."""
    if index is None or not 0 <= index < len(view.tokens):
        return '<div class="details empty">Click a token (or focus it and press Enter) to pin its details here.</div>'
    t = view.tokens[index]
    parts = [
        f'<div class="details"><div class="head">{token_html(t, view, pinnable=False)} token #{t.index} · '
        f"round {t.round} · <b>{esc(t.decision)}</b></div>",
        f'<p class="why">{esc(why(t, view))}.</p>',
    ]
    if t.draft:
        rows = [
            [esc(quoted(c["text"])) + (" ◀ drafted" if c["text"] == t.draft["text"] else ""), f"{c['p']:.3f}"]
            for c in t.draft["top_k"]
        ]
        parts.append(f"<h4>drafter {esc(view.started['drafter'])}: top-{len(rows)}</h4>" + _table(["token", "p"], rows))
    if t.verify:
        rows = [
            [
                esc(v["model"]),
                "OOV-like" if v["oov_like"] else "yes",
                esc(quoted(v["token"])),
                _fmt(v["p"], ".3f"),
                esc(quoted(v["argmax"])),
                {True: "yes", False: "no", None: "—"}[v["agrees"]],
            ]
            for v in t.verify["verifiers"]
        ]
        parts.append(
            "<h4>verifiers at the boundary before it</h4>"
            + _table(["model", "boundary", "own token", "p", "top token", "agrees"], rows)
        )
        parts.append(
            f"<p>mean p: {_fmt(t.verify['mean_p'], '.3f')} · decision: {esc(t.verify['decision'])} "
            f"({esc(t.verify['reason'] or '')})</p>"
        )
    if t.point is not None:
        parts.append(_ensemble_tables(view.points[t.point]))
    if t.byte_steps:
        parts.append(_byte_table(view, t))
    parts.append(_damage_table(view, t))
    return "".join(parts) + "</div>"


def _byte_table(view: RunView, t: TokenView) -> str:
    """Each byte of a byte-level token: the ensemble's choice, each model's own p of it, the covering paths
    each model kept after it (tokens past its trunk) and the forward passes it cost."""
    steps = [view.byte_steps[i] for i in t.byte_steps]
    names = [m["model"] for m in steps[0]["models"]]
    rows = []
    for step in steps:
        own = next((c["per_model"] for c in step["candidates"] if c["text"] == step["chosen"]), {})
        cells = [esc(quoted(step["chosen"])), f"{step['p']:.3f}"]
        cells += [_fmt(own.get(n), ".3f") for n in names]
        cells += [
            "<br>".join(esc(" ".join(quoted(piece) for piece in path)) or "∅" for path in m["paths"])
            + f" <small>({m['passes']} pass{'es' if m['passes'] != 1 else ''})</small>"
            for m in step["models"]
        ]
        rows.append(cells)
    head = ["byte", "ensemble p"] + [f"{esc(n)} p" for n in names] + [f"{esc(n)}: paths kept" for n in names]
    return f"<h4>bytes chosen ({esc(steps[0]['combine'])} of the models' next-byte distributions)</h4>" + _table(
        head, rows
    )


def _ensemble_tables(point: dict) -> str:
    """An ensemble point's union table (with CoRE's token scores when it ran) and EVA's mapped tokens."""
    table = point["table"][:8]
    names = list(table[0]["per_model"]) if table else []
    scored = [n for n in names if table and table[0].get("scores")]
    rows = [
        [esc(quoted(r["text"]))]
        + [f"{r['per_model'][n]:.3f}" for n in names]
        + [f"{r['scores'][n]:.2f}" for n in scored]
        + [f"{r['before']:.3f}", _fmt(r["after"], ".3f")]
        for r in table
    ]
    weights = point.get("model_weights")
    head = ["union token"] + [esc(n) for n in names] + [f"score {esc(n)}" for n in scored] + ["ensemble", "sharpened"]
    html = (
        f"<h4>ensemble ({esc(point['method'])}): chose {esc(quoted(point['chosen']))}, "
        f"sharpening {esc(point['sharpening'] or 'not needed')}</h4>"
        + (
            "<p>CoRE's model weights (after the anchor clip): "
            + esc(", ".join(f"{name} {w:.3f}" for name, w in weights.items()))
            + "; a score is a model's token consistency (1 on average over its candidates)</p>"
            if weights
            else ""
        )
        + _table(head, rows)
    )
    mapped = point.get("mapped")
    if mapped:
        rows = [
            [
                esc(m["model"]),
                esc(quoted(m["text"])),
                f"{m['p']:.3f}",
                esc(", ".join(f"{quoted(c['text'])} {c['p']:.2f}" for c in m["targets"]) or "nothing"),
            ]
            for m in mapped
        ]
        joined = ", ".join(point.get("joined") or [])
        html += (
            f"<h4>EVA: the assisting models' top tokens in the drafter's vocabulary (joined the mean: {esc(joined)})"
            "</h4>" + _table(["model", "token", "p", "maps to (alignment weight)"], rows)
        )
    return html


def _kl_cell(m: dict) -> str:
    if m["kl"] is not None:
        return f"{m['kl']:.3f} nats"
    return "not measured (budget spent)" if m.get("kl_eligible") else "—"


def _damage_table(view: RunView, t: TokenView) -> str:
    """Each model's damage measured after the commit that holds `t` (nothing for older traces)."""
    damage = view.damage_after(t.index)
    if damage is None:
        return ""
    rows = [
        [esc(name), str(m["non_canonical"]), _kl_cell(m), "yes" if m["oov_like"] else "no"]
        for name, m in damage["models"].items()
    ]
    steps = view.started["config"].get("damage_kl_steps")
    note = (
        f"KL is measured only where a context is non-canonical, at most {steps} times a run; — where it was not"
        if steps is not None
        else ""
    )
    return (
        f"<h4>damage after the commit that holds it ({damage['tokens']} tokens committed)</h4>"
        + _table(["model", "non-canonical context tokens", "KL to the canonical context", "OOV-like here"], rows)
        + (f'<p class="note">{esc(note)}.</p>' if note else "")
    )


def run_card_html(view: RunView, pinnable: bool = False) -> str:
    """One strategy's transcript with its key numbers (a column of the Compare tab, where tokens show their
    details on hover; a comparison page also pins them on a click)."""
    m = view.metrics()
    numbers = (
        f"{m['tokens']} tokens · E/T {m['e_t']:.0%} · OOV-like skips {m['oov_skips']} · "
        f"{_fmt(m['wall_s'], '.1f', ' s')}"
    )
    if view.strategy == "per-token":
        numbers += f" · <b>OOV-like damage {m['damaged']}</b>"
    if view.strategy == "byte-level":
        numbers += f" · {m['bytes']} bytes · <b>{_fmt(m['passes_per_token'], '.1f')} passes/token</b>"
        numbers += f" · over {esc(', '.join(view.models))}"
    damage = view.damage_summary()
    if damage is not None:
        numbers += f" · drafter non-canonical {damage['non_canonical']} (max {damage['non_canonical_max']})"
    return (
        f'<div class="card"><div class="card-head"><b>{esc(view.label)}</b><span>{numbers}</span></div>'
        f'<div class="transcript">{transcript_html(view, pinnable)}</div></div>'
    )


def compare_html(views: list[RunView]) -> str:
    if not views:
        return '<div class="cmp-grid empty">Press Compare to run every strategy on the prompt.</div>'
    return '<div class="cmp-grid">' + "".join(run_card_html(v) for v in views) + "</div>"


def status_html(message: str, level: str = "info") -> str:
    """One line above the transcript: info, busy, warn (bad input) or error."""
    return f'<div class="status {level}" role="status">{esc(message)}</div>'

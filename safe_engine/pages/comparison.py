"""A comparison's numbers in words and a table: what it measured (built from its numbers only, never a
general claim) and one row of metrics per finished run, for the app's Compare tab and for a comparison page."""

from __future__ import annotations

import pandas as pd

from ..orchestration.comparison import ratios
from ..run.damage import degenerate
from .text import esc
from .transcript import degeneration_text
from .view import RunView


def metrics_frame(summaries: list[dict], views: dict[str, RunView], drafter: str) -> pd.DataFrame:
    """One row per finished run; time relative to the drafter alone once that run is in; damage columns
    empty for runs recorded before the engine measured damage."""
    relative = ratios(summaries, drafter) if any(s["label"] == f"single:{drafter}" for s in summaries) else {}
    rows = []
    for s in summaries:
        damage = views[s["label"]].damage_summary() or {}
        degeneration = damage.get("degeneration") or {}
        kl = damage.get("kl_mean")
        rows.append(
            {
                "run": s["label"],
                "tokens": s["tokens"],
                "E/T": round(s["e_t"], 3),
                "ensembled": s["ensembled"],
                "replaced": s["replaced"],
                "OOV-like skips": sum(s["oov_skips"].values()),
                "OOV-like damage": views[s["label"]].metrics()["damaged"],
                "consensus skips": sum(s["consensus_skips"].values()),
                "wall s": round(s["wall_s"], 2),
                "tokens/s": round(s["tokens_per_s"], 2),
                "passes/token": _rounded(s["stats"].get("passes_per_token")),  # runs recorded before: none
                "× drafter time": round(relative[s["label"]], 2) if s["label"] in relative else None,
                "drafter non-canonical": damage.get("non_canonical"),
                "drafter non-canonical max": damage.get("non_canonical_max"),
                "KL mean (nats)": None if kl is None else round(kl, 4),
                "OOV-like predictions": damage.get("oov_like_predictions"),
                "degenerated": None if not degeneration else ("yes" if degenerate(degeneration) else "no"),
                "repeated 4-gram rate": _rounded(degeneration.get("repeated_4gram_rate")),
                "longest token run": degeneration.get("longest_token_run"),
                "longest line run": degeneration.get("longest_line_run"),
                "whitespace share": _rounded(degeneration.get("whitespace_share")),
                "U+FFFD": degeneration.get("replacement_chars"),
                "stop": s["stop_reason"],
                "text": s["text"],
            }
        )
    return pd.DataFrame(rows)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def measured_html(summaries: list[dict], views: dict[str, RunView], drafter: str) -> str:
    """What this comparison measured, in sentences built from its numbers only (finished runs)."""
    by = {s["label"]: s for s in summaries}
    relative = ratios(summaries, drafter) if f"single:{drafter}" in by else {}
    lines = []
    for label, name in (("safe", "SAFE"), ("per-token", "Per-token")):
        if label not in by:
            continue
        s = by[label]
        line = f"<b>{name}</b> ensembled {s['ensembled']} of {s['tokens']} tokens (E/T {s['e_t']:.0%})"
        if label in relative:
            base = by[f"single:{drafter}"]["wall_s"]
            line += (
                f" and took {relative[label]:.2f}× the wall time of {esc(drafter)} alone"
                f" ({s['wall_s']:.1f} s vs {base:.1f} s)"
            )
        lines.append(line + ".")
    damage = {label: views[label].damage_summary() for label in ("per-token", "safe") if label in by}
    if len(damage) == 2 and None not in damage.values():
        lines += _damage_sentences(damage["per-token"], damage["safe"], drafter)
    if not lines:
        return ""
    items = "".join(f"<li>{line}</li>" for line in lines)
    return f'<div class="measured"><h3>What this comparison measured</h3><ul>{items}</ul></div>'


def _damage_sentences(per_token: dict, safe: dict, drafter: str) -> list[str]:
    """Per-token's and SAFE's damage side by side, then a verdict worded from how the two compare (count of
    non-canonical context tokens at the worst point plus OOV-like predictions), never a general claim."""

    def kl(d: dict) -> str:
        if d["kl_sampled"]:
            return f"{d['kl_mean']:.3f} nats (mean of {d['kl_sampled']} measured steps, max {d['kl_max']:.3f})"
        return "none, its context stayed canonical" if d["non_canonical_max"] == 0 else "not measured"

    lines = [
        f"{esc(drafter)}'s context ended with {per_token['non_canonical']} non-canonical tokens under per-token "
        f"(at most {per_token['non_canonical_max']}) and {safe['non_canonical']} under SAFE "
        f"(at most {safe['non_canonical_max']}).",
        f"Conditioning damage (KL to the canonical context): per-token {kl(per_token)}; SAFE {kl(safe)}.",
        f"OOV-like predictions: per-token {per_token['oov_like_predictions']}, SAFE {safe['oov_like_predictions']}.",
    ]
    if per_token["degeneration"] is not None and safe["degeneration"] is not None:
        lines.append(
            f"Degeneration: per-token {esc(degeneration_text(per_token['degeneration']))}; "
            f"SAFE {esc(degeneration_text(safe['degeneration']))}."
        )
    hurt = {
        name: d["non_canonical_max"] + d["oov_like_predictions"]
        for name, d in (("per-token", per_token), ("safe", safe))
    }
    if hurt["per-token"] == hurt["safe"] == 0:
        lines.append(
            "On this prompt neither ensemble left a non-canonical context or made an OOV-like prediction; "
            "prompts where the tokenizers cut words differently (rare names, code) are where they can differ."
        )
    elif hurt["safe"] == 0:
        lines.append("Here SAFE avoided the damage per-token ensembling did.")
    elif hurt["safe"] < hurt["per-token"]:
        lines.append("Here SAFE left less of this damage than per-token ensembling, but not none.")
    else:
        lines.append("Here SAFE was not less damaged than per-token ensembling.")
    return lines

"""Token text made safe and readable: every string a model or a person typed goes through here before
it reaches HTML or a Plotly label."""

from __future__ import annotations

import html

from ..tokenization.alignment import visible


def esc(text: str) -> str:
    """Escape for HTML text and attribute values."""
    return html.escape(text, quote=True)


def glyphs(text: str) -> str:
    """Whitespace made visible, for places that show one token on its own (tooltips, tables, chart labels)."""
    return visible(text) if text else "∅"


def quoted(text: str | None) -> str:
    return "—" if text is None else f"“{glyphs(text)}”"


def plot_label(text: str) -> str:
    """Plotly reads <b>, <br>, <a> in labels as markup and decodes only a few entities (not &quot;)."""
    return html.escape(glyphs(text), quote=False)

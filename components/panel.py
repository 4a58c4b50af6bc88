"""The view of one run (metrics, legend, transcript, pinned details, four charts), shared by the Live,
What-if and Replay views so a recorded trace looks exactly like the run that produced it."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from safe_engine.analysis.tokdiff import load_vocabs, pair_view
from safe_engine.contract.errors import SafeEngineError
from safe_engine.pages import charts
from safe_engine.pages.text import esc, quoted
from safe_engine.pages.transcript import details_html, legend_html, metrics_html, transcript_html
from safe_engine.pages.view import RunView

from .tokenizer_view import pair_view_html

CONTEXT_CHARS = 200  # the pinned OOV-like token's words shown on the tokenizers' ruler

# Clicking a token (or Enter/Space on a focused one) pins it: a custom `pin` event handled in Python.
PIN_JS = """
const pin = (t) => {
  element.querySelectorAll('.tok.pinned').forEach((x) => x.classList.remove('pinned'));
  t.classList.add('pinned');
  trigger('pin', {idx: Number(t.dataset.i)});
};
element.addEventListener('click', (e) => { const t = e.target.closest('.tok[data-i]'); if (t) pin(t); });
element.addEventListener('keydown', (e) => {
  const t = e.target.closest('.tok[data-i]');
  if (t && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); pin(t); }
});
"""


class RunPanel:
    """`plots=False` leaves out the four charts (the what-if branch shows only its damage next to the
    original's); `charts_apart=True` leaves them for the caller to place with `charts()` (Replay puts them
    under two runs side by side); `below_details` builds more components right under the pinned details."""

    def __init__(
        self,
        name: str,
        view: RunView | None = None,
        plots: bool = True,
        below_details: Callable[[], None] | None = None,
        charts_apart: bool = False,
    ):
        self.name, self.plots = name, plots
        self._view = view = view or RunView()
        self.view = gr.State(view)
        self.metrics = gr.HTML(metrics_html(view), elem_id=f"{name}-metrics")
        gr.HTML(legend_html(), elem_id=f"{name}-legend")
        self.transcript = gr.HTML(
            transcript_html(view),
            html_template='<div class="transcript">${value}</div>',
            js_on_load=PIN_JS,
            elem_id=f"{name}-transcript",
            autoscroll=True,
        )
        self.details = gr.HTML(details_html(view, None), elem_id=f"{name}-details")
        if below_details:
            below_details()
        if not plots:
            self._wire_pin()
        elif not charts_apart:
            self.charts()

    def charts(self) -> None:
        """The four charts, built where the caller is (RunPanel's own place unless `charts_apart`)."""
        view, name = self._view, self.name
        with gr.Row():
            self.timeline = gr.Plot(charts.timeline(view), show_label=False, elem_id=f"{name}-timeline")
            self.progress = gr.Plot(charts.progress(view), show_label=False, elem_id=f"{name}-progress")
        with gr.Row():
            self.union = gr.Plot(charts.union(view), show_label=False, elem_id=f"{name}-union")
            self.split = gr.Plot(charts.time_split(view), show_label=False, elem_id=f"{name}-split")
        self._wire_pin()

    def _wire_pin(self) -> None:
        self.transcript.pin(
            self._pin, [self.view], [self.details, *([self.union] if self.plots else [])], api_visibility="private"
        )

    @property
    def outputs(self) -> list:
        plots = [self.timeline, self.progress, self.union, self.split] if self.plots else []
        return [self.view, self.metrics, self.transcript, self.details, *plots]

    def show(self, view: RunView, with_charts: bool = True) -> dict:
        """Outputs for `view`; charts only when `with_charts` (they are costly to remount in the browser)."""
        out = {self.view: view, self.metrics: metrics_html(view), self.transcript: transcript_html(view)}
        if with_charts and self.plots:
            out |= {
                self.timeline: charts.timeline(view),
                self.progress: charts.progress(view),
                self.union: charts.union(view, view.pinned_point()),
                self.split: charts.time_split(view),
            }
        return out

    def fresh(self, view: RunView, with_charts: bool = True) -> dict:
        """A new run (or trace) replaces the old one, pinned details included."""
        return self.show(view, with_charts) | {self.details: details_html(view, view.pinned)}

    def _pin(self, view: RunView, evt: gr.EventData) -> dict:
        """The run's own view object remembers the pin, so a live run keeps charting the pinned point."""
        view.pinned = int(evt.idx)
        point = view.pinned_point()
        out = {self.details: details_html(view, view.pinned) + tokenizations_html(view, view.pinned)}
        if self.plots and point is not None:
            out[self.union] = charts.union(view, point)
        return out


def tokenizations_html(view: RunView, index: int) -> str:
    """For a token that is OOV-like for some model: every model's tokens over the words around it (the
    Tokenizers tab's view), so the missing boundary is visible where it happened. Tokenizers only."""
    if not 0 <= index < len(view.tokens) or not view.tokens[index].oov_like_for:
        return ""
    token, specs = view.tokens[index], [m.get("spec") for m in view.started["models"]]
    if None in specs:  # a trace from before runs recorded their specs
        return ""
    text, offset = view.context(index, CONTEXT_CHARS)
    head = (
        f"<h4>every model's tokens around {esc(quoted(token.text))} (characters {token.start - offset}–"
        f"{token.end - offset} below)</h4>"
    )
    try:
        return f'<div class="details">{head}{pair_view_html(pair_view(text, load_vocabs(specs)))}</div>'
    except SafeEngineError as exc:
        return f'<div class="details">{head}<p>Could not load the tokenizers: {esc(str(exc))}.</p></div>'

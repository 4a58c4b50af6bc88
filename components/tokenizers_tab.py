"""The "Tokenizers" tab: where the models' tokenizers cut one text differently (tokenizers only, no weights).
It mounts the tokenizer debugger's renderers (`tokenizer_view`) on the engine's `tokdiff`."""

from __future__ import annotations

import gradio as gr

from safe_engine.errors import ConfigError, SafeEngineError
from safe_engine.tokdiff import load_vocabs, pair_view

from . import charts
from .runner import problem
from .settings import MAX_PROMPT_CHARS, parse_specs
from .tokenizer_view import pair_view_html, stats_html, token_length_figure
from .transcript import status_html


class TokenizersTab:
    def __init__(self, models: gr.Textbox, examples: list[dict]):
        with gr.Tab("Tokenizers", id="tokenizers"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    text = gr.Textbox(label="Text", lines=4, max_lines=12, elem_id="tok-text",
                                      info="Uses the models of the Ensemble live tab; loads only their tokenizers.")
                    gr.Examples([[e["prompt"]] for e in examples], [text], example_labels=[e["label"] for e in examples])
                    show = gr.Button("Show tokenizations", variant="primary", elem_id="tok-run")
                with gr.Column(scale=3):
                    self.status = gr.HTML(status_html("Type a text to see each model's tokens on one character ruler."), elem_id="tok-status")
                    self.pair = gr.HTML(elem_id="tok-pair")
                    self.stats = gr.HTML(elem_id="tok-stats")
                    self.lengths = gr.Plot(charts.placeholder("Token length per model", "appears with the tokenizations"), show_label=False)
        show.click(self.show, [text, models], [self.status, self.pair, self.stats, self.lengths], api_name="tokenizers")

    def show(self, text: str, models_text: str) -> dict:
        try:
            if not (text or "").strip() or len(text) > MAX_PROMPT_CHARS:
                raise ConfigError(f"type a text of 1 to {MAX_PROMPT_CHARS} characters")
            view = pair_view(text, load_vocabs(parse_specs(models_text)))
        except SafeEngineError as exc:
            return problem(self.status, exc, "compare the tokenizers")
        summary = status_html("Green boundaries: every model cuts there; dashed orange: only some do. Hover a token for its ids and offsets.")
        return {self.status: summary, self.pair: pair_view_html(view), self.stats: stats_html(view), self.lengths: token_length_figure(view)}

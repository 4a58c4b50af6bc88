"""The "Tokenizers" tab: where the models' tokenizers cut one text differently, and over a whole corpus which
words break most often (tokenizers only, no weights). It mounts the tokenizer debugger's renderers
(`tokenizer_view`) on the engine's `tokdiff`."""

from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from safe_engine.analysis.tokdiff import corpus_scan, load_vocabs, pair_view, vocab_overlap, word_agreement
from safe_engine.contract.errors import ConfigError, SafeEngineError
from safe_engine.pages import charts
from safe_engine.pages.transcript import status_html

from .run_stream import problem
from .settings import MAX_PROMPT_CHARS, parse_specs
from .tokenizer_view import corpus_frame, corpus_html, pair_view_html, rates_frame, stats_html, token_length_figure

MAX_CORPUS_CHARS = 500_000  # a scan of this many characters takes a few seconds on 2 CPU cores
NOT_SHOWN = '<p class="empty-state">Each model\'s tokens of the text, on one character ruler, appear here.</p>'
NOT_SCANNED = (
    '<p class="empty-state">A corpus scan\'s OOV-like rates per direction and the words that break most often '
    "appear here.</p>"
)


def corpus_text(pasted: str | None, path: str | None) -> str:
    """The uploaded file if there is one, else the pasted text; bounded so a scan stays a matter of seconds."""
    if path:
        if Path(path).stat().st_size > 4 * MAX_CORPUS_CHARS:  # UTF-8: at most 4 bytes a character
            raise ConfigError(f"the file is larger than the {MAX_CORPUS_CHARS:,} characters a scan takes here")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ConfigError("the file is not UTF-8 text") from None
    else:
        text = pasted or ""
    if not text.strip():
        raise ConfigError("paste a text or upload a .txt file to scan")
    if len(text) > MAX_CORPUS_CHARS:
        raise ConfigError(f"the corpus is {len(text):,} characters; the limit here is {MAX_CORPUS_CHARS:,}")
    return text


class TokenizersTab:
    def __init__(self, models: gr.Textbox, examples: list[dict]):
        with gr.Tab("Tokenizers", id="tokenizers"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    text = gr.Textbox(
                        label="Text",
                        lines=4,
                        max_lines=12,
                        elem_id="tok-text",
                        info="Uses the models of the Ensemble live tab; loads only their tokenizers.",
                    )
                    gr.Examples([[e["text"]] for e in examples], [text], example_labels=[e["label"] for e in examples])
                    show = gr.Button("Show tokenizations", variant="primary", elem_id="tok-run")
                    gr.Markdown("### Corpus scan\nWhich words break most often over a longer text, in both directions.")
                    corpus = gr.Textbox(label="Corpus", lines=6, max_lines=12, elem_id="tok-corpus")
                    upload = gr.File(
                        label="…or a text file (UTF-8 .txt; used instead of the box)",
                        file_types=[".txt"],
                        elem_id="tok-upload",
                    )
                    scan = gr.Button("Scan corpus", elem_id="tok-scan")
                    self.csv = gr.DownloadButton("Breaking spans (CSV)", interactive=False, elem_id="tok-csv")
                with gr.Column(scale=3):
                    self.status = gr.HTML(
                        status_html("Type a text to see each model's tokens on one character ruler."),
                        elem_id="tok-status",
                    )
                    self.pair = gr.HTML(NOT_SHOWN, elem_id="tok-pair")
                    self.stats = gr.HTML(elem_id="tok-stats")
                    self.lengths = gr.Plot(
                        charts.placeholder("Token length per model", "appears with the tokenizations"), show_label=False
                    )
                    self.summary = gr.HTML(NOT_SCANNED, elem_id="tok-summary")
                    with gr.Column(visible=False) as self.tables:  # opened by the first scan
                        self.rates = gr.Dataframe(
                            label="OOV-like tokens per direction", interactive=False, elem_id="tok-rates"
                        )
                        self.spans = gr.Dataframe(
                            label="Words and punctuation runs that break most often (click a header to sort)",
                            interactive=False,
                            max_height=420,
                            elem_id="tok-spans",
                        )
        show.click(self.show, [text, models], [self.status, self.pair, self.stats, self.lengths], api_name="tokenizers")
        scan.click(
            self.scan,
            [corpus, upload, models],
            [self.status, self.summary, self.tables, self.rates, self.spans, self.csv],
            api_name="tokenizers_scan",
        )

    def show(self, text: str, models_text: str) -> dict:
        try:
            if not (text or "").strip() or len(text) > MAX_PROMPT_CHARS:
                raise ConfigError(f"type a text of 1 to {MAX_PROMPT_CHARS} characters")
            view = pair_view(text, load_vocabs(parse_specs(models_text)))
        except SafeEngineError as exc:
            return problem(self.status, exc, "compare the tokenizers")
        summary = status_html(
            "Green boundaries: every model cuts there; dashed orange: only some do. "
            "Hover a token for its ids and offsets."
        )
        return {
            self.status: summary,
            self.pair: pair_view_html(view),
            self.stats: stats_html(view),
            self.lengths: token_length_figure(view),
        }

    def scan(self, pasted: str, path: str | None, models_text: str) -> dict:
        try:
            text = corpus_text(pasted, path)
            vocabs = load_vocabs(parse_specs(models_text))
            result = corpus_scan(pair_view(text, vocabs))
        except SafeEngineError as exc:
            return problem(self.status, exc, "scan the corpus")
        frame = corpus_frame(result)
        csv = Path(tempfile.mkdtemp(prefix="safe-tokdiff-")) / "breaking-spans.csv"
        frame.to_csv(csv, index=False)
        return {
            self.status: status_html(
                f"Scanned {len(text):,} characters: {len(frame):,} distinct spans break at least once."
            ),
            self.summary: corpus_html(result, word_agreement(vocabs), vocab_overlap(vocabs)),
            self.tables: gr.Column(visible=True),
            self.rates: rates_frame(result).round(3),
            self.spans: frame.round(3),  # the CSV keeps full precision
            self.csv: gr.DownloadButton(value=str(csv), interactive=True),
        }

"""The "Ensemble live" tab: the run form, Run/Stop, and one run streamed into a RunPanel."""

from __future__ import annotations

import gradio as gr

from safe_engine.contract.config import METHODS, SHARPENING
from safe_engine.orchestration.many_runs import decode_ahead
from safe_engine.pages.page import run_page
from safe_engine.pages.traces import save_trace
from safe_engine.pages.transcript import status_html
from safe_engine.pages.view import RunView
from safe_engine.strategies.decoding import PER_TOKEN_COMMITS, SAFE_MODES, DecodeConfig

from . import settings
from .downloads import page_file
from .examples import Examples, gallery
from .panel import RunPanel
from .run_stream import MODELS_QUEUE, Runner, sharing_html
from .whatif import Origin, WhatIf

READY = (
    "Pick an example or type a prompt, then press Run. "
    "Hover a token for what happened to it; click it to pin the details."
)
DEFAULTS = DecodeConfig()


class LiveTab:
    def __init__(self, runner: Runner, specs: list[str], examples: Examples):
        self.runner = runner
        with gr.Tab("Ensemble live", id="live"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    self.prompt = gr.Textbox(label="Prompt", lines=3, max_lines=12, elem_id="prompt")
                    max_new = gr.Number(
                        48,
                        label=f"Max new tokens (1–{settings.MAX_NEW_TOKENS})",
                        precision=0,
                        elem_id="max-new",
                        render=False,
                    )
                    stop_at = gr.Textbox(
                        "",
                        label="Stop at (one per line; \\n is a line break)",
                        lines=1,
                        max_lines=4,
                        elem_id="stop-at",
                        render=False,
                    )
                    gallery(examples.live, examples.cannot_show, self.prompt, max_new, stop_at)
                    with gr.Row():
                        run = gr.Button("Run", variant="primary", elem_id="run")
                        stop = gr.Button("Stop", variant="stop", elem_id="stop")
                    models = gr.Textbox(
                        "\n".join(specs),
                        label="Models (one spec per line)",
                        lines=2,
                        elem_id="models",
                        info="embedded:NAME, a local folder, a .gguf file or a hub id",
                    )
                    drafter = gr.Dropdown(
                        specs, value=specs[0], label="Drafter", allow_custom_value=True, elem_id="drafter"
                    )
                    strategy = gr.Radio(
                        ["safe", "per-token", "single"], value="safe", label="Strategy", elem_id="strategy"
                    )
                    max_new.render()
                    stop_at.render()
                    lookahead = gr.Slider(
                        1, 16, DEFAULTS.lookahead, step=1, label="Lookahead n (tokens drafted per round)"
                    )
                    top_k = gr.Slider(1, 50, DEFAULTS.ensemble.top_k, step=1, label="Top-k per model in the union")
                    sharpen = gr.Radio(
                        list(SHARPENING),
                        value=DEFAULTS.ensemble.sharpen,
                        label="Sharpening (when the ensemble's max p < 0.5)",
                    )
                    sharpen_lambda = gr.Slider(
                        0.01, 0.99, DEFAULTS.ensemble.sharpen_lambda, step=0.01, label="Heuristic λ"
                    )
                    with gr.Accordion("More options", open=False):
                        method = gr.Radio(list(METHODS), value=DEFAULTS.ensemble.method, label="Ensemble method")
                        gate = gr.Radio(
                            list(settings.GATES),
                            value="auto",
                            label="GaC's gate",
                            info="ensemble only where the drafter's top p < 0.5; auto: on for gac, as the paper "
                            "runs it",
                        )
                        safe_mode = gr.Radio(
                            list(SAFE_MODES),
                            value=DEFAULTS.safe_mode,
                            label="SAFE mode",
                            info="exact: one ensemble per round, the rest of the draft dropped (the paper); "
                            "fast: keeps scanning a draft the ensemble confirmed (a little faster, can change some "
                            "outputs; see docs/algorithm.md)",
                        )
                        draft_gate = gr.Number(
                            DEFAULTS.draft_gate,
                            label="SAFE draft gate τ",
                            minimum=0,
                            maximum=0.99,
                            step=0.05,
                            info="end a draft right after a token the drafter gives p < τ (0: the paper's full "
                            "drafts; a gate is faster and rarely changes the output, see docs/algorithm.md)",
                            elem_id="draft-gate",
                        )
                        per_token_commit = gr.Radio(
                            list(PER_TOKEN_COMMITS),
                            value=DEFAULTS.per_token_commit,
                            label="Per-token commit",
                            info="first-subtoken: the drafter appends only its first piece of the ensemble's "
                            "string, as UniTE does; full: its whole spelling (a gentler baseline)",
                        )
                        temperature = gr.Number(
                            DEFAULTS.temperature,
                            label="Temperature (0 = greedy, the paper's setting)",
                            minimum=0,
                            elem_id="temperature",
                        )
                        top_p = gr.Slider(0.05, 1.0, DEFAULTS.top_p, step=0.05, label="Top-p (when sampling)")
                        seed = gr.Number(
                            None, label="Seed (empty: a fresh one; the run reports it)", precision=0, elem_id="seed"
                        )
                    with gr.Row():
                        self.download = gr.DownloadButton(
                            "Download trace (JSONL)", interactive=False, elem_id="live-download"
                        )
                        self.page = gr.DownloadButton("Download page (HTML)", interactive=False, elem_id="live-page")
                with gr.Column(scale=3):
                    self.status = gr.HTML(status_html(READY), elem_id="live-status")
                    self.sharing = gr.HTML("", elem_id="live-sharing")
                    self.whatif = WhatIf(runner)
                    self.panel = RunPanel("live", below_details=self.whatif.controls)
                    self.whatif.section()
        self.form = settings.Form(
            models_text=models,
            drafter=drafter,
            strategy=strategy,
            max_new_tokens=max_new,
            lookahead=lookahead,
            top_k=top_k,
            sharpen=sharpen,
            sharpen_lambda=sharpen_lambda,
            method=method,
            safe_mode=safe_mode,
            draft_gate=draft_gate,
            per_token_commit=per_token_commit,
            gate=gate,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop_at,
        )
        self.models = models
        models.change(
            lambda text: gr.Dropdown(choices=settings.parse_specs(text)), [models], [drafter], api_visibility="private"
        )
        live_run = run.click(
            self.run,
            [self.prompt, *self.form.inputs],
            [self.status, self.sharing, self.download, self.page, *self.panel.outputs, self.whatif.origin],
            api_name="generate",
            **MODELS_QUEUE,
        )
        runner.stop_button(stop, api_name="stop")
        self.whatif.wire(self.panel)
        self.whatif.follow(live_run)

    def run(self, request: gr.Request, prompt: str, *values):
        view, loaded = RunView(), []

        def start(models, config: DecodeConfig, flag):
            loaded[:] = models
            events = decode_ahead(models, prompt, config, flag)
            origin = Origin(prompt, tuple(m.spec.spec for m in models), config)
            names = ", ".join(m.name for m in models)
            first = {
                self.status: status_html(f"Running {config.strategy} on {names}…", "busy"),
                self.download: gr.DownloadButton(interactive=False),
                self.page: gr.DownloadButton(interactive=False),
            }
            return events, first | self.panel.fresh(view) | {self.whatif.origin: origin}

        def step(event, pace) -> dict | None:
            view.add(event.to_dict())
            if event.kind == "text_committed" and pace.frame():
                return {self.sharing: sharing_html(loaded)} | self.panel.show(view, with_charts=pace.charts())
            return None

        def finish(broke_off: str | None, _stopped: bool) -> dict:
            if broke_off is None:
                outcome = status_html(_finished(view))
            else:
                outcome = status_html(f"The run broke off: {broke_off}. The transcript so far is kept.", "error")
            trace = save_trace(view.events, f"{view.label}-trace")
            page = page_file(run_page(view.events), f"{view.label}-page")
            return {
                self.status: outcome,
                self.sharing: sharing_html(loaded),
                self.download: gr.DownloadButton(value=trace, interactive=True),
                self.page: gr.DownloadButton(value=page, interactive=True),
            } | self.panel.show(view)

        def check():
            return settings.build(prompt, self.form.read(values))

        yield from self.runner.stream(request.session_hash, self.status, "start the run", check, start, step, finish)


def _finished(view: RunView) -> str:
    m = view.metrics()
    reason = {
        "eos": "the model ended its answer",
        "stop": "a stop sequence ended it",
        "max_new_tokens": "max new tokens reached",
        "stopped": "stopped",
    }.get(m["stop_reason"], m["stop_reason"])
    return (
        f"Done ({reason}): {m['tokens']} tokens, E/T {m['e_t']:.1%}, {m['tokens_per_s'] or 0:.1f} tokens/s. "
        "Click a token for its details, or to branch from it."
    )

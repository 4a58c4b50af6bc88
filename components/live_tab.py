"""The "Ensemble live" tab: the run form, Run/Stop, and one run streamed into a RunPanel."""

from __future__ import annotations

import gradio as gr

from safe_engine.options import OPTIONS
from safe_engine.orchestration.many_runs import decode_ahead
from safe_engine.pages.page import run_page
from safe_engine.pages.traces import save_trace
from safe_engine.pages.transcript import status_html
from safe_engine.pages.view import RunView
from safe_engine.strategies.decoding import DecodeConfig

from . import settings
from .downloads import page_file
from .examples import Examples, gallery
from .option_widgets import widget
from .panel import RunPanel
from .run_stream import MODELS_QUEUE, Runner, sharing_html
from .whatif import Origin, WhatIf

READY = (
    "Pick an example or type a prompt, then press Run. "
    "Hover a token for what happened to it; click it to pin the details."
)


class LiveTab:
    def __init__(self, runner: Runner, specs: list[str], examples: Examples):
        self.runner = runner
        with gr.Tab("Ensemble live", id="live"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    self.prompt = gr.Textbox(label="Prompt", lines=3, max_lines=12, elem_id="prompt")
                    max_new = widget("max_new_tokens", number=True, value=48, elem_id="max-new", render=False)
                    stop_at = widget(
                        "stop",
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
                    models = widget("models", value="\n".join(specs), lines=2, elem_id="models")
                    drafter = gr.Dropdown(
                        specs,
                        value=specs[0],
                        label=OPTIONS["drafter"].label,
                        info=OPTIONS["drafter"].text,
                        allow_custom_value=True,
                        elem_id="drafter",
                    )
                    strategy = widget("strategy", elem_id="strategy")
                    max_new.render()
                    stop_at.render()
                    lookahead = widget("lookahead")
                    top_k = widget("top_k")
                    sharpen = widget("sharpen")
                    sharpen_lambda = widget("sharpen_lambda")
                    with gr.Accordion("More options", open=False):
                        ensemble_method = widget("ensemble_method", elem_id="ensemble-method")
                        core_score = widget("core_score")
                        core_beta = widget("core_beta")
                        core_alpha = widget("core_alpha")
                        core_space = widget("core_space")
                        eva_top = widget("eva_top", number=True)
                        eva_drop = widget("eva_drop")
                        weights = widget("weights", label="Weights (one per model; empty: equal)", elem_id="weights")
                        gate = widget("gate")
                        safe_mode = widget("safe_mode")
                        draft_gate = widget("draft_gate", number=True, elem_id="draft-gate")
                        consensus_threshold = widget("consensus_threshold", number=True)
                        per_token_commit = widget("per_token_commit")
                        byte_combine = widget("byte_combine")
                        temperature = widget("temperature", elem_id="temperature")
                        top_p = widget("top_p")
                        seed = widget("seed", elem_id="seed")
                        damage_kl_steps = widget("damage_kl_steps")
                        overlap = widget("overlap")
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
            models=models,
            drafter=drafter,
            strategy=strategy,
            max_new_tokens=max_new,
            lookahead=lookahead,
            top_k=top_k,
            sharpen=sharpen,
            sharpen_lambda=sharpen_lambda,
            ensemble_method=ensemble_method,
            safe_mode=safe_mode,
            draft_gate=draft_gate,
            per_token_commit=per_token_commit,
            gate=gate,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop_at,
            weights=weights,
            damage_kl_steps=damage_kl_steps,
            overlap=overlap,
            consensus_threshold=consensus_threshold,
            byte_combine=byte_combine,
            core_score=core_score,
            core_beta=core_beta,
            core_alpha=core_alpha,
            core_space=core_space,
            eva_top=eva_top,
            eva_drop=eva_drop,
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

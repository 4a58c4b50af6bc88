"""What-if branching: pin a token of a finished Live run, commit another text in its place, and watch the
run go on from there with the same models and settings (the engine's `DecodeConfig.force`), below the
original (a section that opens when the first branch starts), with the first token where the two runs differ
marked in both transcripts."""

from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr

from safe_engine.contract.errors import ConfigError
from safe_engine.orchestration.many_runs import decode_ahead
from safe_engine.pages import charts
from safe_engine.pages.page import branch_page
from safe_engine.pages.text import esc, quoted
from safe_engine.pages.traces import save_trace
from safe_engine.pages.transcript import status_html, transcript_html
from safe_engine.pages.view import RunView, first_difference
from safe_engine.strategies.decoding import DecodeConfig
from safe_engine.tokenization.alignment import EOS_KEY

from .downloads import page_file
from .panel import RunPanel
from .run_stream import MODELS_QUEUE, Runner

HINT = "<b>What-if:</b> once a run has finished, pin one of its tokens to commit another text in its place."
CANDIDATES = 10  # the most offered, highest p first
IDLE = "No branch yet: pin a token of a finished run, pick or type another text and press Commit this instead."


@dataclass(frozen=True)
class Origin:
    """What a branch repeats of the run it branches from (kept in session state when that run starts)."""

    prompt: str
    specs: tuple[str, ...]
    config: DecodeConfig


def candidates(view: RunView, index: int) -> list[tuple[str, str]]:
    """(label, text) to commit instead of token `index`: the top of its ensemble point's union table, else the
    drafter's top-k where it was drafted. Leaves out the committed text (forcing it changes nothing), the
    end marker and pieces of a character (those carry their bytes in `raw_hex`): a forced text is spelled as
    text, so it can neither end the answer nor be part of a character."""
    t = view.tokens[index]
    if t.point is not None:
        rows = [
            (r["text"], r["after"] if r["after"] is not None else r["before"], r.get("raw_hex"))
            for r in view.points[t.point]["table"]
        ]
    elif t.draft:
        rows = [(c["text"], c["p"], c.get("raw_hex")) for c in t.draft["top_k"]]
    else:
        rows = []
    seen, out = {t.text, EOS_KEY, ""}, []
    for text, p, piece_bytes in rows:
        if text not in seen and piece_bytes is None:
            seen.add(text)
            out.append((f"{quoted(text)}  p {p:.3f}", text))
    return out[:CANDIDATES]


def branch_config(origin: Origin, view: RunView, index: int, text: str) -> DecodeConfig:
    """The original run's config and seed (a sampled run repeats its prefix) with `text` forced at `index`.
    The original's forces before `index` stay; later ones belonged to the continuation the branch replaces."""
    if not text:
        raise ConfigError("pick a candidate or type the text to commit instead")
    forces = tuple((i, s) for i, s in origin.config.force if i < index) + ((index, text),)
    config = replace(origin.config, seed=view.started["config"]["seed"], force=forces)
    config.validate(len(origin.specs))
    return config


class WhatIf:
    """The controls and the branch's status line live under the Live panel's pinned details (`controls`,
    passed to that RunPanel); the branch's own panel below the Live panel (`section`), hidden until a branch
    starts; `wire` connects them once both exist, `follow` to the Live event."""

    def __init__(self, runner: Runner):
        self.runner = runner
        self.origin = gr.State(None)  # the Origin of the Live run shown, set by the Live event when the run starts
        self.followed = gr.State(None)  # the Origin this section was last reset for (`follow`)
        self.index = gr.State(None)  # the pinned token to branch at

    def controls(self) -> None:
        with gr.Group(elem_classes="whatif"):
            self.hint = gr.HTML(HINT, elem_id="whatif-hint")
            self.choices = gr.Radio(
                [],
                label="Its top candidates (the ensemble's union, or the drafter's top-k)",
                visible=False,
                elem_id="whatif-choices",
            )
            self.text = gr.Textbox(
                label="Text to commit instead (a candidate fills it in)", lines=1, elem_id="whatif-text"
            )
            with gr.Row():
                self.run = gr.Button("Commit this instead", variant="primary", elem_id="whatif-run")
                self.stop = gr.Button("Stop branch", variant="stop", elem_id="whatif-stop")
            self.status = gr.HTML(status_html(IDLE), elem_id="branch-status")

    def section(self) -> None:
        with gr.Column(visible=False, elem_id="branch-section") as self.box:
            gr.Markdown("### What-if branch", elem_id="branch-title")
            self.panel = RunPanel("branch", plots=False)
            self.damage = gr.Plot(charts.damage([]), show_label=False, elem_id="branch-damage")
            with gr.Row():
                self.download = gr.DownloadButton(
                    "Download branch trace (JSONL)", interactive=False, elem_id="branch-download"
                )
                self.page = gr.DownloadButton("Download page (HTML)", interactive=False, elem_id="branch-page")

    def wire(self, original: RunPanel) -> None:
        self.original = original
        original.transcript.pin(
            self.on_pin, [original.view], [self.hint, self.choices, self.text, self.index], api_visibility="private"
        )
        self.choices.input(lambda text: text, [self.choices], [self.text], api_visibility="private")
        self.run.click(
            self.branch,
            [self.origin, original.view, self.index, self.text],
            [
                self.status,
                self.box,
                self.damage,
                self.download,
                self.page,
                *self.panel.outputs,
                original.view,
                original.transcript,
            ],
            api_visibility="private",
            **MODELS_QUEUE,
        )
        self.runner.stop_button(self.stop, api_visibility="private")

    @property
    def _original_outputs(self) -> list:
        return [self.original.view, self.original.transcript]

    def follow(self, live_run) -> None:
        """After each Live event (`live_run`, its dependency), catch up with the run it showed. Done in an event
        of its own, not among the Live event's outputs: Gradio rebuilds every output an update leaves out, so
        the 10 components this resets would cost every frame of every Live run about a millisecond each."""
        live_run.then(
            self._follow,
            [self.origin, self.followed, self.original.view],
            [
                self.followed,
                self.index,
                self.hint,
                self.choices,
                self.text,
                self.status,
                self.box,
                self.damage,
                self.download,
                self.page,
                *self.panel.outputs,
            ],
            api_visibility="private",
            queue=False,
        )

    def _follow(self, origin: Origin | None, followed: Origin | None, view: RunView):
        """A new Live run was shown (its Origin is not the one followed): the old branch and pin no longer apply,
        and a token pinned while the run streamed is offered now that it has finished. A Live event that was
        refused (bad input) left the origin as it was, and the branch shown stays."""
        if origin is None or origin is followed:
            return gr.skip()
        reset = {
            self.followed: origin,
            self.index: None,
            self.text: "",
            self.status: status_html(IDLE),
            self.box: gr.Column(visible=False),
            self.damage: charts.damage([]),
            self.download: gr.DownloadButton(value=None, interactive=False),
            self.page: gr.DownloadButton(value=None, interactive=False),
        }
        return reset | self.panel.fresh(RunView()) | self.offer(view, view.pinned)

    def offer(self, view: RunView, index: int | None) -> dict:
        """The controls for branching at token `index` of `view` (nothing to offer before the run finished)."""
        if view.finished is None or index is None or not 0 <= index < len(view.tokens):
            return {self.hint: HINT, self.choices: gr.Radio(choices=[], value=None, visible=False), self.index: None}
        t, options = view.tokens[index], candidates(view, index)
        hint = (
            f"<b>What-if at token #{index}</b> {esc(quoted(t.text))}: pick one of its candidates or type a text, then "
            "press Commit this instead. The run goes on from there with the same models and settings."
        )
        return {
            self.hint: hint,
            self.choices: gr.Radio(choices=options, value=None, visible=bool(options)),
            self.text: "",
            self.index: index,
        }

    def on_pin(self, view: RunView, evt: gr.EventData) -> dict:
        return self.offer(view, int(evt.idx))

    def branch(self, request: gr.Request, origin: Origin | None, original: RunView, index: int | None, text: str):
        view = RunView()

        def doing() -> str:
            return f"What-if: {quoted(text)} at token #{index} instead of {quoted(original.tokens[index].text)}"

        def check():
            if origin is None or original.finished is None:
                raise ConfigError(
                    "there is no finished run to branch from: run a prompt and let it finish (or stop it)"
                )
            if index is None or not 0 <= index < len(original.tokens):
                raise ConfigError("pin a token of the finished run first (click it)")
            return list(origin.specs), branch_config(origin, original, index, text or "")

        def start(models, config: DecodeConfig, flag):
            events = decode_ahead(models, origin.prompt, config, flag)  # raises e.g. when the drafter cannot spell it
            original.diverge = None
            first = {
                self.status: status_html(f"{doing()}; the run goes on with the same models and settings…", "busy"),
                self.box: gr.Column(visible=True),
                self.damage: charts.damage([]),
                self.download: gr.DownloadButton(value=None, interactive=False),
                self.page: gr.DownloadButton(value=None, interactive=False),
                self.original.view: original,
                self.original.transcript: transcript_html(original),
            }
            return events, first | self.panel.fresh(view)

        def step(event, pace) -> dict | None:
            view.add(event.to_dict())
            if event.kind == "run_finished" or (event.kind == "text_committed" and pace.frame()):
                return self._progress(original, view, pace.charts())
            return None

        def finish(broke_off: str | None, _stopped: bool) -> dict:
            if broke_off is None:
                outcome = status_html(f"{doing()}: {_outcome(view)}")
            else:
                outcome = status_html(f"The branch broke off: {broke_off}. Both transcripts so far are kept.", "error")
            trace = gr.DownloadButton(value=save_trace(view.events, "what-if-trace"), interactive=True)
            page = gr.DownloadButton(
                value=page_file(branch_page(original.events, view.events), "what-if-page"), interactive=True
            )
            return {self.status: outcome, self.download: trace, self.page: page} | self._progress(original, view, True)

        yield from self.runner.stream(request.session_hash, self.status, "branch", check, start, step, finish)

    def _progress(self, original: RunView, view: RunView, with_chart: bool) -> dict:
        """The branch so far; the first difference marked in both runs as soon as it is known."""
        diverge = first_difference(original, view)
        out = {}
        if diverge != view.diverge:
            original.diverge = view.diverge = diverge
            out = {self.original.view: original, self.original.transcript: transcript_html(original)}
        out |= self.panel.show(view)
        if with_chart:
            out[self.damage] = charts.damage([("original", original), ("what-if", view)])
        return out


def _outcome(branch: RunView) -> str:
    """How the finished branch compares with the original, in the status line."""
    stopped = branch.finished is not None and branch.finished["stop_reason"] == "stopped"
    if branch.diverge is not None:
        verdict = f"the runs first differ at token #{branch.diverge} (≠ and a bar in both transcripts)"
    else:
        verdict = "no token differs from the original" + (" as far as the branch went" if stopped else "")
    return ("stopped; " if stopped else "") + verdict + ". Damage, original vs what-if, is charted below the branch."

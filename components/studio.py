"""SAFE Ensemble Studio, the web app: ``safe-studio`` once installed, ``python app.py`` from a checkout, both
``[--host 127.0.0.1] [--port 7860] [--models SPEC ...] [--traces DIR] [--devices D ...] [--dtype T ...]
[--cpu-int8] [--share]``.

Models load on the first run, once per process, and are shared by every browser tab; everything a tab
shows lives in that tab's session state. The UI only consumes the engine's events.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # read when gradio is imported; this machine may be offline

import gradio as gr  # noqa: E402

from safe_engine.contract.errors import SafeEngineError  # noqa: E402
from safe_engine.data import TRACES_DIR  # noqa: E402
from safe_engine.models.placement import checked  # noqa: E402
from safe_engine.models.specs import DEFAULT_MODELS, resolve_spec  # noqa: E402
from safe_engine.options import UsageError, add_loading_options, load_options  # noqa: E402
from safe_engine.pages.page import STYLE  # noqa: E402
from safe_engine.pages.traces import shipped_traces  # noqa: E402

from .benchmark_tab import BenchmarkTab  # noqa: E402
from .compare_tab import CompareTab  # noqa: E402
from .examples import Examples  # noqa: E402
from .live_tab import LiveTab  # noqa: E402
from .pool import ModelPool  # noqa: E402
from .replay_tab import ReplayTab  # noqa: E402
from .run_stream import Runner  # noqa: E402
from .stops import Stops  # noqa: E402
from .sweep_section import SweepSection  # noqa: E402
from .tokenizers_tab import TokenizersTab  # noqa: E402

INTRO = """# SAFE Ensemble Studio
Two small models with **different tokenizers** answer together, token by token. With SAFE one of them
(the drafter) drafts, and the ensemble runs only where it is both *safe* (every model has a token
boundary there) and *needed* (the models do not already agree). Watch a run live and branch it at any
token (what-if), compare it with naive per-token ensembling and the damage each leaves, or replay a
recorded run while the models load."""


def asset(name: str) -> Path:
    """One of the UI's own files (style.css, examples.json, tokenizer_examples.json): in this package's
    ``assets/`` when installed (``safe_studio.assets``), else in the checkout's ``assets/`` beside ``components/``."""
    here = Path(__file__).resolve().parent
    installed = here / "assets"
    return (installed if installed.is_dir() else here.parent / "assets") / name


def _json(name: str):
    return json.loads(asset(name).read_text(encoding="utf-8"))


def build_demo(
    specs: Sequence[str] = DEFAULT_MODELS, pool: ModelPool | None = None, traces: Path | None = None
) -> gr.Blocks:
    """The app; `traces`, a folder of saved traces, joins the shipped ones in Replay and in ``?trace=NAME`` links."""
    examples = Examples.read(asset("examples.json"))
    runner = Runner(pool or ModelPool(), Stops())
    folders = [TRACES_DIR] + ([traces.resolve()] if traces else [])
    with gr.Blocks(title="SAFE Ensemble Studio", analytics_enabled=False) as demo:
        gr.Markdown(INTRO)
        with gr.Tabs() as tabs:
            live = LiveTab(runner, list(specs), examples)
            CompareTab(runner, live.form, examples)
            BenchmarkTab(runner, live.form, SweepSection)
            replay = ReplayTab([trace for folder in folders for trace in shipped_traces(folder)], folders)
            TokenizersTab(live.models, _json("tokenizer_examples.json"))
        replay.follow_links(demo, tabs)
    return demo


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, share: bool = False, **kwargs):
    # theme/css moved from Blocks() to launch() in Gradio 6; the default theme needs no web fonts.
    return demo.queue(max_size=64).launch(
        server_name=host, server_port=port, share=share, css_paths=[STYLE, asset("style.css")], ssr_mode=False, **kwargs
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``safe-studio`` (and ``python app.py``): serve the app until interrupted; 2 on bad flags or a taken port."""
    parser = argparse.ArgumentParser(description="SAFE Ensemble Studio web app")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(DEFAULT_MODELS),
        metavar="SPEC",
        help="default models of the form (embedded:NAME, a folder, a .gguf file or a hub id)",
    )
    parser.add_argument(
        "--traces",
        type=Path,
        metavar="DIR",
        help="a folder of saved traces (.jsonl) to offer in Replay beside the shipped ones; a link "
        "http://HOST:PORT/?trace=NAME opens one of them (or a shipped one) in Replay",
    )
    add_loading_options(parser)
    parser.add_argument("--share", action="store_true", help="also open a public Gradio share link")
    args = parser.parse_args(argv)
    options = load_options(args)
    try:
        for spec in args.models:
            resolve_spec(spec)
        checked(len(args.models), options)
        if args.traces is not None and not args.traces.is_dir():
            raise UsageError(f"--traces {args.traces}: not a folder")
    except SafeEngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        launch(build_demo(args.models, ModelPool(options), args.traces), args.host, args.port, args.share)
    except OSError as exc:  # the port is taken, or the host is not an address of this machine
        print(f"error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0

"""``python -m safe_engine serve``: load the models once, warm them up, serve the app with uvicorn."""

from __future__ import annotations

from collections.abc import Callable

from ..cli import decoding_config, decoding_parser, load_options, model_specs
from ..compare import load_models, warm_up
from .app import Settings, create_app


def decoding_options(args) -> dict:
    """The decoding options among parsed `serve` arguments, by name (what requests start from)."""
    names = {action.dest for action in decoding_parser()._actions if action.option_strings} - {"strategy"}
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


def serve(args, progress: Callable[[str], None]) -> int:
    import uvicorn

    options = decoding_options(args)
    decoding_config(type(args)(**options, strategy=args.strategy))  # bad options fail before loading
    models = load_models(model_specs(args), load_options(args), progress)
    warm_up(models)
    settings = Settings(options, args.strategy, args.api_key, args.concurrency, args.queue)
    app = create_app(models, settings)
    progress(f"serving {', '.join(app.state.engine.model_ids)} on http://{args.host}:{args.port}/v1")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0

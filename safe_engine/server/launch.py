"""``python -m safe_engine serve``: load the models once, warm them up, serve the app with uvicorn."""

from __future__ import annotations

from collections.abc import Callable

from ..models.cache import load_models
from ..options import decoding_config, decoding_values, load_options, model_specs
from ..orchestration.comparison import warm_up
from .app import Settings, create_app


def serve(args, progress: Callable[[str], None]) -> int:
    import uvicorn

    options = decoding_values(args)
    decoding_config(args)  # bad options fail before loading
    models = load_models(model_specs(args), load_options(args), progress)
    warm_up(models)
    settings = Settings(options, args.strategy, args.api_key, args.concurrency, args.queue)
    app = create_app(models, settings)
    progress(f"serving {', '.join(app.state.engine.model_ids)} on http://{args.host}:{args.port}/v1")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0

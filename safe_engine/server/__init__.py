"""OpenAI-compatible HTTP server over the engine: ``python -m safe_engine serve`` (FastAPI + uvicorn).

`app.create_app` builds the app around loaded models; `runner.serve` loads them and runs uvicorn.
"""

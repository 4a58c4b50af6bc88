"""Integrations beside the engine: lm-evaluation-harness's `safe-ensemble` model (`lm_eval.py`, its offline task
YAMLs in `lm_eval_tasks/`) and what they share with the OpenAI-compatible server (`safe_engine.server`).

They import the engine, never the other way round; lm-eval and its scorers are optional dependencies
(requirements-integrations.txt), imported only by the modules that need them.
"""

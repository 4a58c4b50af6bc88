"""Integrations beside the engine: lm-evaluation-harness's `safe-ensemble` model (`lm_eval.py`, its offline task
YAMLs in `lm_eval_tasks/`) and what they share with the OpenAI-compatible server (`safe_engine.server`).

They import the engine, never the other way round; lm-eval and its scorers are optional dependencies
(requirements-integrations.txt), imported only by the modules that need them.
"""

from pathlib import Path

LM_EVAL_TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
"""Our offline lm-eval tasks (YAMLs, their `utils.py` and sample data), shipped as package data: the front door
(``python -m safe_engine lm-eval``) includes them unless told another ``--include_path``."""

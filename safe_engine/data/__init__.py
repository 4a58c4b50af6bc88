"""Files the engine ships, read from the installed package as from a checkout (package data, beside this module).

- `TASKS_DIR`: the bench's task sets, one JSONL file per set (``--tasks arithmetic``; `safe_engine.bench.tasks`).
- `TRACES_DIR`: recorded runs of the embedded pair (JSONL event streams) and ``index.json``, the order and captions
  the app's Replay tab shows them in.

lm-eval's task YAMLs sit with the code that runs them: `safe_engine.integrations.LM_EVAL_TASKS_DIR`.
"""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
TASKS_DIR = DATA_DIR / "tasks"
TRACES_DIR = DATA_DIR / "traces"

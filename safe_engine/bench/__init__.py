"""Benchmark harness: task files → runs of each strategy → results.jsonl, summary.csv, report.html.

Only `report` needs pandas and Plotly; import it where the report is built.
"""

from .prompts import STYLES, answer_span, build_prompt
from .runner import DEFAULT_BATCH_SIZE, DEFAULT_STRATEGIES, Bench, run_example, strategy_labels
from .scoring import SCORERS, score
from .store import load_results, load_settings
from .tasks import Example, builtin_tasks, load_task

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_STRATEGIES",
    "SCORERS",
    "STYLES",
    "Bench",
    "Example",
    "answer_span",
    "build_prompt",
    "builtin_tasks",
    "load_results",
    "load_settings",
    "load_task",
    "run_example",
    "score",
    "strategy_labels",
]

"""Prompt templates per answer kind and style, and where each style's answer lies in a response.

``direct`` asks for the answer alone and reads the first non-empty line: small base models keep writing
new "Question: ..." lines after answering, and that chatter must neither count nor cost decoding time
(the run stops at the newline after the answer, `STOPS`).
``cot`` is the paper's zero-shot chain of thought and reads the whole response. The engine then
applies each model's own chat template (or none) to the prompt built here.
"""

from __future__ import annotations

from .tasks import Example

STYLES = ("direct", "cot")
_KIND = {"numeric": "numeric", "choice": "choice", "exact": "text", "contains": "text"}
TEMPLATES = {
    ("numeric", "direct"): "Question: {question}\nAnswer with a number only.\nAnswer:",
    ("numeric", "cot"): "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
    (
        "choice",
        "direct",
    ): "Question: {question}\n{choices}\nAnswer with the letter of the correct option only.\nAnswer:",
    ("choice", "cot"): (
        '{question}\n{choices}\nProvide your step-by-step reasoning first, and then print "The answer is (X)" '
        "where X is the answer choice (one capital letter), at the end of your response."
    ),
    ("text", "direct"): "Question: {question}\nAnswer:",
    ("text", "cot"): '{question}\nThink step by step, then finish with "The answer is: " and the answer.',
}


def build_prompt(example: Example, style: str) -> str:
    choices = "\n".join(f"({chr(ord('A') + i)}) {text}" for i, text in enumerate(example.choices))
    return TEMPLATES[_KIND[example.scorer], style].format(question=example.question, choices=choices)


def answer_span(response: str, style: str) -> str:
    """The part of a response the scorer reads."""
    if style == "cot":
        return response
    return next((line.strip() for line in response.splitlines() if line.strip()), "")


STOPS = {"direct": ("\n",), "cot": ()}
"""Stop sequences per style: a direct answer's line has ended once a newline follows it (the engine does
not count a stop sequence inside the response's leading whitespace)."""

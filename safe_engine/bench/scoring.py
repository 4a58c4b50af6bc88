"""Answer extraction and scoring. Each task declares one scorer; scorers see only the answer span.

Every extractor prefers an explicit final answer (``\\boxed{}``, "The answer is ...") over guessing, so a
model that states its answer and then keeps talking is scored on what it stated.
"""

from __future__ import annotations

import re
from fractions import Fraction

SCORERS = ("numeric", "choice", "exact", "contains")

# A number not glued to a word ("x2") or another number: thousands commas, decimals, simple fractions.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_FRAC = re.compile(r"(-)?\\frac\{?(-?\d+)\}?\{?(\d+)\}?")
_MARKER = re.compile(r"(?i:answer is)\s*:?")
_MARKED_CHOICE = re.compile(r"(?i:answer is)\s*:?\s*(?:\(([A-Ja-j])\)|([A-J])\b)")
_LEADING_CHOICE = re.compile(r"\s*\(?([A-J])(?:\)|[.:]|\s*$)")
_PAREN_CHOICE = re.compile(r"\(([A-J])\)")
_LATEX_NOISE = re.compile(r"\\left|\\right|\\[!,; ]|\\?[$%]|\s|\^\\circ|\^\{\\circ\}")
_EDGE_PUNCT = " \t\n\"'`*.!?,;:"


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _after_marker(text: str) -> str | None:
    """The text after the last "answer is", or None when the model never said it."""
    matches = list(_MARKER.finditer(text))
    return text[matches[-1].end() :] if matches else None


def to_number(text: str) -> Fraction | None:
    """A number written as 1,234 / -5 / 3.50 / 7/2 / \\frac{7}{2} (with $, %, LaTeX spacing), else None."""
    clean = _latex_key(text)
    frac = _FRAC.fullmatch(clean)
    if frac:
        sign, num, den = frac.groups()
        return None if int(den) == 0 else Fraction(int(num), int(den)) * (-1 if sign else 1)
    if not _NUMBER.fullmatch(clean):
        return None
    num, _, den = clean.replace(",", "").partition("/")
    return None if den and int(den) == 0 else Fraction(num) / Fraction(den or 1)


def extract_number(span: str) -> str | None:
    """\\boxed{} content, else the first number after "answer is", else the last number in the span."""
    boxed = last_boxed(span)
    if boxed is not None:
        return boxed.strip()
    stated = _NUMBER.search(_after_marker(span) or "")
    if stated:
        return stated.group()
    numbers = _NUMBER.findall(span)
    return numbers[-1] if numbers else None


def extract_choice(span: str) -> str | None:
    """The option letter from "The answer is (X)", a span that starts with "X." / "(X)", or the last "(X)"."""
    marked = list(_MARKED_CHOICE.finditer(span))
    if marked:
        lower, upper = marked[-1].groups()
        return (lower or upper).upper()
    leading = _LEADING_CHOICE.match(span)
    if leading:
        return leading.group(1)
    parens = _PAREN_CHOICE.findall(span)
    return parens[-1] if parens else None


def normalize_text(text: str) -> str:
    return " ".join(text.casefold().split()).strip(_EDGE_PUNCT)


def _final_text(span: str) -> str:
    marked = _after_marker(span)
    return normalize_text(span if marked is None else marked)


def numbers_match(answer: str, gold: str) -> bool:
    """Equal as numbers when both parse (1,000 == 1000.0, 0.5 == \\frac{1}{2}), else as LaTeX strings."""
    a, g = to_number(answer), to_number(gold)
    if a is not None and g is not None:
        return a == g
    return _latex_key(answer) == _latex_key(gold)


def _latex_key(text: str) -> str:
    """LaTeX answer without spacing, $, %, degrees, {,} thousands or a final period; \\dfrac → \\frac."""
    key = _LATEX_NOISE.sub("", text).replace("{,}", "").rstrip(".")
    return key.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def score(scorer: str, span: str, gold: str) -> tuple[str | None, bool]:
    """(extracted answer, correct) for one answer span."""
    if scorer == "numeric":
        answer = extract_number(span)
        return answer, answer is not None and numbers_match(answer, gold)
    if scorer == "choice":
        answer = extract_choice(span)
        return answer, answer == gold.strip().upper()
    answer = _final_text(span)
    target = normalize_text(gold)
    if scorer == "exact":
        return answer, answer == target
    if scorer == "contains":
        return answer, bool(target) and re.search(rf"(?<!\w){re.escape(target)}(?!\w)", answer) is not None
    raise ValueError(f"unknown scorer {scorer!r}; known: {', '.join(SCORERS)}")

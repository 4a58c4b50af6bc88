"""How fast the tokenizer debugger answers once tokenizers are loaded (the app re-renders on each edit).

    python -m benchmarks.tokdiff_speed [--chars 2000] [--repeats 20] [--models SPEC SPEC]

Prints the median wall time of the pair view alone and of pair view + HTML rendering.
"""

from __future__ import annotations

import argparse
import statistics
import time

from components.tokenizer_view import pair_view_html
from safe_engine.analysis.tokdiff import load_vocabs, pair_view
from safe_engine.models.specs import DEFAULT_MODELS

SAMPLE = (
    "The capital of Madagascar is Antananarivo; Burkina Faso's is Ouagadougou. An unbelievable 12,345.67 km!\n"
    'def area(r):\n\treturn 3.14159 * r ** 2  # <b>code</b> & "quotes"\n'
    "Emoji 😀👍🏽, CJK 東京は日本の首都です, Cyrillic Москва, accents naïve café. "
)


def sample_text(chars: int) -> str:
    """Mixed prose, rare names, numbers, code, emoji and CJK, cut to `chars` characters."""
    return (SAMPLE * (chars // len(SAMPLE) + 1))[:chars]


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    args = parser.parse_args()
    vocabs = load_vocabs(args.models)
    text = sample_text(args.chars)
    view_s = median_seconds(lambda: pair_view(text, vocabs), args.repeats)
    html_s = median_seconds(lambda: pair_view_html(pair_view(text, vocabs)), args.repeats)
    print(f"pair view, {len(text)} characters, {' vs '.join(vocabs)}: median of {args.repeats}")
    print(f"  pair_view:                  {view_s * 1000:.1f} ms")
    print(f"  pair_view + pair_view_html: {html_s * 1000:.1f} ms")


if __name__ == "__main__":
    main()

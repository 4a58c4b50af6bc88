"""Prove the rule tests bite: break each SAFE (or byte-level) rule in a copy of the project and check the quick
tests fail.

    python -m scripts.mutations [--list] [--only NAME ...] [--mode both|alone|batched]

Each mutation replaces one piece of code in a temporary copy of the project; the tests below run against
that copy and must fail. The piece is matched as a sequence of Python tokens, so reformatting (line breaks,
spacing, comments) does not move it; it must occur exactly once, so the list breaks loudly when the code
changes. The tests run in two modes: alone (each decode is the only run) and batched (`SAFE_TEST_BATCHED=1`:
each decode shares its forward passes with two companion runs, tests/conftest.py), and a mutation is killed
only when the tests fail in every mode run. The unmutated copy must pass first, in each mode. Exit status 0
only when every mutation is killed.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/test_methods.py",  # first: quick, and where CoRE's and EVA's mutations fail
    "tests/test_rules.py",
    "tests/test_sampling.py",
    "tests/test_ensemble.py",
    "tests/test_decoding.py",
    "tests/test_batched_decodes.py",  # the batched mode really shares passes
    "tests/test_byte_level.py",
]
COPIED = ["safe_engine", "tests", "pytest.ini"]
MODES = {"alone": "0", "batched": "1"}  # the value of SAFE_TEST_BATCHED


@dataclass(frozen=True)
class Mutation:
    name: str
    rule: str
    path: str
    old: str
    new: str


MUTATIONS = [
    Mutation(
        "oov-boundary-after",
        "OOV-like: the boundary *before* the drafted token",
        "safe_engine/strategies/safe.py",
        "for j, (s, _) in enumerate(spans)",
        "for j, (_, s) in enumerate(spans)",
    ),
    Mutation(
        "oov-any-verifier",
        "OOV-like: safe for *every* verifier",
        "safe_engine/decisions/rules.py",
        "return all(index is not None for index in own_tokens)",
        "return any(index is not None for index in own_tokens)",
    ),
    Mutation(
        "inside-character",
        "never ensemble inside a UTF-8 character (SAFE)",
        "safe_engine/strategies/safe.py",
        "Reason.INSIDE_CHARACTER if not index.is_char_boundary(s) else",
        "Reason.INSIDE_CHARACTER if False else",
    ),
    Mutation(
        "special-token-without-text",
        "a drafted special token with no text is never ensembled (SAFE)",
        "safe_engine/strategies/safe.py",
        "Reason.NO_TEXT if s == e and token not in eos else None",
        "None",
    ),
    Mutation(
        "no-unanimity",
        "unanimity keeps the draft",
        "safe_engine/decisions/rules.py",
        "if all(agrees)",
        "if False",
    ),
    Mutation(
        "unanimity-any",
        "unanimity needs every verifier",
        "safe_engine/decisions/rules.py",
        "if all(agrees)",
        "if any(agrees)",
    ),
    Mutation(
        "mean-not-strict",
        "mean > ½ is strict",
        "safe_engine/decisions/rules.py",
        "mean_p > threshold",
        "mean_p >= threshold",
    ),
    Mutation(
        "threshold-ignored",
        "the consensus threshold is the run's, ½ only by default",
        "safe_engine/strategies/safe.py",
        "run.config.consensus_threshold",
        "0.5",
    ),
    Mutation(
        "mean-unweighted",
        "weighted consensus threshold",
        "safe_engine/decisions/rules.py",
        "sum(w * p for w, p in zip(weights, probs)) / sum(weights)",
        "sum(probs) / len(probs)",
    ),
    Mutation(
        "weights-by-role",
        "weights belong to models, not roles",
        "safe_engine/run/roles.py",
        "weights[i] / sum(weights)",
        "weights[order.index(i)] / sum(weights)",
    ),
    Mutation(
        "exact-keeps-scanning",
        "exact mode drops the draft after any ensemble",
        "safe_engine/strategies/safe.py",
        'if point.changed or run.config.safe_mode == "exact"',
        "if point.changed",
    ),
    Mutation(
        "replacement-keeps-scanning",
        "a replacement drops the rest of the draft",
        "safe_engine/strategies/safe.py",
        'if point.changed or run.config.safe_mode == "exact"',
        'if run.config.safe_mode == "exact"',
    ),
    Mutation(
        "draft-past-eos",
        "EOS ends a draft",
        "safe_engine/run/drafting.py",
        "if token in eos:",
        "if False:",
    ),
    Mutation(
        "gate-ignored",
        "a gated round ends after a low-probability token",
        "safe_engine/run/drafting.py",
        "if probs[token].item() < gate:",
        "if False:",
    ),
    Mutation(
        "gate-default-off",
        "the measured draft gate τ = 0.3 is the default",
        "safe_engine/contract/config.py",
        "draft_gate: float = 0.3",
        "draft_gate: float = 0.0",
    ),
    Mutation(
        "lookahead-4", "default n = 5", "safe_engine/contract/config.py", "lookahead: int = 5", "lookahead: int = 4"
    ),
    Mutation("top-k-8", "default k = 10", "safe_engine/contract/config.py", "top_k: int = 10", "top_k: int = 8"),
    Mutation(
        "sharpen-at-half",
        "sharpen only when max < ½",
        "safe_engine/decisions/ensemble.py",
        "before.max().item() < 0.5",
        "before.max().item() <= 0.5",
    ),
    Mutation(
        "sharpen-never",
        "sharpening runs when the ensemble is too smooth",
        "safe_engine/decisions/ensemble.py",
        'if config.sharpen != "none" and result.before.max()',
        "if False and result.before.max()",
    ),
    Mutation(
        "geometric-is-arithmetic",
        "geometric sharpening is wired",
        "safe_engine/decisions/ensemble.py",
        "result.after = sharpen_geometric(result.per_model, weights)",
        "result.after = result.before.clone()",
    ),
    Mutation(
        "space-anchor-as-any-whitespace",
        "only the single space is no anchor",
        "safe_engine/decisions/ensemble.py",
        'a == b" " or probs[a_index] <= lam',
        "not a.strip() or probs[a_index] <= lam",
    ),
    Mutation(
        "fill-skips-all-whitespace",
        "the fill skips only the bare space",
        "safe_engine/decisions/ensemble.py",
        '(i for i in pieces if vocab[i] != b" ")',
        '(i for i in pieces if vocab[i].strip() != b"")',
    ),
    Mutation(
        "no-gac-gate-safe",
        "GaC's gate (SAFE)",
        "safe_engine/decisions/rules.py",
        "gated and gate_keeps(at.drafter_top_p)",
        "False and gate_keeps(at.drafter_top_p)",
    ),
    Mutation(
        "no-gac-gate-per-token",
        "GaC's gate (per-token)",
        "safe_engine/strategies/per_token.py",
        "run.config.ensemble.gated and rules.gate_keeps",
        "False and rules.gate_keeps",
    ),
    Mutation(
        "gate-on-for-unite",
        "the gate is on by default for GaC only",
        "safe_engine/contract/config.py",
        'return self.method == "gac" if self.gate is None else self.gate',
        "return True if self.gate is None else self.gate",
    ),
    Mutation(
        "per-token-full-spelling",
        "UniTE's first-sub-token commit",
        "safe_engine/decisions/spelling.py",
        'if spelling == "first-subtoken":',
        "if False:",
    ),
    Mutation(
        "per-token-splices-characters",
        "per-token lets the drafter finish a character",
        "safe_engine/strategies/per_token.py",
        "if complete_utf8_prefix(raw) < len(raw):",
        "if False:",
    ),
    Mutation(
        "sampling-keeps-unanimity",
        "sampling drops unanimity",
        "safe_engine/decisions/rules.py",
        "consensus(at.agrees, mean_p, threshold) if greedy else None",
        "consensus(at.agrees, mean_p, threshold)",
    ),
    Mutation(
        "acceptance-ignores-p-draft",
        "accept with min(1, P_ens / P_draft)",
        "safe_engine/decisions/rules.py",
        "min(1.0, mean_p / p_draft)",
        "min(1.0, mean_p)",
    ),
    Mutation(
        "byte-pairs-unchecked",
        "byte-level: a covering token must be canonical after the path's last token",
        "safe_engine/tokenization/next_byte.py",
        "keep = valid[ids] if len(ids) else ids.bool()",
        "keep = torch.ones(len(ids), dtype=torch.bool)",
    ),
    Mutation(
        "byte-product-as-mixture",
        "byte-level: product is the normalised product of the next-byte distributions",
        "safe_engine/strategies/byte_level.py",
        'if how == "product":',
        "if False:",
    ),
    Mutation(
        "core-anchor-clip",
        "CoRE: the main model weighs at least as much as all the others together",
        "safe_engine/decisions/core.py",
        "weights[0] = torch.maximum(weights[0], weights[1:].sum())",
        "weights[0] = weights[0]",
    ),
    Mutation(
        "core-no-entropy",
        "CoRE: a model's score is its summed token scores over its entropy",
        "safe_engine/decisions/core.py",
        "total / (entropy(per_model) + ENTROPY_FLOOR) * prior",
        "total * prior",
    ),
    Mutation(
        "core-prior-ignored",
        "CoRE: the run's weights scale the models' scores before the clip",
        "safe_engine/decisions/core.py",
        "total / (entropy(per_model) + ENTROPY_FLOOR) * prior",
        "total / (entropy(per_model) + ENTROPY_FLOOR)",
    ),
    Mutation(
        "core-token-scores-unused",
        "CoRE: an assisting model's probabilities are scaled by its token scores",
        "safe_engine/decisions/core.py",
        "w[1:, None] * scores.token_scores[1:] * per_model[1:]",
        "w[1:, None] * per_model[1:]",
    ),
    Mutation(
        "core-main-exact-only",
        "CoRE in the drafter's vocabulary: an assisting token no drafter token spells goes to its first sub-token",
        "safe_engine/decisions/ensemble.py",
        "return None if isinstance(key, str) else first_subtoken(main.vocab, key)",
        "return None if isinstance(key, str) else main.vocab.id_of_bytes.get(key)",
    ),
    Mutation(
        "core-support-everywhere",
        "CoRE: a candidate off both the model's and the main model's support scores 0",
        "safe_engine/decisions/core.py",
        "support = (per_model + per_model[0]) > SUPPORT_EPS",
        "support = per_model >= 0",
    ),
    Mutation(
        "core-scores-not-mean-one",
        "CoRE: token scores are normalised to mean 1 over the support",
        "safe_engine/decisions/core.py",
        "count / total.clamp_min(SUPPORT_EPS)",
        "1 / total.clamp_min(SUPPORT_EPS)",
    ),
    Mutation(
        "core-rbf-unshifted",
        "CoRE: the rbf score is 1 at δ = 0 and 0 at δ = 1",
        "safe_engine/decisions/core.py",
        "(torch.exp(-beta * delta) - torch.exp(-beta)) / (1 - torch.exp(-beta))",
        "torch.exp(-beta * delta)",
    ),
    Mutation(
        "core-distance-to-main",
        "CoRE: the distance is to the models' mean, not to the main model",
        "safe_engine/decisions/core.py",
        "delta = (per_model - per_model.mean(0)).abs()",
        "delta = (per_model - per_model[0]).abs()",
    ),
    Mutation(
        "eva-no-drop-filter",
        "EVA: a model joins only if its top token is in another model's top tokens",
        "safe_engine/decisions/eva.py",
        "tops[j] in best[k]",
        "True",
    ),
    Mutation(
        "eva-none-joins",
        "EVA: when no model passes the drop filter, all join",
        "safe_engine/decisions/eva.py",
        "return keep if any(keep) else [True] * len(rows)",
        "return keep",
    ),
    Mutation(
        "eva-full-softmax",
        "EVA: each model's top tokens only are softmaxed",
        "safe_engine/decisions/eva.py",
        "torch.topk(logits, min(top, size))",
        "torch.topk(logits, size)",
    ),
    Mutation(
        "eva-cosine-not-csls",
        "EVA: links are ranked by CSLS, not by plain cosine",
        "safe_engine/models/vocab_alignment.py",
        "scores = 2 * cos - penalty[:, None]",
        "scores = cos",
    ),
    Mutation(
        "eva-weak-links-kept",
        "EVA: links scoring under 0.1 are dropped",
        "safe_engine/models/vocab_alignment.py",
        "keep = scores >= MIN_SCORE",
        "keep = scores > 0",
    ),
    Mutation(
        "eva-flat-rows-kept",
        "EVA: a row with more than 5 links within 0.01 of each other is dropped",
        "safe_engine/models/vocab_alignment.py",
        "flat = (count > FLAT_ROW_LINKS) & (spread <= FLAT_ROW_STD)",
        "flat = count < 0",
    ),
    Mutation(
        "eva-links-to-special-tokens",
        "EVA: nothing links to a token that writes no text",
        "safe_engine/models/vocab_alignment.py",
        "weight = torch.where(writes[index], alignment.weight, torch.zeros(()))",
        "weight = alignment.weight.clone()",
    ),
]


def copy_project(target: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        else:
            shutil.copy2(source, target / name)


_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENDMARKER}


def code_tokens(code: str) -> list[tokenize.TokenInfo]:
    """The tokens of `code` that carry meaning (no line breaks, indentation or comments)."""
    return [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in _LAYOUT]


def locate(code: str, piece: str) -> list[tuple[int, int]]:
    """Character spans of `code` whose tokens are the tokens of `piece`, however either is laid out."""
    tokens, wanted = code_tokens(code), [t.string for t in code_tokens(piece.strip())]
    starts = [0]
    for line in code.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(row_col: tuple[int, int]) -> int:
        return starts[row_col[0] - 1] + row_col[1]

    return [
        (offset(tokens[i].start), offset(tokens[i + len(wanted) - 1].end))
        for i in range(len(tokens) - len(wanted) + 1)
        if [t.string for t in tokens[i : i + len(wanted)]] == wanted
    ]


def apply(target: Path, mutation: Mutation) -> None:
    path = target / mutation.path
    code = path.read_text(encoding="utf-8")
    spans = locate(code, mutation.old)
    if len(spans) != 1:
        raise SystemExit(
            f"mutation {mutation.name}: the code to mutate occurs {len(spans)} times in {mutation.path}; "
            "update the list"
        )
    ((start, end),) = spans
    path.write_text(code[:start] + mutation.new + code[end:], encoding="utf-8")


def tests_pass(folder: Path, mode: str) -> bool:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not real_models", *TESTS]
    env = {**os.environ, "SAFE_TEST_BATCHED": MODES[mode]}
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode not in (0, 1):
        raise SystemExit(
            f"pytest ({mode}) could not run in {folder} (exit {done.returncode}):\n"
            f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return done.returncode == 0


def kills(folder: Path, modes: list[str]) -> dict[str, tuple[bool, float]]:
    """Per mode: whether the tests failed, and how long they took."""
    outcome = {}
    for mode in modes:
        started = time.perf_counter()
        outcome[mode] = (not tests_pass(folder, mode), time.perf_counter() - started)
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--mode", choices=["both", *MODES], default="both", help="how the tests decode (default both)")
    args = parser.parse_args()
    modes = list(MODES) if args.mode == "both" else [args.mode]
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.list or not chosen:
        for m in MUTATIONS:
            print(f"{m.name:32} {m.rule}")
        return 0 if args.list else 2
    with tempfile.TemporaryDirectory(prefix="safe-mutations-") as tmp:
        clean = Path(tmp) / "clean"
        copy_project(clean)
        failing = [mode for mode in modes if not tests_pass(clean, mode)]
        if failing:
            print(f"the unmutated project fails its tests ({', '.join(failing)}): fix that first", file=sys.stderr)
            return 1
        killed = dict.fromkeys(modes, 0)
        survived = []
        for m in chosen:
            folder = Path(tmp) / m.name
            copy_project(folder)
            apply(folder, m)
            outcome = kills(folder, modes)
            for mode, (dead, _) in outcome.items():
                killed[mode] += dead
            verdict = "killed  " if all(dead for dead, _ in outcome.values()) else "SURVIVED"
            per_mode = ", ".join(
                f"{mode} {'killed' if dead else 'SURVIVED'} {s:.0f} s" for mode, (dead, s) in outcome.items()
            )
            print(f"{verdict}  {m.name:32} {m.rule}  ({per_mode})", flush=True)
            if verdict == "SURVIVED":
                survived.append(m.name)
            shutil.rmtree(folder)
    print(
        "\n"
        + "; ".join(f"{killed[mode]} of {len(chosen)} mutations killed {mode}" for mode in modes)
        + (f"; survived (in some mode): {', '.join(survived)}" if survived else "")
    )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

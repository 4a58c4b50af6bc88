"""What one decoding run is asked to do (`DecodeConfig`), checked before any model runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ConfigError

METHODS = ("unite", "topk", "gac", "core", "eva")
SHARPENING = ("heuristic", "geometric", "none")
CORE_SCORES = ("rbf", "linear", "power")  # CoRE's token consistency f(δ) (decisions/core.py)
CORE_SPACES = ("union", "main")  # where CoRE mixes: UniTE's union of strings, or the drafter's vocabulary (the paper)


@dataclass(frozen=True)
class EnsembleConfig:
    # unite: top-k union + first-sub-token fill | topk: no fill | gac: full vocabulary | core: UniTE's union
    # reweighted by consistency (CoRE) | eva: the assisting models mapped into the drafter's vocabulary (EVA)
    method: str = "unite"
    top_k: int = 10
    weights: tuple[float, ...] | None = None  # one per model, in the order the models are given; None = equal
    sharpen: str = "heuristic"
    sharpen_lambda: float = 0.1
    gate: bool | None = None  # ensemble only where the drafter's top p < 0.5; None = on for GaC only (the paper's GaC)
    core_score: str = "rbf"  # CoRE's f(δ): rbf (the paper's default), linear or power
    core_beta: float = 2.0  # CoRE's rbf sharpness β
    core_alpha: float = 5.0  # CoRE's power exponent α
    core_space: str = "union"  # CoRE over UniTE's union; main: the drafter's vocabulary, as the paper
    eva_top: int = 320  # EVA: each model's top tokens softmaxed before mapping
    eva_drop: int = 5  # EVA: a model joins if its top token is in another's top eva_drop

    @property
    def gated(self) -> bool:
        return self.method == "gac" if self.gate is None else self.gate


STRATEGIES = ("single", "per-token", "safe", "byte-level")
ALONE = ("single", "byte-level")  # the strategies that also run one model
BYTE_COMBINES = ("mixture", "product")
SAFE_MODES = ("exact", "fast")
PER_TOKEN_COMMITS = ("first-subtoken", "full")
MAX_NEW_TOKENS = 4096
TOP_K_SHOWN = 5  # candidates per drafted token in events


@dataclass(frozen=True)
class DecodeConfig:
    strategy: str = "safe"
    max_new_tokens: int = 64
    lookahead: int = 5  # n: tokens the drafter drafts per SAFE round (the paper's default)
    drafter: int = 0  # index into the model list
    safe_mode: str = "exact"  # exact: the paper's one ensemble per round | fast: keep scanning past a kept draft
    per_token_commit: str = "first-subtoken"  # UniTE: the drafter appends its first sub-token of the choice | full
    byte_combine: str = "mixture"  # byte-level: Σ wᵢ·pᵢ of the next-byte distributions | product: normalised Π pᵢ^wᵢ
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None  # None: a fresh seed, reported in RunStarted.config
    # SAFE: end a round's draft right after a token the drafter gave p < draft_gate (0: the paper's full drafts)
    draft_gate: float = 0.3
    # SAFE (greedy): keep a draft where the weighted mean p of the models' own tokens is above this (the paper's ½)
    consensus_threshold: float = 0.5
    stop: tuple[str, ...] = ()  # the run ends at the first of these strings after the response's leading whitespace
    force: tuple[tuple[int, str], ...] = ()  # (committed-token index, text committed there instead): what-if branches
    damage_kl_steps: int = 16  # conditioning-damage KL measured at most this often (one extra forward each)
    # SAFE: verifiers' passes at once and the next draft during verification (`overlap.py`); None: on only when
    # every model sits on its own non-CPU device. The same output either way.
    overlap: bool | None = None

    def validate(self, model_count: int) -> None:
        ens = self.ensemble
        checks = [
            (self.strategy in STRATEGIES, f"strategy must be one of {', '.join(STRATEGIES)}"),
            (1 <= self.max_new_tokens <= MAX_NEW_TOKENS, f"max new tokens must be 1..{MAX_NEW_TOKENS}"),
            (1 <= self.lookahead <= 64, "lookahead must be 1..64"),
            (self.safe_mode in SAFE_MODES, f"safe mode must be one of {', '.join(SAFE_MODES)}"),
            (
                self.per_token_commit in PER_TOKEN_COMMITS,
                f"per-token commit must be one of {', '.join(PER_TOKEN_COMMITS)}",
            ),
            (self.byte_combine in BYTE_COMBINES, f"byte combination must be one of {', '.join(BYTE_COMBINES)}"),
            (ens.method in METHODS, f"ensemble method must be one of {', '.join(METHODS)}"),
            (ens.sharpen in SHARPENING, f"sharpening must be one of {', '.join(SHARPENING)}"),
            (1 <= ens.top_k <= 1000, "top-k must be 1..1000"),
            (0 < ens.sharpen_lambda < 1, "sharpening lambda must be in (0, 1)"),
            (ens.core_score in CORE_SCORES, f"CoRE's score must be one of {', '.join(CORE_SCORES)}"),
            (0 < ens.core_beta <= 100, "CoRE's beta must be in (0, 100]"),
            (0 < ens.core_alpha <= 100, "CoRE's alpha must be in (0, 100]"),
            (ens.core_space in CORE_SPACES, f"CoRE's space must be one of {', '.join(CORE_SPACES)}"),
            (1 <= ens.eva_top <= 100_000, "EVA's top must be 1..100000"),
            (1 <= ens.eva_drop <= 1000, "EVA's drop must be 1..1000"),
            (0 <= self.temperature <= 10, "temperature must be 0 (greedy) to 10"),
            (0 < self.top_p <= 1, "top-p must be in (0, 1]"),
            (self.seed is None or 0 <= self.seed < 2**63, "the seed must be a whole number ≥ 0"),
            (0 <= self.drafter < model_count, "the drafter must be one of the models"),
            (self.strategy in ALONE or model_count >= 2, f"{self.strategy} needs at least two models"),
            (ens.weights is None or len(ens.weights) == model_count, "give one weight per model"),
            (ens.weights is None or (min(ens.weights) >= 0 and sum(ens.weights) > 0), "weights must be ≥ 0, not all 0"),
            (0 <= self.damage_kl_steps <= MAX_NEW_TOKENS, f"damage KL steps must be 0..{MAX_NEW_TOKENS}"),
            (0 <= self.draft_gate < 1, "the draft gate must be in [0, 1)"),
            (0 < self.consensus_threshold < 1, "the consensus threshold must be in (0, 1)"),
            (self.overlap in (None, True, False), "overlap must be true, false or unset (auto)"),
            (all(self.stop), "a stop sequence cannot be empty"),
            (
                all(0 <= i < self.max_new_tokens for i, _ in self.force),
                "a forced token's index must be below max new tokens",
            ),
            (all(text for _, text in self.force), "a forced token needs a text"),
            (len({i for i, _ in self.force}) == len(self.force), "force each token index at most once"),
            (not (self.force and self.strategy == "byte-level"), "byte-level decoding cannot force tokens"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

"""lm-evaluation-harness model ``safe-ensemble``: SAFE, per-token or a single model behind lm-eval's `LM`.

    python -m safe_engine lm-eval run --model safe-ensemble \\
        --model_args 'models=embedded:gemma-3-270m|embedded:smollm2-135m-instruct,strategy=safe' \\
        --tasks safe_gsm8k_cot --limit 4

The front door includes our offline tasks (`LM_EVAL_TASKS_DIR`: ``python -m safe_engine lm-eval ls tasks`` lists
them with lm-eval's own) unless an ``--include_path`` of your own replaces them (lm-eval's CLI takes one folder).

Model args are the decoding options of ``python -m safe_engine generate`` (`options.py`: ``models`` with
``|`` between specs, since lm-eval splits on commas; ``strategy``, ``lookahead``, ``top_k``, ``weights``,
``cpu_linear``, ``cpu_int8`` ...), plus ``concurrency`` (requests decoding at once, default 16) and ``provenance_file``
(a JSONL side file: one line per request, keyed by task and doc id, with SAFE's provenance).

- `generate_until`: every request of a call runs on its own thread through `safe_engine.decode`, so
  the engine can step them together; ``until`` ends a run (not inside the response's leading whitespace,
  the engine's rule) and is cut off, ``max_gen_toks`` bounds it, ``do_sample``/``temperature``/``top_p``
  choose greedy or sampled decoding. A context that leaves no room for ``max_gen_toks`` is refused before
  any request runs.
- Prompts: lm-eval's context is the whole input of every model, as its HF model does. With
  ``--apply_chat_template`` the conversation is flattened into one user turn (`runs.flatten_messages`)
  and *each model wraps it in its own chat template*; an assistant prefill (``gen_prefix``) has no
  place in that and is refused.
- `loglikelihood` / `loglikelihood_rolling`: `likelihood.py` (each model under its own tokenization,
  combined as log of the weighted mean of probabilities; ``single`` scores with the drafter alone).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import lm_eval.models  # noqa: F401 - lm-eval's own models first: it loads them only into an empty registry
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from ..contract.config import DecodeConfig
from ..contract.errors import ConfigError, ModelLoadError
from ..models.cache import load_models
from ..models.loading import LoadedModel, pick_device
from ..options import load_options, model_specs, parse_options
from . import LM_EVAL_TASKS_DIR, likelihood
from .requests import complete, flatten_messages, plain

logger = logging.getLogger(__name__)

CHAT_PREFIX = "safe-ensemble chat:"
"""Marks a context built by `apply_chat_template`: the JSON conversation follows (lm-eval keeps it as is)."""
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HF model's default
GEN_KWARGS = {"until", "max_gen_toks", "do_sample", "temperature", "top_p"}


@register_model("safe-ensemble")
class SafeEnsembleLM(LM):
    def __init__(
        self,
        models: str | Sequence[str] | None = None,
        concurrency: int = 16,
        provenance_file: str | None = None,
        batch_size=None,  # lm-eval passes these; requests run `concurrency` at a time instead
        max_batch_size=None,
        **options,
    ):
        super().__init__()
        if models is not None:
            options["models"] = models
        device = options.pop("device", None)  # lm-eval's own device argument (a default when none is asked for)
        if device is not None and options.get("devices") is None:
            options["devices"] = _available(str(device))
        self._max_new_tokens_given = "max_new_tokens" in options or "max-new-tokens" in options
        self.args, self.config = parse_options(options)
        if int(concurrency) < 1:
            raise ConfigError("concurrency must be at least 1")
        self.concurrency = int(concurrency)
        self.templated = load_models(model_specs(self.args), load_options(self.args), _progress)
        for lm in self.templated:
            _ = lm.vocab.id_of_bytes  # build the byte tables once, before threads (and the plain views) share them
        self.untemplated = [plain(lm) for lm in self.templated]
        self.provenance: list[dict] = []
        self.provenance_file = provenance_file
        self._lock = threading.Lock()

    # ------------------------------------------------------------ lm-eval's chat path
    @property
    def tokenizer_name(self) -> str:
        return "safe-ensemble:" + "+".join(lm.spec.spec for lm in self.templated)

    def chat_template(self, chat_template: bool | str = False) -> str:
        return "\n".join(getattr(lm.tokenizer, "chat_template", None) or "" for lm in self.templated)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not add_generation_prompt:
            raise ConfigError(
                "safe-ensemble cannot prefill the assistant's turn (gen_prefix): each model has its own chat "
                "template and the engine starts the response itself"
            )
        return CHAT_PREFIX + json.dumps(chat_history, ensure_ascii=False)

    def _prompt(self, context: str) -> tuple[str, list[LoadedModel]]:
        """(prompt, the models as they take it): a chat context goes through each model's own template."""
        if context.startswith(CHAT_PREFIX):
            return flatten_messages(json.loads(context[len(CHAT_PREFIX) :])), self.templated
        return context, self.untemplated

    # ------------------------------------------------------------ generation
    def _gen_config(self, gen_kwargs: dict, index: int) -> DecodeConfig:
        unknown = set(gen_kwargs) - GEN_KWARGS
        if unknown:
            logger.warning("safe-ensemble ignores generation kwargs %s", ", ".join(sorted(unknown)))
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        default_max = self.config.max_new_tokens if self._max_new_tokens_given else DEFAULT_MAX_GEN_TOKS
        temperature = self._temperature(gen_kwargs)
        seed = self.config.seed
        if temperature > 0 and seed is not None:
            seed += index  # repeats of one request (self-consistency) must not draw the same sample
        config = replace(
            self.config,
            max_new_tokens=int(gen_kwargs.get("max_gen_toks", default_max)),
            stop=tuple(dict.fromkeys(self.config.stop + tuple(u for u in until if u))),
            temperature=temperature,
            top_p=float(gen_kwargs.get("top_p", self.config.top_p)),
            seed=seed,
        )
        config.validate(len(self.templated))
        return config

    def _temperature(self, gen_kwargs: dict) -> float:
        """do_sample false: greedy; else the request's temperature, else 1.0 with do_sample (HF's default), else
        the model args' temperature."""
        if "do_sample" in gen_kwargs and not gen_kwargs["do_sample"]:
            return 0.0
        if "temperature" in gen_kwargs:
            return float(gen_kwargs["temperature"])
        return 1.0 if gen_kwargs.get("do_sample") else self.config.temperature

    def _check_room(self, models: Sequence[LoadedModel], prompt: str, config: DecodeConfig, where: str) -> None:
        """Refuse, before anything runs, a prompt that leaves a model no room for the tokens asked for."""
        for lm in _participants(models, config):
            window = likelihood.context_window(lm)
            need = len(lm.encode_prompt(prompt)) + config.max_new_tokens + config.lookahead
            if window and need > window:
                raise ConfigError(
                    f"{where}: the prompt is {need - config.max_new_tokens - config.lookahead} tokens for {lm.name}; "
                    f"with max_gen_toks {config.max_new_tokens} it exceeds the model's context of {window} "
                    "(lower max_gen_toks or num_fewshot)"
                )

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        jobs = []
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args[0], request.args[1]
            prompt, models = self._prompt(context)
            config = self._gen_config(dict(gen_kwargs), index)
            self._check_room(models, prompt, config, _where(request))
            jobs.append((models, prompt, config))
        results = self._run(jobs, lambda job: complete(*job), "safe-ensemble generate_until", disable_tqdm)
        for request, result in zip(requests, results):
            self._record(request, "generate_until", result.provenance)
        return [result.text for result in results]

    # ------------------------------------------------------------ scoring
    def _scorers(self) -> tuple[list[int], list[float]]:
        """Indices of the models that score, and their weights (the drafter alone for `single`)."""
        if self.config.strategy == "single":
            return [self.config.drafter], [1.0]
        weights = self.config.ensemble.weights or (1.0,) * len(self.templated)
        return list(range(len(self.templated))), list(weights)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        indices, weights = self._scorers()
        jobs = []
        for request in requests:
            context, continuation = request.args
            if context.startswith(CHAT_PREFIX):
                prompt, models = self._prompt(context)
                pairs = [(m.encode_prompt(prompt), likelihood.token_ids(m, continuation, False)) for m in models]
            else:
                pairs = [likelihood.encode_pair(m, context, continuation) for m in self.untemplated]
            pairs = [pairs[i] for i in indices]
            for i, (_, cont) in zip(indices, pairs):
                likelihood.check_fits(self.templated[i], cont, _where(request))
            jobs.append(pairs)

        def run(pairs):
            return [likelihood.score(self.templated[i], ctx, cont) for i, (ctx, cont) in zip(indices, pairs)]

        results = self._run(jobs, run, "safe-ensemble loglikelihood", disable_tqdm)
        return [self._combined(request, scores, indices, weights) for request, scores in zip(requests, results)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        indices, weights = self._scorers()

        def run(text):
            return [likelihood.rolling(self.templated[i], text) for i in indices]

        results = self._run([r.args[0] for r in requests], run, "safe-ensemble loglikelihood_rolling", disable_tqdm)
        return [self._combined(request, scores, indices, weights)[0] for request, scores in zip(requests, results)]

    def _combined(self, request, scores, indices, weights) -> tuple[float, bool]:
        logprob, greedy = likelihood.combine(scores, weights)
        per_model = {
            self.templated[i].name: {"logprob": s.logprob, "greedy": s.greedy, "tokens": s.tokens, "weight": w}
            for i, s, w in zip(indices, scores, weights)
        }
        self._record(request, request.request_type, {"per_model": per_model, "logprob": logprob, "greedy": greedy})
        return logprob, greedy

    # ------------------------------------------------------------ running and provenance
    def _run(self, jobs: list, fn: Callable, desc: str, disable_tqdm: bool) -> list:
        """`fn` over every job, `concurrency` at a time on threads, results in job order."""
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(jobs)))) as pool:
            futures = [pool.submit(fn, job) for job in jobs]
            with tqdm(total=len(futures), desc=desc, disable=disable_tqdm, file=sys.stderr) as bar:
                for future in futures:
                    future.add_done_callback(lambda _: bar.update())
                return [future.result() for future in futures]

    def _record(self, request, request_type: str, record: dict) -> None:
        """One provenance line for `request`, keyed by task, doc id and request index."""
        line = {"task": request.task_name, "doc_id": request.doc_id, "idx": request.idx, "type": request_type} | record
        with self._lock:
            self.provenance.append(line)
            if self.provenance_file:
                with open(self.provenance_file, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(line, ensure_ascii=False) + "\n")


def _available(device: str) -> str:
    """lm-eval passes its own default device (cuda:0) when none is asked for: fall back as its HF model does."""
    try:
        return pick_device(device)
    except ModelLoadError:
        logger.warning("device %s is not available here; safe-ensemble picks one itself", device)
        return "auto"


def _participants(models: Sequence[LoadedModel], config: DecodeConfig) -> list[LoadedModel]:
    return [models[config.drafter]] if config.strategy == "single" else list(models)


def _where(request) -> str:
    return f"{request.task_name} doc {request.doc_id}"


def _progress(message: str) -> None:
    print(f"[safe] {message}", file=sys.stderr, flush=True)


def with_shipped_tasks(argv: Sequence[str]) -> list[str]:
    """`argv` with ``--include_path`` naming our shipped tasks, unless it names a folder already. Every lm-eval
    subcommand (``run``, ``ls``, ``validate``, or none: lm-eval then inserts ``run``) takes it; a subcommand alone
    prints its help and is left so."""
    argv = list(argv)
    if len(argv) < 2 or any(arg == "--include_path" or arg.startswith("--include_path=") for arg in argv):
        return argv
    return [*argv, "--include_path", str(LM_EVAL_TASKS_DIR)]


def run_cli(argv: Sequence[str]) -> int:
    """lm-eval's own command line, unchanged but for our shipped tasks (`with_shipped_tasks`), with
    ``safe-ensemble`` registered (this module's import)."""
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *with_shipped_tasks(argv)]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0

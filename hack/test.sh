#!/usr/bin/env bash
# The whole test suite on a fresh machine: set up .venv, the engines venv of the conformance tier
# (hack/engines.sh: the real vLLM and LMCache, cached outside the repository), then run pytest.
# When the engines cannot be installed, the conformance tier is skipped with the reason, except on
# CI (CI=true), where it fails with it. KVTIER_SKIP_ENGINES=1 skips the install (same rules).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
./hack/setup.sh
echo "hack/test.sh: .venv ready ($((SECONDS - started)) s)"

started=$SECONDS
if [[ -n "${KVTIER_SKIP_ENGINES:-}" ]]; then
    export KVTIER_ENGINES_UNAVAILABLE="KVTIER_SKIP_ENGINES is set"
elif ! ./hack/engines.sh; then
    export KVTIER_ENGINES_UNAVAILABLE="hack/engines.sh could not install the engines venv (its output above says why)"
fi
if [[ -n "${KVTIER_ENGINES_UNAVAILABLE:-}" ]]; then
    echo "hack/test.sh: conformance tier unavailable: $KVTIER_ENGINES_UNAVAILABLE" \
         "($([[ "${CI:-}" == true ]] && echo "CI: its tests fail" || echo "its tests are skipped"))"
else
    echo "hack/test.sh: engines venv ready ($((SECONDS - started)) s)"
fi

exec .venv/bin/python -m pytest "$@"

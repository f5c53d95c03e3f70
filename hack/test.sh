#!/usr/bin/env bash
# The whole test suite on a fresh machine: set up .venv, build (or reuse) the real control plane, install
# (or reuse) the engines venv of the conformance tier, then run pytest.
# - Tests taking the `cluster` fixture (tests/e2e, the pod simulator's) run on the embedded API emulator and
#   on the real control plane (tests/conftest.py: --ground). Without Go the real ground is skipped with one
#   line saying why, except with CI=true, where a missing toolchain fails the run.
# - The conformance tier (tests/conformance) runs the real vLLM and LMCache from hack/engines.sh, cached
#   outside the repository. When they cannot be installed it is skipped with the reason, except on CI
#   (CI=true), where its tests fail with it. KVTIER_SKIP_ENGINES=1 skips the install (same rules).
set -euo pipefail
cd "$(dirname "$0")/.."

timed() {  # timed LABEL COMMAND...: run it, print how long it took
  local label="$1" start=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "hack/test.sh: $label took $((SECONDS - start))s" >&2
  return $status
}

timed "setup (.venv, kubectl, helm)" ./hack/setup.sh

lint() {  # ruff and mypy read their settings from pyproject.toml
  .venv/bin/ruff check operator tests bench && .venv/bin/ruff format --check operator tests bench && .venv/bin/mypy
}
timed "lint, format and types (ruff check, ruff format --check, mypy)" lint

status=0
bin="$(timed "control plane (build or reuse)" ./hack/control-plane.sh | tail -1)" || status=$?
if [[ $status == 0 ]]; then
  export KVTIER_CONTROL_PLANE_BIN="$bin"
elif [[ $status == 3 && "${CI:-}" != "true" ]]; then
  echo "hack/test.sh: skipping the real control plane ground: no Go toolchain (CI=true makes this an error)" >&2
  export KVTIER_GROUND="${KVTIER_GROUND:-embedded}"
else
  echo "hack/test.sh: the real control plane could not be built (exit $status; see above)" >&2
  exit "$status"
fi

if [[ -n "${KVTIER_SKIP_ENGINES:-}" ]]; then
  export KVTIER_ENGINES_UNAVAILABLE="KVTIER_SKIP_ENGINES is set"
elif ! timed "engines venv (install or reuse)" ./hack/engines.sh; then
  export KVTIER_ENGINES_UNAVAILABLE="hack/engines.sh could not install the engines venv (its output above says why)"
fi
if [[ -n "${KVTIER_ENGINES_UNAVAILABLE:-}" ]]; then
  echo "hack/test.sh: conformance tier unavailable: $KVTIER_ENGINES_UNAVAILABLE" \
       "($([[ "${CI:-}" == true ]] && echo "CI: its tests fail" || echo "its tests are skipped"))" >&2
fi

exec .venv/bin/python -m pytest "$@"

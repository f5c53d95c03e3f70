#!/usr/bin/env bash
# The whole test suite on a fresh machine: set up .venv, build (or reuse) the real control plane, then run
# pytest. Tests taking the `cluster` fixture (tests/e2e, the pod simulator's) run on the embedded API
# emulator and on the real control plane (tests/conftest.py: --ground). Without Go the real ground is
# skipped with one line saying why, except with CI=true, where a missing toolchain fails the run.
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
exec .venv/bin/python -m pytest "$@"

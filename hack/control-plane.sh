#!/usr/bin/env bash
# Build (once) the real Kubernetes control plane the tests run against:
# kube-apiserver, kube-controller-manager, kube-scheduler and etcd, from their
# published Go modules (no binary downloads, no images). The wrapper modules in
# hack/control-plane/{kubernetes,etcd} pin every version; the binaries land in
#   ${KVTIER_CACHE:-$HOME/.cache/kvtier}/control-plane/<versions>-<hash of the pins>/bin
# and are reused while present. The last line printed is that bin directory.
#
# --bin-dir: only print that directory (nothing is built).
# Knobs: KVTIER_CACHE (cache root), KVTIER_BUILD_JOBS (go build -p, default:
# number of CPUs, at most 2), GOTOOLCHAIN (set it if a pin ever needs a newer Go
# than the machine's; every build then uses it). Exit 3 means "no Go toolchain".
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pins="$here/control-plane"
pinned() { awk -v m="$1" '$1==m{print $2} $1=="require" && $2==m{print $3}' "$2" | head -1; }
KUBERNETES_VERSION="$(pinned k8s.io/kubernetes "$pins/kubernetes/go.mod")"
ETCD_VERSION="$(pinned go.etcd.io/etcd/server/v3 "$pins/etcd/go.mod")"
# The version the binaries report (/version, what helm's kubeVersion checks): `go build` alone says v0.0.0.
minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  version_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
pin_hash="$( (cat "$pins"/kubernetes/go.mod "$pins"/kubernetes/go.sum "$pins"/etcd/go.mod "$pins"/etcd/go.sum \
  "$pins"/etcd/main.go; echo "$version_ldflags") | sha256sum | cut -c1-12)"
cache="${KVTIER_CACHE:-$HOME/.cache/kvtier}/control-plane/kubernetes-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}-${pin_hash}"
bin="$cache/bin"
binaries=(kube-apiserver kube-controller-manager kube-scheduler etcd)
case "${1:-}" in
  --bin-dir) echo "$bin"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--bin-dir]" >&2; exit 2 ;;
esac

present=1
for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || present=0; done
if [[ $present == 1 ]]; then
  echo "control plane: reusing kubernetes $KUBERNETES_VERSION + etcd $ETCD_VERSION from $bin" >&2
  echo "$bin"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "control plane: cannot build kubernetes $KUBERNETES_VERSION / etcd $ETCD_VERSION: no 'go' on PATH" \
       "(install Go >= 1.26 from https://go.dev/dl or your distribution; the build fetches modules from the Go module proxy)" >&2
  exit 3
fi

cpus="$(nproc 2>/dev/null || echo 2)"
jobs="${KVTIER_BUILD_JOBS:-$(( cpus < 2 ? cpus : 2 ))}"
export GOFLAGS="-mod=readonly -trimpath"
export CGO_ENABLED=0
stage="$cache/bin.partial.$$"
mkdir -p "$stage"
trap 'rm -rf "$stage"' EXIT

echo "control plane: building kubernetes $KUBERNETES_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler)" \
     "and etcd $ETCD_VERSION with $(go version | awk '{print $3}') -p $jobs into $bin" >&2
step() {  # step NAME DIR ARGS...: go build in DIR, timed
  local name="$1" dir="$2"; shift 2
  local start=$SECONDS
  (cd "$dir" && go build -p "$jobs" -ldflags="-s -w" "$@")  # a later -ldflags in "$@" replaces this one
  echo "control plane: built $name in $((SECONDS - start))s" >&2
}
total=$SECONDS
step "etcd $ETCD_VERSION" "$pins/etcd" -o "$stage/etcd" .
step "kubernetes $KUBERNETES_VERSION" "$pins/kubernetes" -ldflags="-s -w$version_ldflags" -o "$stage/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
rm -rf "$bin"
mv "$stage" "$bin"
trap - EXIT
echo "control plane: build took $((SECONDS - total))s; binaries in $bin" >&2
echo "$bin"

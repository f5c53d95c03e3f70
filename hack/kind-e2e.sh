#!/usr/bin/env bash
# End-to-end on kind: create a cluster (with a host directory mounted for a hostPath KVPool), build and load
# the kvtier image, `helm install` the chart with simulated engines (kvsim in the kvtier image; fake
# nvidia.com/gpu capacity on the nodes), apply the kind examples (hack/kind/) and wait for them to be Ready,
# then run the e2e tests against the cluster (KVTIER_E2E_KUBECONFIG). Extra arguments go to pytest.
#
# Needs docker (a running daemon) and kind; helm and kubectl come from .venv/bin (./hack/setup.sh).
# Exits 2, saying what is missing, when docker or kind is not available.
#
# Environment: KVTIER_KIND_CLUSTER (default kvtier-e2e), KVTIER_IMAGE (default kvtier/kvtier-operator:e2e),
# KVTIER_KIND_KEEP=1 keeps the cluster it creates (an existing one is always kept), KVTIER_KIND_NODE_IMAGE (kind's default node image if unset),
# DOCKER and KIND name the binaries (default: docker and kind on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${KVTIER_KIND_CLUSTER:-kvtier-e2e}"
IMAGE="${KVTIER_IMAGE:-kvtier/kvtier-operator:e2e}"
KEEP="${KVTIER_KIND_KEEP:-0}"
DOCKER="${DOCKER:-docker}"
KIND="${KIND:-kind}"
NAMESPACE=kvtier-system
RELEASE=kvtier-operator
POOL_PATH=/var/lib/kvtier-pool   # inside the kind node: hack/kind/kvpool.yaml's spec.storage.hostPath.path
FAKE_GPUS=8
STATE=.kvtier/kind
KUBECONFIG_FILE="$STATE/kubeconfig"

say() { printf 'hack/kind-e2e.sh: %s\n' "$*" >&2; }

# --- prerequisites ------------------------------------------------------------------------------------------
missing=()
if ! command -v "$DOCKER" >/dev/null 2>&1; then
    missing+=("docker: not found (install Docker Engine, https://docs.docker.com/engine/install/)")
elif ! "$DOCKER" info >/dev/null 2>&1; then
    missing+=("docker: '$DOCKER info' failed; the Docker daemon is not running or not reachable")
fi
if ! command -v "$KIND" >/dev/null 2>&1; then
    missing+=("kind: not found (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)")
fi
for tool in helm kubectl python; do
    if [[ ! -x .venv/bin/$tool ]]; then
        missing+=("$tool: .venv/bin/$tool not found (run ./hack/setup.sh)")
    fi
done
if ((${#missing[@]})); then
    say "cannot run the kind e2e tests on this machine:"
    printf '  - %s\n' "${missing[@]}" >&2
    say "the embedded-cluster e2e tests need none of this: ./hack/test.sh tests/e2e"
    exit 2
fi

HELM="$PWD/.venv/bin/helm"
KUBECTL="$PWD/.venv/bin/kubectl"
PYTHON="$PWD/.venv/bin/python"
mkdir -p "$STATE"
POOL_DIR="$(cd "$STATE" && pwd)/pool"
mkdir -p "$POOL_DIR"
chmod 0777 "$POOL_DIR"   # the engine pods run as a non-root user

kubectl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
helm() { "$HELM" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

cleanup() {
    local status=$?
    if ((status != 0)); then
        say "failed; operator log:"
        kubectl -n "$NAMESPACE" logs "deployment/$RELEASE" --tail=100 >&2 2>/dev/null || true
    fi
    if [[ "$KEEP" == 1 || "$created" == 0 ]]; then
        say "keeping cluster $CLUSTER (KUBECONFIG=$KUBECONFIG_FILE); delete it with: $KIND delete cluster --name $CLUSTER"
    else
        "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    fi
    exit "$status"
}

# --- cluster ------------------------------------------------------------------------------------------------
created=0
if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    say "reusing kind cluster $CLUSTER (kept afterwards)"
else
    created=1
    say "creating kind cluster $CLUSTER (host $POOL_DIR -> node $POOL_PATH)"
    config="$STATE/kind-config.yaml"
    cat > "$config" <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraMounts:
      - hostPath: $POOL_DIR
        containerPath: $POOL_PATH
YAML
    node_image=()
    if [[ -n "${KVTIER_KIND_NODE_IMAGE:-}" ]]; then
        node_image=(--image "$KVTIER_KIND_NODE_IMAGE")
    fi
    "$KIND" create cluster --name "$CLUSTER" --config "$config" "${node_image[@]}" --wait 180s
fi
trap cleanup EXIT
"$KIND" get kubeconfig --name "$CLUSTER" > "$KUBECONFIG_FILE"

# Engines ask for nvidia.com/gpu; kind nodes have none, so advertise fake ones (an extended resource the
# kubelet leaves alone). kvsim needs no GPU.
for node in $(kubectl get nodes -o name); do
    kubectl patch "$node" --subresource=status --type=json \
        -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$FAKE_GPUS\"}]" >/dev/null
done

# --- image --------------------------------------------------------------------------------------------------
say "building $IMAGE"
"$DOCKER" build --tag "$IMAGE" .
"$KIND" load docker-image "$IMAGE" --name "$CLUSTER"

# --- operator -----------------------------------------------------------------------------------------------
say "installing the chart (simulated engines)"
helm upgrade --install "$RELEASE" charts/kvtier-operator \
    --namespace "$NAMESPACE" --create-namespace \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
    --set engines.simulated=true --set resyncSeconds=1 \
    --wait --timeout 5m
kubectl -n "$NAMESPACE" rollout status "deployment/$RELEASE" --timeout=3m

# --- examples -----------------------------------------------------------------------------------------------
say "applying hack/kind/ (a hostPath pool and a simulated deployment)"
kubectl apply -f hack/kind/
kubectl wait --for=condition=Ready inferencedeployment/kind-chat -n default --timeout=5m
kubectl get kvpools,inferencedeployments -A
kubectl delete -f hack/kind/ --wait=true --timeout=3m

# --- e2e tests ----------------------------------------------------------------------------------------------
say "running the e2e tests against $CLUSTER"
KVTIER_E2E_KUBECONFIG="$KUBECONFIG_FILE" "$PYTHON" -m pytest tests/e2e "$@"

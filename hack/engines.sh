#!/usr/bin/env bash
# The engines venv of the conformance tier (tests/conformance): the real vLLM and LMCache from PyPI,
# CPU only, in a cached virtual environment outside the repository.
#
#   ${KVTIER_ENGINES_VENV:-${KVTIER_CACHE:-$HOME/.cache/kvtier}/engines-venv}
#
# What goes in, pinned:
# - torch: a CPU-only local wheel when one is given (KVTIER_TORCH_WHEEL=/path/torch-*.whl; vLLM pins
#   2.14.0, its parser works with any recent CPU build), else PyPI's default build of the pinned
#   version with its CUDA libraries (several GB, downloaded once and kept in the venv and pip's cache).
#   PyPI has no CPU-only torch for Linux x86_64, so that is the only registry build there is.
# - vllm, lmcache and lmcache-rust-raw-block-io (the raw_block L2 adapter's extension, a
#   pre-release on PyPI that lmcache 0.5.6 does not declare) with --no-deps: their full dependency
#   sets pull GPU kernels (flashinfer, cutlass, cupy...) that no CPU test needs.
# - the modules that the conformance tests' imports need (ENGINE_DEPS below), with their own deps.
#
# Idempotent: a venv whose stamp matches this script's pins is reused in a second. Prints every
# step's time. Exits non-zero, with the reason on stderr, when the install is impossible.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.33.0
LMCACHE_VERSION=0.5.6
RAW_BLOCK_VERSION=0.5.7rc2
TORCH_VERSION=2.14.0
# Import-time dependencies of: vLLM's `serve` CLI parser, EngineArgs and connector registry; LMCache's
# config loader, `lmcache server` (argparser, config builders, MP server on CPU) and its MP client.
ENGINE_DEPS=(
    "numpy<=2.2.6" "setuptools>=77.0.3,<81" packaging pyyaml py-cpuinfo psutil regex cachetools
    "transformers>=5.16.1,<5.21" "huggingface_hub>=1.31" tokenizers safetensors sentencepiece
    "pydantic>=2.12" "fastapi<0.137,>=0.133" "starlette>=1.0.1" uvicorn uvloop httptools "aiohttp>=3.14.4"
    httpx "prometheus_client>=0.18,<=0.24.1" prometheus-fastapi-instrumentator "openai>=2.25" anthropic
    pyzmq msgspec blake3 cloudpickle cbor2 pybase64 setproctitle ijson orjson partial-json-parser
    python-json-logger watchfiles einops tqdm filelock jsonschema pillow tiktoken
    "opentelemetry-api>=1.27,<=1.40.0" "opentelemetry-sdk>=1.27" "opentelemetry-exporter-otlp>=1.27"
    "opentelemetry-exporter-prometheus>=0.50b0,<=0.61b0" opentelemetry-semantic-conventions-ai
    sortedcontainers aiofile aiofiles redis "nvtx==0.2.15" "numba==0.65.0" awscrt cryptography
    "oss-harmony>=0.0.11" "xgrammar==0.2.8" "llguidance>=1.7.0,<1.8.0" "apache-tvm-ffi==0.1.11"
)

CACHE="${KVTIER_CACHE:-$HOME/.cache/kvtier}"
VENV="${KVTIER_ENGINES_VENV:-$CACHE/engines-venv}"
PYTHON="${KVTIER_ENGINES_PYTHON:-python3}"
TORCH_WHEEL="${KVTIER_TORCH_WHEEL:-}"
STAMP="$VENV/.kvtier-engines"
WANT="vllm==$VLLM_VERSION lmcache==$LMCACHE_VERSION raw-block==$RAW_BLOCK_VERSION torch==$TORCH_VERSION${TORCH_WHEEL:+ ($TORCH_WHEEL)} deps=$(printf '%s\n' "${ENGINE_DEPS[@]}" | sha256sum | cut -c1-12)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/python" ]]; then
    echo "hack/engines.sh: reusing $VENV ($WANT)"
    exit 0
fi

# With --no-deps, pip lists what vLLM and LMCache would also want (GPU kernels...): expected, so not shown.
PIP_EXPECTED="^(ERROR: pip's dependency resolver does not currently take into account|[A-Za-z0-9_.-]+ [^ ]+ requires .*(which is not installed|but you have))"
pip_install() {
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" \
        2> >(grep -v -E "$PIP_EXPECTED" >&2 || true)
}

started=$SECONDS
step_started=$SECONDS
doing="creating the venv"
step() {
    echo "hack/engines.sh: $1 ($((SECONDS - step_started)) s)"
    step_started=$SECONDS
}
trap 'echo "hack/engines.sh: failed while $doing (the venv is left incomplete and rebuilt next time)" >&2' ERR

echo "hack/engines.sh: installing into $VENV: $WANT"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
pip_install --upgrade pip
step "venv with $("$VENV/bin/python" --version)"

doing="installing torch"
if [[ -n "$TORCH_WHEEL" ]]; then
    pip_install "$TORCH_WHEEL"
    step "torch from the local wheel $TORCH_WHEEL"
else
    pip_install "torch==$TORCH_VERSION"
    step "torch==$TORCH_VERSION from PyPI (with its CUDA libraries: PyPI has no CPU-only Linux build)"
fi

doing="installing vllm and lmcache"
pip_install --no-deps "vllm==$VLLM_VERSION" "lmcache==$LMCACHE_VERSION"
step "vllm==$VLLM_VERSION lmcache==$LMCACHE_VERSION (--no-deps)"
doing="installing lmcache-rust-raw-block-io"
pip_install --no-deps --pre "lmcache-rust-raw-block-io==$RAW_BLOCK_VERSION"
step "lmcache-rust-raw-block-io==$RAW_BLOCK_VERSION (--no-deps)"

doing="installing the import-time dependencies"
pip_install "${ENGINE_DEPS[@]}"
step "import-time dependencies: ${ENGINE_DEPS[*]}"

doing="checking the imports"
# The imports the conformance tests make, checked once here so a broken venv fails with its reason.
VLLM_TARGET_DEVICE=cpu LMCACHE_LOG_LEVEL=WARNING LMCACHE_DISABLE_BANNER=1 "$VENV/bin/python" - <<'PY'
import importlib

for module in (
    "vllm.entrypoints.cli.serve",
    "vllm.engine.arg_utils",
    "vllm.distributed.kv_transfer.kv_connector.factory",
    "lmcache.v1.config",
    "lmcache.v1.multiprocess.server",
    "lmcache.v1.multiprocess.http_server",
    "lmcache.cli.commands.bench.server_bench.command",
    "lmcache_rust_raw_block_io",
):
    importlib.import_module(module)
PY
step "imports checked"

echo "$WANT" >"$STAMP"
echo "hack/engines.sh: done in $((SECONDS - started)) s: $("$VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -ciE '^[a-z]') packages, $(du -sh "$VENV" | cut -f1) in $VENV"

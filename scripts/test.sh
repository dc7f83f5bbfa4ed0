#!/usr/bin/env bash
# The whole test suite, on a fresh machine with Rust and Python's pip: it installs and
# starts what the tests need (Redis, a virtualenv with the `openai` SDK and NVRTC), then
# checks formatting and lints and runs every Rust test (unit, end-to-end, the real model,
# every CUDA kernel compiled with NVRTC — no GPU needed), every rule file's samples, the
# rules' recall and precision on 40 freshly generated corpora and on peer scanners' public
# samples (floors just under the current scores, so a regression fails), and the gitleaks
# coverage table. GPU tests: scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }

ensure_redis() {
    if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return; fi
    if ! command -v redis-server >/dev/null 2>&1; then
        log "installing redis-server"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    fi
    log "starting redis-server on 127.0.0.1:6379"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
    for _ in $(seq 50); do redis-cli ping >/dev/null 2>&1 && return; sleep 0.1; done
    echo "redis-server did not start" >&2; exit 1
}

ensure_python() {
    if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import openai' 2>/dev/null; then
        log "creating .venv with the openai SDK"
        python3 -m venv .venv
        .venv/bin/python -m pip install -q --disable-pip-version-check 'openai>=1.40'
    fi
    # The OpenAI Agents SDK, for the agent loop over /v1/responses (tests/python/agents_sdk.py).
    if ! .venv/bin/python -c 'import agents' 2>/dev/null; then
        log "installing the OpenAI Agents SDK into .venv"
        .venv/bin/python -m pip install -q --disable-pip-version-check 'openai-agents>=0.24,<0.25'
    fi
}

ensure_nvrtc() {
    # NVRTC is a plain library (PyPI wheel): the kernels compile in CI without a GPU.
    # cudarc finds it by name on LD_LIBRARY_PATH; CROSSGUARD_REQUIRE_NVRTC=1 makes its
    # absence a test failure here instead of a skip.
    if ! .venv/bin/python -c 'import nvidia.cuda_nvrtc' 2>/dev/null; then
        log "installing NVRTC (nvidia-cuda-nvrtc-cu12) into .venv"
        .venv/bin/python -m pip install -q --disable-pip-version-check 'nvidia-cuda-nvrtc-cu12>=12.4,<13'
    fi
    local dir
    dir=$(.venv/bin/python -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))')
    export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export CROSSGUARD_REQUIRE_NVRTC=1
}

ensure_chromium() {
    # The dashboard's browser tests drive headless Chromium through chromedriver.
    if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then return; fi
    log "installing chromium and chromium-driver"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
}

ensure_clippy() {
    cargo clippy --version >/dev/null 2>&1 && return
    log "installing clippy"
    rustup component add clippy >/dev/null 2>&1 || true
}

ensure_rustfmt() {
    cargo fmt --version >/dev/null 2>&1 && return
    log "installing rustfmt"
    rustup component add rustfmt >/dev/null 2>&1 || true
}

ensure_redis
ensure_clippy
ensure_rustfmt
ensure_python
ensure_nvrtc
ensure_chromium
log "cargo fmt --check (rustfmt.toml)"
if cargo fmt --version >/dev/null 2>&1; then
    cargo fmt --check
else
    echo "rustfmt is not installed and could not be: formatting NOT checked" >&2
fi
log "cargo clippy --workspace --all-targets (warnings are errors)"
if cargo clippy --version >/dev/null 2>&1; then
    cargo clippy --workspace --all-targets --locked -q -- -D warnings
else
    echo "clippy is not installed and could not be: lints NOT checked" >&2
fi
log "cargo test --workspace"
cargo test --workspace --locked
log "crossguard rules test rules/ (every rule's samples)"
cargo run --locked -q -p crossguard -- rules test rules
log "recall and precision of rules/ on 40 corpora the rules were not tuned on"
python3 scripts/corpus/eval_seeds.py --crossguard "${CARGO_TARGET_DIR:-target}/debug/crossguard" --seeds 1-40
log "recall and precision of rules/ on peer scanners' public samples (tuning and held-back splits)"
python3 scripts/corpus/eval_peers.py --crossguard "${CARGO_TARGET_DIR:-target}/debug/crossguard" --split tuning --min-recall 0.615 --min-precision 0.95
python3 scripts/corpus/eval_peers.py --crossguard "${CARGO_TARGET_DIR:-target}/debug/crossguard" --split held-back --min-recall 0.50 --min-precision 0.92
log "every gitleaks default rule mapped to a crossguard rule or a reason"
python3 scripts/corpus/gitleaks_coverage.py --check

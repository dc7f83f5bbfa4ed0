#!/usr/bin/env bash
# The GPU check of the CUDA backend, in one go, on a machine with an NVIDIA GPU (made for
# an H200 box with torch + transformers and no internet): build (release), run the GPU
# tests (the CPU test bodies on the CUDA backend, every isolation fault switch, GPU vs CPU
# greedy tokens and logits), run the GPU benchmarks next to a transformers baseline on the
# same GGUF, profile one decode step per kernel (Nsight Compute, when present), and write a
# markdown report. Each stage has a time limit; all together stay under 10 minutes.
#
#   scripts/gpu-check.sh [--model PATH] [--out DIR] [--prebuilt DIR] [--wheels DIR] [--no-profile]
#   scripts/gpu-check.sh --bundle DIR        # on a build machine: release binaries into DIR
#
# --model     the GGUF (default: $CROSSGUARD_MODEL, else the default model in the cache,
#             $CROSSGUARD_CACHE_DIR or ~/.cache/crossguard, models/SmolLM2-135M-Instruct.Q4_1.gguf)
# --out       where the report and logs go (default: $OUT if set, else ./gpu-check-out)
# --prebuilt  binaries made by --bundle (for a GPU machine that cannot run cargo)
# --wheels    Python wheels to install first (e.g. `gguf`, which transformers needs to
#             read the GGUF, on a machine that cannot reach a package index)
# --no-profile  skip the Nsight Compute timing of one decode step (saves up to 3 minutes of
#             a short device lease)
#
# NVRTC: the CUDA 12 or 13 library from Python's nvidia-cuda-nvrtc packages (torch
# installs one), .venv, the CUDA toolkit, or the system library path; it is offered to
# cudarc under the plain name libnvrtc.so, which cudarc tries first whatever its version.
# The report only states what was measured here.
set -uo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }
die() { echo "gpu-check: $*" >&2; exit 2; }

MODEL="${CROSSGUARD_MODEL:-}"
OUTDIR="${OUT:-$PWD/gpu-check-out}"
PREBUILT=""
BUNDLE=""
WHEELS=""
PROFILE=1
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --out) OUTDIR="$2"; shift 2 ;;
        --prebuilt) PREBUILT="$2"; shift 2 ;;
        --bundle) BUNDLE="$2"; shift 2 ;;
        --wheels) WHEELS="$2"; shift 2 ;;
        --no-profile) PROFILE=""; shift ;;
        *) die "unknown argument $1 (see the header of $0)" ;;
    esac
done

# The CPU suite's isolation tests run on the GPU through cuda_backend's bodies.
TESTS=(cuda_backend cuda_nvrtc)
# The engine's unit tests hold the device-KV checks (zero-fill kernel, skip_zero_fill).
LIB_TESTS=engine_lib

# Builds the release test binaries and the benchmark, copies them into $1.
build_into() {
    local dest="$1"
    mkdir -p "$dest"
    log "cargo build --release (engine GPU tests, bench_gpu)"
    local args=()
    for t in "${TESTS[@]}"; do args+=(--test "$t"); done
    cargo test --release --locked -p crossguard-engine --lib "${args[@]}" --no-run --message-format=json 2>"$dest/build.log" \
        | python3 -c 'import json,sys,shutil,os
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    exe, kind = m.get("executable"), m.get("target", {}).get("kind")
    if m.get("reason") != "compiler-artifact" or not exe:
        continue
    if kind == ["test"]:
        shutil.copy(exe, os.path.join(sys.argv[1], m["target"]["name"]))
    elif kind == ["lib"]:
        shutil.copy(exe, os.path.join(sys.argv[1], sys.argv[2]))' "$dest" "$LIB_TESTS" || return 1
    cargo build --release --locked -p crossguard-engine --example bench_gpu 2>>"$dest/build.log" || return 1
    cp "${CARGO_TARGET_DIR:-target}/release/examples/bench_gpu" "$dest/"
    # The commit the binaries are built from (the GPU machine's copy of .git may be older).
    echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo -dirty)" >"$dest/commit.txt"
    # Debug info off: the bundle must fit what can be carried to the GPU machine.
    strip "$dest"/bench_gpu "$dest/$LIB_TESTS" "${TESTS[@]/#/$dest/}" 2>/dev/null || true
}

if [ -n "$BUNDLE" ]; then
    build_into "$BUNDLE" || die "build failed (see $BUNDLE/build.log)"
    ls -la "$BUNDLE"
    exit 0
fi

mkdir -p "$OUTDIR"
START=$(date +%s)

# The model, where the tests look for the default one.
if [ -z "$MODEL" ]; then
    MODEL="${CROSSGUARD_CACHE_DIR:-$HOME/.cache/crossguard}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
[ -f "$MODEL" ] || die "no model at $MODEL (pass --model PATH)"
CACHE="$OUTDIR/cache"
mkdir -p "$CACHE/models"
ln -sf "$(readlink -f "$MODEL")" "$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
export CROSSGUARD_CACHE_DIR="$CACHE"

# NVRTC: the first libnvrtc.so.1[23] found, linked as libnvrtc.so in a folder of our own
# (cudarc's first candidate name), with its own folder on the path for its builtins.
find_nvrtc() {
    local py
    for py in python3 .venv/bin/python; do
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" - <<'PY' 2>/dev/null && return 0
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for pattern in ("nvidia/cuda_nvrtc/lib/libnvrtc.so.1[23]*", "nvidia/cu1[23]/lib/libnvrtc.so.1[23]*", "nvidia/*/lib/libnvrtc.so.1[23]*"):
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, pattern)))
        if hits:
            print(hits[0]); sys.exit(0)
sys.exit(1)
PY
    done
    ls /usr/local/cuda/lib64/libnvrtc.so.1[23]* /usr/local/cuda-*/lib64/libnvrtc.so.1[23]* 2>/dev/null | head -n 1 | grep . && return 0
    ldconfig -p 2>/dev/null | awk '/libnvrtc\.so\.1[23]/ {print $NF; exit}' | grep .
}
nvrtc_lib=$(find_nvrtc) || nvrtc_lib=""
nvrtc_dir=""
if [ -n "$nvrtc_lib" ]; then
    nvrtc_dir="$OUTDIR/nvrtc"
    mkdir -p "$nvrtc_dir"
    ln -sf "$nvrtc_lib" "$nvrtc_dir/libnvrtc.so"
    export LD_LIBRARY_PATH="$nvrtc_dir:$(dirname "$nvrtc_lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -n "$WHEELS" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OUTDIR/site" "$WHEELS"/*.whl >&2 \
        && export PYTHONPATH="$OUTDIR/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export CROSSGUARD_REQUIRE_NVRTC=1 CROSSGUARD_GPU_TESTS=1

{
    echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(cat "${PREBUILT:-/nonexistent}/commit.txt" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "gpu:    $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi failed')"
    echo "cpus:   $(nproc)"
    echo "model:  $MODEL"
    echo "nvrtc:  ${nvrtc_lib:-not found}"
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2

BIN="$PREBUILT"
if [ -z "$BIN" ]; then
    BIN="$OUTDIR/bin"
    build_into "$BIN" || { cp "$BIN/build.log" "$OUTDIR/" 2>/dev/null; die "build failed (see $OUTDIR/build.log); on a machine without cargo access use --bundle elsewhere and --prebuilt here"; }
fi

# run_tests SECONDS BINARY [FILTER...]; the limits keep the whole check inside one
# 10-minute device call, a hung kernel included.
run_tests() {
    local limit="$1" name="$2"; shift 2
    log "tests: $name"
    # One thread: the GPU tests share one device and print in order.
    timeout "$limit" "$BIN/$name" --test-threads=1 "$@" >"$OUTDIR/tests-$name.log" 2>&1
    echo "exit $?" >>"$OUTDIR/tests-$name.log"
    tail -n 3 "$OUTDIR/tests-$name.log" >&2
}
run_tests 60 cuda_nvrtc
run_tests 60 "$LIB_TESTS" backend::cuda
run_tests 120 cuda_backend

log "benchmark: crossguard (bench_gpu)"
timeout 240 "$BIN/bench_gpu" "$MODEL" cuda 128 128 1,16,64,256 >"$OUTDIR/ours.jsonl" 2>"$OUTDIR/ours.err"
echo "exit $?" >>"$OUTDIR/ours.err"

log "benchmark: transformers baseline"
timeout 120 python3 scripts/bench/transformers_baseline.py "$MODEL" --prompt-tokens 128 --decode-tokens 128 \
    --batches 1,16,64,256 >"$OUTDIR/baseline.jsonl" 2>"$OUTDIR/baseline.err"
echo "exit $?" >>"$OUTDIR/baseline.err"

# Where a decode step's time goes: each kernel of one un-graphed step, timed by Nsight
# Compute (when the machine has it), at batch 1 and 64.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -n "$PROFILE" ] && [ -n "$NCU" ]; then
    for batch in 1 64; do
        log "profile: one decode step at batch $batch ($NCU)"
        timeout 90 "$NCU" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
            --print-summary per-kernel "$BIN/bench_gpu" "$MODEL" cuda 128 4 "$batch" profile >"$OUTDIR/profile-b$batch.txt" 2>&1
        echo "exit $?" >>"$OUTDIR/profile-b$batch.txt"
    done
fi

python3 scripts/bench/gpu_report.py "$OUTDIR" >"$OUTDIR/gpu-report.md"
echo "wall: $(( $(date +%s) - START )) s" >>"$OUTDIR/gpu-report.md"
log "report: $OUTDIR/gpu-report.md"
cat "$OUTDIR/gpu-report.md"

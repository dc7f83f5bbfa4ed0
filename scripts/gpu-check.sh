#!/usr/bin/env bash
# The GPU check of the CUDA backend, in one go, on a machine with an NVIDIA GPU (made for
# an H200 box with torch + transformers and no internet): build (release), run the GPU
# tests (the CPU test bodies on the CUDA backend, every isolation fault switch, GPU vs CPU
# greedy tokens and logits), run the GPU benchmarks next to a transformers baseline on the
# same GGUF, and write a markdown report. Sized to finish in about 8 minutes.
#
#   scripts/gpu-check.sh [--model PATH] [--out DIR] [--prebuilt DIR]
#   scripts/gpu-check.sh --bundle DIR        # on a build machine: release binaries into DIR
#
# --model     the GGUF (default: $CROSSGUARD_MODEL, else the default model in the cache,
#             $CROSSGUARD_CACHE_DIR or ~/.cache/crossguard, models/SmolLM2-135M-Instruct.Q4_1.gguf)
# --out       where the report and logs go (default: $OUT if set, else ./gpu-check-out)
# --prebuilt  binaries made by --bundle (for a GPU machine that cannot run cargo)
#
# NVRTC: found in Python's nvidia-cuda-nvrtc-cu12 package (torch installs it), in .venv,
# or on the system library path. The report only states what was measured here.
set -uo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }
die() { echo "gpu-check: $*" >&2; exit 2; }

MODEL="${CROSSGUARD_MODEL:-}"
OUTDIR="${OUT:-$PWD/gpu-check-out}"
PREBUILT=""
BUNDLE=""
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --out) OUTDIR="$2"; shift 2 ;;
        --prebuilt) PREBUILT="$2"; shift 2 ;;
        --bundle) BUNDLE="$2"; shift 2 ;;
        *) die "unknown argument $1 (see the header of $0)" ;;
    esac
done

TESTS=(cuda_backend cuda_nvrtc isolation)
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

# NVRTC on the library path (cudarc loads libnvrtc.so.12 by name).
nvrtc_dir=""
for py in python3 .venv/bin/python; do
    command -v "$py" >/dev/null 2>&1 || continue
    nvrtc_dir=$("$py" -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null) && break
done
[ -n "$nvrtc_dir" ] && export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CROSSGUARD_REQUIRE_NVRTC=1 CROSSGUARD_GPU_TESTS=1

{
    echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "gpu:    $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi failed')"
    echo "cpus:   $(nproc)"
    echo "model:  $MODEL"
    echo "nvrtc:  ${nvrtc_dir:-system library path}"
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2

BIN="$PREBUILT"
if [ -z "$BIN" ]; then
    BIN="$OUTDIR/bin"
    build_into "$BIN" || { cp "$BIN/build.log" "$OUTDIR/" 2>/dev/null; die "build failed (see $OUTDIR/build.log); on a machine without cargo access use --bundle elsewhere and --prebuilt here"; }
fi

run_tests() {
    local name="$1"; shift
    log "tests: $name"
    # One thread: the GPU tests share one device and print in order.
    timeout 240 "$BIN/$name" --test-threads=1 "$@" >"$OUTDIR/tests-$name.log" 2>&1
    echo "exit $?" >>"$OUTDIR/tests-$name.log"
    tail -n 3 "$OUTDIR/tests-$name.log" >&2
}
run_tests cuda_nvrtc
run_tests "$LIB_TESTS" backend::cuda
run_tests cuda_backend
run_tests isolation

log "benchmark: crossguard (bench_gpu)"
timeout 180 "$BIN/bench_gpu" "$MODEL" cuda 128 128 1,16,64,256 >"$OUTDIR/ours.jsonl" 2>"$OUTDIR/ours.err"
echo "exit $?" >>"$OUTDIR/ours.err"

log "benchmark: transformers baseline"
timeout 150 python3 scripts/bench/transformers_baseline.py "$MODEL" --prompt-tokens 128 --decode-tokens 128 \
    --batches 1,16,64,256 >"$OUTDIR/baseline.jsonl" 2>"$OUTDIR/baseline.err"
echo "exit $?" >>"$OUTDIR/baseline.err"

python3 scripts/bench/gpu_report.py "$OUTDIR" >"$OUTDIR/gpu-report.md"
echo "wall: $(( $(date +%s) - START )) s" >>"$OUTDIR/gpu-report.md"
log "report: $OUTDIR/gpu-report.md"
cat "$OUTDIR/gpu-report.md"

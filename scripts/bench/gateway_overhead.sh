#!/usr/bin/env bash
# Gateway overhead: the same load sent straight to a fast mock upstream and through
# crossguard in front of it (full firewall and protection pipeline on), back to back, on
# loopback — and, when LITELLM_BIN names a LiteLLM proxy executable, through LiteLLM on the
# same mock in the same run (one worker, no database).
#
#   scripts/bench/gateway_overhead.sh            # build (release), run, print tables
#   python3 -m venv /tmp/litellm && /tmp/litellm/bin/pip install 'litellm[proxy]'
#   LITELLM_BIN=/tmp/litellm/bin/litellm scripts/bench/gateway_overhead.sh
#
# Scenarios, each run REPS times (direct, crossguard, litellm, alternating):
#   c1, c16, c64   non-streaming, closed loop at concurrency 1, 16, 64
#   r1000          non-streaming, open loop at 1,000 req/s (not sent to LiteLLM: it would
#                  only queue)
#   s1, s16        streaming (STREAM_CHUNKS content chunks), closed loop at concurrency 1, 16
# Every run: WARMUP_S seconds not counted, then SECONDS_PER_RUN measured. CPU time per
# request of the server hit (the mock for direct runs, the gateway for the others) comes
# from /proc/<pid>/stat (utime + stime) around each run.
# Raw lines go to $OUT_DIR/runs.jsonl, the tables to stdout and $OUT_DIR/summary.md.
#
# Knobs (environment): SECONDS_PER_RUN (4), WARMUP_S (1), REPS (3), MOCK_PORT (19001),
# GATEWAY_PORT (19002), LITELLM_PORT (19003), STREAM_CHUNKS (40),
# OUT_DIR (target/bench/gateway_overhead), SKIP_BUILD=1, LITELLM_BIN.
# The measured part takes about 6 × REPS × (SECONDS_PER_RUN + WARMUP_S) s = 1.5 min per
# target with the defaults, and is cut off at 8 minutes.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
SECONDS_PER_RUN=${SECONDS_PER_RUN:-4}
WARMUP_S=${WARMUP_S:-1}
REPS=${REPS:-3}
MOCK_PORT=${MOCK_PORT:-19001}
GATEWAY_PORT=${GATEWAY_PORT:-19002}
LITELLM_PORT=${LITELLM_PORT:-19003}
STREAM_CHUNKS=${STREAM_CHUNKS:-40}
LITELLM_BIN=${LITELLM_BIN:-}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT_DIR=${OUT_DIR:-$TARGET_DIR/bench/gateway_overhead}
BIN=$TARGET_DIR/release
KEY=sk-bench-1
DEADLINE=$((SECONDS + 480))

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  echo "== building (release): crossguard, mock_upstream, loadgen" >&2
  cargo build --release -p crossguard -p crossguard-e2e --bin crossguard --example mock_upstream --example loadgen >&2
fi
for exe in crossguard examples/mock_upstream examples/loadgen; do
  [[ -x "$BIN/$exe" ]] || { echo "missing $BIN/$exe (build failed?)" >&2; exit 1; }
done

mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for() { # url: until it answers, at most 10 s
  for _ in $(seq 100); do
    curl -fs -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "no answer from $1" >&2; return 1
}

"$BIN/examples/mock_upstream" --port "$MOCK_PORT" --threads 1 --stream-chunks "$STREAM_CHUNKS" >"$WORK/mock.log" 2>&1 &
MOCK_PID=$!
PIDS+=("$MOCK_PID")
cat >"$WORK/crossguard.toml" <<EOF
listen = "127.0.0.1:$GATEWAY_PORT"
data_dir = "$WORK/data"

# Load tests must not be throttled: the default of 64 requests in flight per tenant is
# the c64 scenario's whole concurrency (and the open loop can have more outstanding).
[limits]
max_concurrent_requests = 100000

[server]
max_connections = 100000

[[tenants]]
id = "bench"
api_keys = ["$KEY"]

[[models]]
id = "mock"
backend = "upstream"
base_url = "http://127.0.0.1:$MOCK_PORT/v1"
EOF
CROSSGUARD_LOG=warn "$BIN/crossguard" serve --config "$WORK/crossguard.toml" >"$WORK/gateway.log" 2>&1 &
GATEWAY_PID=$!
PIDS+=("$GATEWAY_PID")
wait_for "http://127.0.0.1:$GATEWAY_PORT/healthz"
# The mock has no GET route: any HTTP answer (405) means it is up.
for _ in $(seq 100); do
  curl -s -o /dev/null "http://127.0.0.1:$MOCK_PORT/v1/chat/completions" && break
  sleep 0.1
done

LITELLM_PID=
if [[ -n "$LITELLM_BIN" ]]; then
  cat >"$WORK/litellm.yaml" <<EOF
model_list:
  - model_name: mock
    litellm_params:
      model: openai/mock
      api_base: http://127.0.0.1:$MOCK_PORT/v1
      api_key: unused
general_settings:
  master_key: $KEY
EOF
  "$LITELLM_BIN" --config "$WORK/litellm.yaml" --host 127.0.0.1 --port "$LITELLM_PORT" --num_workers 1 >"$WORK/litellm.log" 2>&1 &
  LITELLM_PID=$!
  PIDS+=("$LITELLM_PID")
  for _ in $(seq 900); do
    curl -fs -o /dev/null -H "Authorization: Bearer $KEY" "http://127.0.0.1:$LITELLM_PORT/v1/models" && break
    sleep 0.1
  done
  curl -fs -o /dev/null -H "Authorization: Bearer $KEY" "http://127.0.0.1:$LITELLM_PORT/v1/models" \
    || { echo "LiteLLM did not come up; its log:" >&2; tail -30 "$WORK/litellm.log" >&2; exit 1; }
fi

DIRECT=http://127.0.0.1:$MOCK_PORT/v1/chat/completions
THROUGH=http://127.0.0.1:$GATEWAY_PORT/v1/chat/completions
RUNS=$OUT_DIR/runs.jsonl
: >"$RUNS"

one() { # scenario rep target -- loadgen args...
  local scenario=$1 rep=$2 target=$3 url pid
  shift 4
  if (( SECONDS > DEADLINE )); then echo "time budget spent; skipping $scenario/$rep/$target" >&2; return 0; fi
  # CPU per request of the server the load hits: the mock alone, or the gateway.
  case $target in
    direct) url=$DIRECT pid=$MOCK_PID ;;
    crossguard) url=$THROUGH pid=$GATEWAY_PID ;;
    litellm) url=http://127.0.0.1:$LITELLM_PORT/v1/chat/completions pid=$LITELLM_PID ;;
  esac
  timeout 60 "$BIN/examples/loadgen" run --url "$url" --key "$KEY" --model mock \
    --duration-s "$SECONDS_PER_RUN" --warmup-s "$WARMUP_S" --cpu-pid "$pid" \
    --label "scenario=$scenario" --label "target=$target" --label "rep=$rep" "$@" | tee -a "$RUNS" >&2
}

scenario() { # name -- loadgen args...
  local name=$1 rep
  shift
  for rep in $(seq "$REPS"); do
    one "$name" "$rep" direct -- "$@"
    one "$name" "$rep" crossguard -- "$@"
    if [[ -n "$LITELLM_PID" && $name != r1000 ]]; then one "$name" "$rep" litellm -- "$@"; fi
  done
}

echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores" >&2
scenario c1 --concurrency 1
scenario c16 --concurrency 16
scenario c64 --concurrency 64
scenario r1000 --rate 1000
scenario s1 --stream --concurrency 1
scenario s16 --stream --concurrency 16
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

kill -0 "$GATEWAY_PID" 2>/dev/null || { echo "crossguard died; its log:" >&2; cat "$WORK/gateway.log" >&2; exit 1; }
if [[ -s "$WORK/gateway.log" ]]; then echo "== crossguard logged (warn and above):" >&2; head -20 "$WORK/gateway.log" >&2; fi
"$BIN/examples/loadgen" summarize "$RUNS" | tee "$OUT_DIR/summary.md"
echo "raw runs: $RUNS" >&2

#!/usr/bin/env bash
# Builds and runs the fuzz targets with the stable toolchain: libFuzzer comes from the
# `libfuzzer-sys` crate, coverage from LLVM's sanitizer-coverage pass, switched on with
# stable -C flags (what cargo-fuzz passes, minus its nightly-only sanitizer option).
#
#   scripts/fuzz.sh [target|all] [seconds]      (default: all targets, 600 s each)
#
# 0 seconds only builds.
#
# Targets: gguf (engine/fuzz), stream_scan and load_rules (firewall/fuzz), sse and
# chat_request (gateway/fuzz). Each run starts from the committed seed corpus
# (<crate>/fuzz/corpus/<target>) and grows a working copy under target/fuzz/corpus/; the
# committed corpus is only changed by FUZZ_MERGE=1, which minimises the working corpus
# into it (libFuzzer -merge=1). A crash stops the run: the script prints the reproducer's
# path and the command that replays it, and exits 1. A summary line per target goes to
# stdout and to target/fuzz/summary.tsv: target, seconds, executions, the working corpus
# (units, bytes, as libFuzzer counts them), the committed corpus (files, bytes), crashes.
#
# Environment: FUZZ_JOBS (cargo build jobs), FUZZ_MERGE=1 (see above), FUZZ_NO_BUILD=1
# (run what the last build left, e.g. one target while another crate builds), FUZZ_ARGS
# (extra libFuzzer flags).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/target/fuzz"
triple=$(rustc -vV | sed -n 's/^host: //p')

# target -> crate directory, and the libFuzzer flags that fit its input.
declare -A crate=(
  [gguf]=engine/fuzz
  [stream_scan]=firewall/fuzz
  [load_rules]=firewall/fuzz
  [sse]=gateway/fuzz
  [chat_request]=gateway/fuzz
)
# -timeout: building the streaming automata of one shipped rule (`twitter-bearer-token`,
# counted repetitions) takes over 60 s instrumented on a loaded 2-core host; the loader's
# automaton size limit bounds it, so only a much longer run is a finding.
# -malloc_limit_mb: one allocation far beyond the input size is a memory bug; the GGUF
# reader may legitimately copy a whole tensor, the text parsers never need megabytes.
declare -A flags=(
  [gguf]="-max_len=70000 -malloc_limit_mb=512"
  [stream_scan]="-max_len=4096 -timeout=60"
  [load_rules]="-max_len=4096 -timeout=300"
  [sse]="-max_len=16384 -malloc_limit_mb=64"
  [chat_request]="-max_len=16384 -malloc_limit_mb=64"
)
order=(sse chat_request load_rules stream_scan gguf)

usage() {
  echo "usage: scripts/fuzz.sh [target|all] [seconds]   targets: ${order[*]}" >&2
  exit 2
}

which=${1:-all}
seconds=${2:-600}
[[ $seconds =~ ^[0-9]+$ ]] || usage
if [[ $which == all ]]; then
  targets=("${order[@]}")
elif [[ -n ${crate[$which]:-} ]]; then
  targets=("$which")
else
  usage
fi

# Stable equivalents of cargo-fuzz's instrumentation, plus the checks a debug build has.
# --target keeps these flags off build scripts and proc macros, which must not be
# instrumented (they would need libFuzzer's runtime to link).
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 -Cllvm-args=-sanitizer-coverage-stack-depth \
 --cfg fuzzing -Cdebug-assertions -Coverflow-checks -Cdebuginfo=line-tables-only"
export CARGO_TARGET_DIR="$out/build"

build() {
  local dir=$1 bin=$2
  (cd "$root/$dir" && cargo build --release --locked --target "$triple" --bin "$bin" ${FUZZ_JOBS:+-j "$FUZZ_JOBS"})
}

# Prints "executions<TAB>units<TAB>bytes" from a libFuzzer log.
stats() {
  local log=$1 execs units bytes
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  read -r units bytes < <(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -1 | sed 's|corp: ||; s|/| |') || true
  printf '%s\t%s\t%s\n' "${execs:-0}" "${units:-0}" "${bytes:-0}"
}

mkdir -p "$out"
summary="$out/summary.tsv"
status=0
for t in "${targets[@]}"; do
  dir=${crate[$t]}
  seeds="$root/$dir/corpus/$t"
  work="$out/corpus/$t"
  artifacts="$out/artifacts/$t/"
  log="$out/$t.log"
  mkdir -p "$seeds" "$work" "$artifacts"
  if [[ ${FUZZ_NO_BUILD:-0} != 1 ]]; then
    echo "== $t: building ($dir)" >&2
    build "$dir" "$t"
  fi
  bin="$out/build/$triple/release/$t"
  ((seconds > 0)) || continue
  echo "== $t: fuzzing for ${seconds}s, log in $log" >&2
  rc=0
  # shellcheck disable=SC2086 # the flag strings are lists of words
  "$bin" "$work" "$seeds" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$artifacts" ${flags[$t]} ${FUZZ_ARGS:-} >"$log" 2>&1 || rc=$?
  crashes=0
  if ((rc != 0)); then
    crashes=1
    status=1
    repro=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    tail -n 30 "$log" >&2
    echo "!! $t: libFuzzer exited $rc; reproducer: ${repro:-none written, see $log}" >&2
    [[ -n $repro ]] && echo "!! replay: $bin ${flags[$t]} $repro" >&2
  elif [[ ${FUZZ_MERGE:-0} == 1 ]]; then
    echo "== $t: minimising the corpus into $seeds" >&2
    merged="$out/merged/$t"
    rm -rf "$merged" && mkdir -p "$merged"
    # shellcheck disable=SC2086
    "$bin" -merge=1 "$merged" "$seeds" "$work" ${flags[$t]} >>"$log" 2>&1
    rm -rf "$seeds" && mv "$merged" "$seeds"
  fi
  IFS=$'\t' read -r execs units bytes < <(stats "$log")
  kept=$(find "$seeds" -type f | wc -l)
  kept_bytes=$(du -sb "$seeds" | cut -f1)
  line=$(printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' "$t" "$seconds" "$execs" "$units" "$bytes" "$kept" "$kept_bytes" "$crashes")
  echo "$line" | tee -a "$summary"
done
exit "$status"

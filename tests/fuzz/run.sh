#!/usr/bin/env bash
# run.sh BUILD_DIR SECONDS [TARGET...]: runs each libFuzzer harness (fuzz_<target> in
# BUILD_DIR/tests/fuzz) for SECONDS, starting from the seed corpus tests/fuzz/corpus/<family>/
# (the target's name up to its first '_': ckpt_dir reads ckpt's seeds, vcf_score vcf's; read
# only: new inputs go to BUILD_DIR/fuzz-corpus/<target>/), and
# prints one summary line per target as it ends: executions, coverage (edges / features:
# libFuzzer's cov: and ft:), corpus size, result.
# FUZZ_JOBS=N runs N targets at a time (default 1; give each its own core: libFuzzer's
# -max_total_time is wall time, so targets sharing a core each fuzz for a fraction of it).
# FUZZ_RUNS=N in the environment also ends each target after N executions (whichever comes
# first: a campaign to a number of executions gives SECONDS as its upper bound).
# Inputs are at most 1 KB for vcf* (a header and a few dozen records: each record costs a
# site's checks, windows and tokens, and at 64 KB fuzz_vcf fell from 6,000 to 1,500
# executions/s as its inputs grew), 4 KB for fastx and config (libFuzzer's default; their units
# are lines) and 64 KB for the binary containers (shard, safetensors, ckpt*); FUZZ_MAX_LEN=N
# sets it for every target.
# Exit 1 when a target crashed, leaked or tripped a sanitizer; its reproducer is left in
# BUILD_DIR/fuzz-artifacts/ (make it a regression test: add it to the seed corpus). The
# harnesses' scratch files go to a TMPDIR this script removes, even after a crash.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
secs=${2:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fastx shard safetensors config ckpt ckpt_dir vcf vcf_score)
mkdir -p "$build/fuzz-artifacts"
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/moe-fuzz.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
jobs=${FUZZ_JOBS:-1}
# run_target TARGET: one target's run; its summary line on stdout, its exit status (0: no
# findings) in $TMPDIR/rc-TARGET (the parent collects it after the background jobs end).
run_target() {
  local t=$1 exe=$build/tests/fuzz/fuzz_$1 work=$build/fuzz-corpus/$1 log=$build/fuzz-$1.log
  local maxlen rc execs cov ft corp res
  [ -x "$exe" ] || { echo "fuzz $t: $exe is not built"; echo 1 > "$TMPDIR/rc-$t"; return; }
  mkdir -p "$work"
  case $t in vcf*) maxlen=1024 ;; fastx | config) maxlen=4096 ;; *) maxlen=65536 ;; esac
  maxlen=${FUZZ_MAX_LEN:-$maxlen}
  set +e
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    nice "$exe" -max_total_time="$secs" ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} -rss_limit_mb=2048 \
    -max_len="$maxlen" -timeout=20 -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" \
    "$work" "$here/corpus/${t%%_*}" > "$log" 2>&1
  rc=$?
  set -e
  # (|| true: a target that died before its first status line has none of these)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
  ft=$(grep -Eo 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
  corp=$(grep -Eo 'corp: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
  if [ $rc -eq 0 ]; then res="no findings"; else res="FINDING (exit $rc, see $log)"; fi
  echo "fuzz $t: ${secs}s (inputs up to $maxlen bytes), ${execs:-?} executions, coverage ${cov:-?} edges / ${ft:-?} features, corpus ${corp:-?}: $res"
  echo $((rc != 0)) > "$TMPDIR/rc-$t"
}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_target "$t" &
done
wait
status=0
for t in "${targets[@]}"; do
  [ "$(cat "$TMPDIR/rc-$t" 2>/dev/null || echo 1)" = 0 ] || status=1
done
exit $status

#!/usr/bin/env bash
# Load and soak of the parameter server on this host (issue 17, item 5), through `commsched launch` (authenticated).
#   load: W workers x T tensors x I iterations, every dtype, integer data: every worker checks every element of every
#         sum exactly (ps_test_worker --mode exact), with partition boundaries changing every iteration.
#   soak: the same with many iterations; the RSS of every process (launcher, servers, workers) is sampled every
#         INTERVAL seconds into a CSV, and the growth from the first sample after warm-up (10% of the run) to the end
#         is reported per process. It fails when any process grows by more than 10% + 16 MiB.
#
#   scripts/soak.sh load [WORKERS=16] [TENSORS=1000] [ITERATIONS=100] [MAX_BYTES=65536]
#   scripts/soak.sh soak [WORKERS=4] [TENSORS=100] [ITERATIONS=2000] [MAX_BYTES=262144] [INTERVAL=2]
# Env: BUILD_DIR (default build), SERVERS (default 2), OUT (CSV, default build/soak_rss.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-load}
BUILD=${BUILD_DIR:-build}
LAUNCH=$BUILD/plugins/launch/commsched_ps_launch_dev
WORKER=$BUILD/tests/integration/ps/ps_test_worker
[[ -x $LAUNCH && -x $WORKER ]] || { echo "soak: build first (scripts/build.sh)" >&2; exit 2; }
SERVERS=${SERVERS:-2}
if [[ $MODE == load ]]; then
  W=${2:-16} T=${3:-1000} I=${4:-100} B=${5:-65536} INTERVAL=${6:-5}
else
  W=${2:-4} T=${3:-100} I=${4:-2000} B=${5:-262144} INTERVAL=${6:-2}
fi
OUT=${OUT:-$BUILD/soak_rss.csv}
MARK="soak$$x$RANDOM"

# Every process of the run inherits the marker; /proc/<pid>/environ finds them all.
sample() {
  local t=$1 p env role rank rss
  for p in /proc/[0-9]*; do
    env=$(tr '\0' '\n' 2>/dev/null <"$p/environ") 2>/dev/null || continue
    grep -qx "COMMSCHED_SOAK_MARKER=$MARK" <<<"$env" || continue
    role=$(grep -m1 '^COMMSCHED_ROLE=' <<<"$env" | cut -d= -f2) || true
    rank=$(grep -m1 '^COMMSCHED_RANK=' <<<"$env" | cut -d= -f2) || true
    rss=$(awk '/^VmRSS:/ {print $2}' "$p/status" 2>/dev/null) || continue
    [[ -n $rss ]] || continue
    echo "$t,${p#/proc/},${role:-launcher}${rank:+ $rank},$rss"
  done
}

echo "time_s,pid,process,rss_kib" >"$OUT"
start=$(date +%s)
COMMSCHED_SOAK_MARKER=$MARK "$LAUNCH" launch -w "$W" -s "$SERVERS" -- "$WORKER" --tensors "$T" --iterations "$I" \
  --max-bytes "$B" --mode exact >"$BUILD/soak_run.log" 2>&1 &
LPID=$!
trap 'kill -INT $LPID 2>/dev/null || true' INT TERM
while kill -0 "$LPID" 2>/dev/null; do
  sample $(($(date +%s) - start)) >>"$OUT"
  sleep "$INTERVAL"
done
rc=0
wait "$LPID" || rc=$?
took=$(($(date +%s) - start))
echo "soak: $MODE: $W workers x $T tensors x $I iterations (max $B bytes, every dtype), $SERVERS servers: exit $rc in ${took}s"
if ((rc != 0)); then
  tail -n 20 "$BUILD/soak_run.log"
  exit "$rc"
fi
# Growth per process: first sample after 10% of the run vs the last sample.
awk -F, -v took="$took" '
  NR == 1 { next }
  { key = $3 " (pid " $2 ")"; if (!(key in first) && $1 >= took * 0.1) first[key] = $4; if (key in first) { last[key] = $4; if ($4 > max[key]) max[key] = $4 } }
  END {
    bad = 0
    for (k in first) {
      growth = last[k] - first[k]
      ok = (last[k] <= first[k] * 1.10 + 16384)
      if (!ok) bad = 1
      printf "  %-28s rss after warm-up %7.1f MiB, max %7.1f MiB, last %7.1f MiB, growth %+6.1f MiB %s\n", k, first[k] / 1024, max[k] / 1024, last[k] / 1024, growth / 1024, ok ? "" : "  NOT FLAT"
    }
    exit bad
  }' "$OUT" | sort
status=${PIPESTATUS[0]}
echo "soak: RSS samples in $OUT"
exit "$status"

#!/usr/bin/env bash
# The scheduler against WFBP on all-reduce over a REAL shaped link: engine_bench's ranks (Engine + GlooBackend, compute
# emulated from a model profile) in two network namespaces joined by a veth pair, each end shaped with `tc ... tbf`
# (default 1gbit; no netem). Needs root and iproute2. Every address lives only inside the namespaces created here;
# they are deleted on exit, whatever happens.
#
#   sudo bench/collective/netns_engine_bench.sh [BUILD_DIR] [RATE] [PROFILES] [ITERS] [REPEATS]
#   e.g. bench/collective/netns_engine_bench.sh build 1gbit resnet50,transformer-base 5 3
#
# Policies alternate runs (wfbp, bytescheduler, wfbp, ...) so drift on a shared machine hits both alike. As in
# engine_bench: bytescheduler gets the order negotiation's global credit ($CREDIT, handed over by the engine), WFBP
# none. Environment: PARTITION (4MiB), CREDIT (16MiB), WARMUP (1).
set -euo pipefail

BUILD=${1:-build}
RATE=${2:-1gbit}
PROFILES=${3:-resnet50,transformer-base}
ITERS=${4:-5}
REPEATS=${5:-3}
PARTITION=${PARTITION:-4MiB}
CREDIT=${CREDIT:-16MiB}
WARMUP=${WARMUP:-1}
BIN="$BUILD/bench/collective/engine_bench"
HERE=$(cd "$(dirname "$0")/../.." && pwd)
[[ -x "$BIN" ]] || { echo "netns_engine_bench: $BIN not found (build the engine_bench target)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "netns_engine_bench: needs root (network namespaces)" >&2; exit 2; }

source "$HERE/bench/netns_link.sh"
PIDS=()
OUT=$(mktemp -d)

cleanup() {
  netns_stop_pids
  netns_link_down
  rm -rf "$OUT"
}
trap cleanup EXIT INT TERM
netns_link_up csar 214 "$RATE"

echo "# link: veth between namespaces, tbf $RATE each direction; 2 ranks (rank 0 in $NA, rank 1 in $NB)"
echo "# engine_bench --partition $PARTITION, $ITERS iterations after $WARMUP warm-up, $REPEATS runs per policy"

PORT=29600
# Runs one 2-rank engine_bench; prints rank 0's mean iteration time in ms.
run_once() {
  local profile=$1 policy=$2
  PORT=$((PORT + 1))
  local out="$OUT/$profile.$policy.$PORT"
  local args=(--rank-process --profile "$HERE/workload/profiles/$profile.json" --policy "$policy" --out "$out"
              --iters "$ITERS" --warmup "$WARMUP" --partition "$PARTITION" --credit "$CREDIT")
  local envs=(COMMSCHED_NUM_WORKERS=2 COMMSCHED_ROOT_ADDR="$A" COMMSCHED_ROOT_PORT="$PORT"
              COMMSCHED_SECRET="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')")  # beyond loopback: authenticate
  ip netns exec "$NB" env "${envs[@]}" COMMSCHED_RANK=1 COMMSCHED_BIND="$B" "$BIN" "${args[@]}" &
  local peer=$!
  PIDS+=("$peer")
  ip netns exec "$NA" env "${envs[@]}" COMMSCHED_RANK=0 COMMSCHED_BIND="$A" "$BIN" "${args[@]}"
  wait "$peer"
  cat "$out"
}

echo
echo "| model | policy | iteration ms (runs) | mean ms | speedup vs wfbp |"
echo "|---|---|---|---:|---:|"
IFS=, read -ra MODELS <<< "$PROFILES"
for m in "${MODELS[@]}"; do
  declare -A runs=()
  for ((r = 0; r < REPEATS; ++r)); do
    for p in wfbp bytescheduler; do runs[$p]+="$(run_once "$m" "$p") "; done
  done
  awk -v m="$m" -v w="${runs[wfbp]}" -v b="${runs[bytescheduler]}" 'BEGIN {
    nw = split(w, W, " "); nb = split(b, Bs, " ");
    sw = 0; for (i = 1; i <= nw; ++i) sw += W[i]; sb = 0; for (i = 1; i <= nb; ++i) sb += Bs[i];
    mw = sw / nw; mb = sb / nb;
    lw = ""; for (i = 1; i <= nw; ++i) lw = lw (i > 1 ? ", " : "") sprintf("%.1f", W[i]);
    lb = ""; for (i = 1; i <= nb; ++i) lb = lb (i > 1 ? ", " : "") sprintf("%.1f", Bs[i]);
    printf "| %s | wfbp | %s | %.1f | 1.00 |\n", m, lw, mw;
    printf "| %s | bytescheduler | %s | %.1f | %.3f |\n", m, lb, mb, mw / mb }'
  unset runs
done

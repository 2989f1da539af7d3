#!/usr/bin/env bash
# One cluster trial over REAL shaped links: S servers and W workers (`commsched server`, `commsched synthetic-worker`),
# every process in its own network namespace on a bridge, each host's link shaped with tbf at RATE both ways
# (bench/netns_link.sh, netns_star_up). Worker 0 writes its result JSON to RESULT. Needs root. NETNS_AUTH=off: see
# below. Every namespace and address made here is deleted on exit, whatever happens. Run by
# `commsched bench --mode cluster --links netns` (plugins/cli/run_command.cc), one trial per call.
#
#   plugins/cli/netns_trial.sh COMMSCHED MODEL RATE WORKERS SERVERS POLICY PARTITION CREDIT SMALL ITERS WARMUP RESULT
set -euo pipefail
[[ $# == 12 ]] || { sed -n 2,9p "$0" >&2; exit 2; }
BIN=$1 MODEL=$2 RATE=$3 WORKERS=$4 SERVERS=$5 POLICY=$6 PARTITION=$7 CREDIT=$8 SMALL=$9 ITERS=${10} WARMUP=${11}
RESULT=${12}
[[ $(id -u) == 0 ]] || { echo "netns_trial: needs root (network namespaces)" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")/../.." && pwd)
source "$HERE/bench/netns_link.sh"
PIDS=()
cleanup() {
  netns_stop_pids
  netns_star_down
}
trap cleanup EXIT INT TERM
netns_star_up cstr 216 $((SERVERS + WORKERS)) "$RATE"
ROOT=${STAR_ADDRS[0]}
# Beyond loopback the processes authenticate with a fresh secret (ZeroMQ CURVE: every byte is also encrypted, CPU the
# simulator does not charge); NETNS_AUTH=off runs them unauthenticated, as on a trusted cluster network.
if [[ ${NETNS_AUTH:-on} == off ]]; then
  AUTH=(COMMSCHED_AUTH=off)
else
  AUTH=(COMMSCHED_SECRET="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')")
fi
ENVS=("${AUTH[@]}" COMMSCHED_NUM_WORKERS="$WORKERS" COMMSCHED_NUM_SERVERS="$SERVERS" COMMSCHED_ROOT_ADDR="$ROOT"
      COMMSCHED_ROOT_PORT=29650 COMMSCHED_BACKEND=ps)
for ((s = 0; s < SERVERS; ++s)); do
  ip netns exec "${STAR_HOSTS[s]}" env "${ENVS[@]}" COMMSCHED_ROLE=server COMMSCHED_RANK="$s" \
    COMMSCHED_BIND="${STAR_ADDRS[s]}" timeout 900 "$BIN" server &
  PIDS+=($!)
done
WPIDS=()
for ((w = 0; w < WORKERS; ++w)); do
  i=$((SERVERS + w))
  ip netns exec "${STAR_HOSTS[i]}" env "${ENVS[@]}" COMMSCHED_ROLE=worker COMMSCHED_RANK="$w" \
    COMMSCHED_BIND="${STAR_ADDRS[i]}" timeout 900 "$BIN" synthetic-worker --model "$MODEL" --policy "$POLICY" \
    --iterations "$ITERS" --warmup "$WARMUP" --partition "$PARTITION" --credit "$CREDIT" --small-tensor "$SMALL" \
    --timeline-dir "" --result "$RESULT" &
  WPIDS+=($!)
done
PIDS+=("${WPIDS[@]}")
rc=0
for p in "${WPIDS[@]}"; do wait "$p" || rc=$?; done
exit $rc

#!/usr/bin/env bash
# DistributedDataParallel over REAL shaped links: DDP's own gloo all-reduce against the commsched comm hook
# (commsched.torch.ddp.register) on commsched's Gloo backend and on its parameter server. N hosts are network
# namespaces on a bridge (bench/netns_link.sh's star, tbf RATE both ways per host); every host runs its own
# `commsched launch --nnodes N --node-rank i` (one worker; with the PS, one server too). Needs root.
#
#   sudo bench/torch/netns_ddp_bench.sh [BUILD_DIR] [RATE] [REPEATS]     e.g. bench/torch/netns_ddp_bench.sh build 1gbit 3
#
# Environment: HOSTS_N (4), LAYERS (8), WIDTH (1024: 8.4 M parameters, 33.6 MB of gradients), BATCH (32),
# BUCKET_MB (4), STEPS (6 timed after 2 warm-up), CONFIGS ("ddp-gloo hook-gloo hook-ps"), RUN_TIMEOUT (300 s),
# PYTHON (/usr/bin/python3). Engine knobs (COMMSCHED_PARTITION_BYTES, COMMSCHED_CREDIT_BYTES, COMMSCHED_POLICY) pass
# through. Configurations run interleaved, each run a fresh cluster.
set -euo pipefail
BUILD=$(realpath -m "${1:-build}")
RATE=${2:-1gbit}
REPEATS=${3:-3}
HOSTS_N=${HOSTS_N:-4}
CONFIGS=${CONFIGS:-ddp-gloo hook-gloo hook-ps}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
PYTHON=${PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
BIN="$BUILD/plugins/commsched"
[[ -x "$BIN" ]] || { echo "netns_ddp_bench: $BIN not found (build the commsched target)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "netns_ddp_bench: needs root (network namespaces)" >&2; exit 2; }
OUT_DIR=$(mktemp -d)
source "$HERE/bench/netns_link.sh"
cleanup() { netns_star_down; rm -rf "$OUT_DIR"; }
trap cleanup EXIT INT TERM
netns_star_up cddp 216 "$HOSTS_N" "$RATE"
ROOT=${STAR_ADDRS[0]}
echo "# $HOSTS_N hosts (namespaces on a bridge), tbf $RATE each way per host; MLP ${LAYERS:-8} x ${WIDTH:-1024}," \
     "batch ${BATCH:-32}, ${STEPS:-6} timed steps; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
PORT=29800
RUNS="$OUT_DIR/runs.txt"
: > "$RUNS"
run_once() {
  local config=$1 rep=$2 mode=plain servers=0 pids=() rc=0
  [[ $config == hook-* ]] && mode=hook
  [[ $config == *-ps ]] && servers=1
  PORT=$((PORT + 2))
  local result="$OUT_DIR/$config.$rep.json" log="$OUT_DIR/$config.$rep.log" store="$OUT_DIR/store.$config.$rep"
  for ((i = 0; i < HOSTS_N; ++i)); do
    ip netns exec "${STAR_HOSTS[i]}" env PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 \
      timeout "$RUN_TIMEOUT" "$BIN" launch --nnodes "$HOSTS_N" --node-rank "$i" --root "$ROOT:$PORT" -w 1 \
      -s "$servers" --join-timeout 60 -- "$PYTHON" "$HERE/bench/torch/ddp_bench.py" --mode "$mode" --store "$store" \
      --result "$result" --layers "${LAYERS:-8}" --width "${WIDTH:-1024}" --batch "${BATCH:-32}" \
      --bucket-mb "${BUCKET_MB:-4}" --steps "${STEPS:-6}" >>"$log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  if [[ $rc == 0 && -s $result ]]; then
    local s
    s=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["step_s"])' "$result")
    echo "$config $rep $s" >> "$RUNS"
    echo "  run $rep $config: $(awk "BEGIN {printf \"%.1f\", $s * 1000}") ms per step"
  else
    echo "$config $rep FAILED" >> "$RUNS"
    echo "  run $rep $config: FAILED (exit $rc):" >&2
    tail -n 5 "$log" >&2
  fi
}
for ((r = 0; r < REPEATS; ++r)); do
  for c in $CONFIGS; do run_once "$c" "$r"; done
done
PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$HERE/bench/torch/ddp_bench.py" --summarize "$RUNS" $CONFIGS

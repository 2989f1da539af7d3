#!/usr/bin/env bash
# Round-trip cost of small-tensor iterations on each PS transport, side by side: 2 workers and 1 server on loopback
# push_pull 20 tensors (1 B - 200 KB, every dtype) per iteration and check every sum; ms per iteration, interleaved
# repetitions. This is where a lost wake-up or a slow poll shows (large transfers hide it).
#
#   bench/ps/small_rounds.sh [build-dir] [iterations] [reps]
set -euo pipefail
BUILD="${1:-build}"
ITER="${2:-300}"
REPS="${3:-3}"
EXE="$BUILD/tests/integration/ps/ps_test_worker"
[ -x "$EXE" ] || { echo "no $EXE: build first (./scripts/build.sh)" >&2; exit 1; }

one_run() {  # transport tls -> ms per iteration
  local port=$((20000 + RANDOM % 20000)) pids=() start end
  local common=(COMMSCHED_NUM_WORKERS=2 COMMSCHED_NUM_SERVERS=1 COMMSCHED_ROOT_ADDR=127.0.0.1
                COMMSCHED_ROOT_PORT=$port COMMSCHED_BIND=127.0.0.1 COMMSCHED_PS_TRANSPORT=$1 UCX_TLS=$2)
  start=$(date +%s%N)
  env "${common[@]}" COMMSCHED_ROLE=server COMMSCHED_RANK=0 "$EXE" 2>/dev/null & pids+=($!)
  for w in 0 1; do
    env "${common[@]}" COMMSCHED_ROLE=worker COMMSCHED_RANK=$w "$EXE" --tensors 20 --iterations "$ITER" \
      --max-bytes 200000 --mode exact 2>/dev/null & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "a $1 process failed" >&2; exit 1; }; done
  end=$(date +%s%N)
  awk -v ns=$((end - start)) -v it="$ITER" 'BEGIN { printf "%.3f", ns / 1e6 / it }'
}

echo "| rep | zmq ms/iter | ucx shm ms/iter | ucx tcp ms/iter |"
echo "|---|---:|---:|---:|"
for rep in $(seq 1 "$REPS"); do
  echo "| $rep | $(one_run zmq sm,self) | $(one_run ucx sm,self) | $(one_run ucx tcp) |"
done

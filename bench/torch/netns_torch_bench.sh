#!/usr/bin/env bash
# The PyTorch plugin over REAL shaped links: examples/pytorch_synthetic_benchmark.py with W workers and S parameter
# servers, every process in its own network namespace, all joined by veth pairs to a Linux bridge in a "switch"
# namespace (a star, like hosts on one switch). Each host's link is shaped with `tc ... tbf` (default 1gbit) on BOTH
# ends of its veth pair: the host end limits what the host sends, the switch end what it receives (no netem). Needs
# root and iproute2 (+ iperf3 for the link check). Every address lives only inside the namespaces created here; they
# are deleted on exit, whatever happens.
#
#   sudo bench/torch/netns_torch_bench.sh [BUILD_DIR] [RATE] [REPEATS]     e.g. bench/torch/netns_torch_bench.sh build 1gbit 4
#
# BUILD_DIR needs the `commsched` and `commsched_python` targets (PYTHONPATH=BUILD_DIR/python). Configurations run
# interleaved (wfbp, bytescheduler, bytescheduler + cross-iteration, wfbp, ...) so drift on a shared machine hits all
# alike. Each run starts a fresh cluster (servers and workers, rendezvous on server 0).
# Environment: WORKERS (4), SERVERS (2), MODEL (resnet18), IMAGE (32), BATCH (8 per worker), WARMUP (2),
# BATCHES_PER_ITER (2), ITERS (4), THREADS (1 torch thread per worker), CONFIGS ("wfbp bytescheduler bytescheduler+xi";
# a config is POLICY[+xi][@SCHEME], SCHEME a COMMSCHED_COMPRESSION value such as fp16, topk:0.01, signsgd),
# RUN_TIMEOUT (300 s per run), PYTHON (/usr/bin/python3), OUT_DIR (a temporary folder; the per-run JSON is kept there
# when set). SCRIPT=train runs examples/pytorch_train.py (the small CNN on learnable data) instead of the synthetic
# benchmark, for TRAIN_STEPS steps (60; the first WARMUP untimed) at TRAIN_BATCH (16) per worker, and also reports
# steps-to-loss (the first step whose running loss, over the workers and LOSS_WINDOW (5) steps, is below TARGET_LOSS
# (1.0)) and time-to-loss (those steps x the measured mean step time); MODEL, IMAGE, BATCH and ITERS do not apply.
# SCRIPT=tfprofile runs examples/tensorflow/tensorflow_profile_benchmark.py --api keras (commsched.keras's
# DistributedOptimizer on a model profile's tensors, PROFILE (resnet50), compute emulated x COMPUTE_SCALE (1)) with the
# test venv's python, ITERS x BATCHES_PER_ITER timed steps after WARMUP; its figure is steps/s x 1000 (in the img/s
# column: higher is faster, as there).
# Engine knobs (COMMSCHED_PARTITION_BYTES, COMMSCHED_CREDIT_BYTES, ...) pass through from the environment; unset, the
# product picks them from the cluster's shape (scheduler/auto_knobs.h; e.g. 256 KiB partitions and 1.5 MiB credit at
# 2 workers and 1 server; each worker's log says which).
set -euo pipefail

BUILD=$(realpath -m "${1:-build}")
RATE=${2:-1gbit}
REPEATS=${3:-4}
WORKERS=${WORKERS:-4}
SERVERS=${SERVERS:-2}
MODEL=${MODEL:-resnet18}
IMAGE=${IMAGE:-32}
BATCH=${BATCH:-8}
WARMUP=${WARMUP:-2}
BATCHES_PER_ITER=${BATCHES_PER_ITER:-2}
ITERS=${ITERS:-4}
THREADS=${THREADS:-1}
CONFIGS=${CONFIGS:-wfbp bytescheduler bytescheduler+xi}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
SCRIPT=${SCRIPT:-synthetic}
TRAIN_STEPS=${TRAIN_STEPS:-60}
TRAIN_BATCH=${TRAIN_BATCH:-16}
TARGET_LOSS=${TARGET_LOSS:-1.0}
LOSS_WINDOW=${LOSS_WINDOW:-5}
PROFILE=${PROFILE:-resnet50}
COMPUTE_SCALE=${COMPUTE_SCALE:-1}
[[ $SCRIPT == synthetic || $SCRIPT == train || $SCRIPT == tfprofile ]] ||
  { echo "netns_torch_bench: SCRIPT=$SCRIPT (allowed: synthetic, train, tfprofile)" >&2; exit 2; }
if [[ $SCRIPT == tfprofile ]]; then PYTHON=${PYTHON:-$HOME/.cache/commsched/test-venv/bin/python}; fi
PYTHON=${PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
BIN="$BUILD/plugins/commsched"
[[ -x "$BIN" ]] || { echo "netns_torch_bench: $BIN not found (build the commsched target)" >&2; exit 2; }
compgen -G "$BUILD/python/commsched/_C*.so" >/dev/null ||
  { echo "netns_torch_bench: no $BUILD/python/commsched/_C*.so (build the commsched_python target)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "netns_torch_bench: needs root (network namespaces)" >&2; exit 2; }
[[ -n ${OUT_DIR:-} ]] && { mkdir -p "$OUT_DIR"; KEEP=1; } || { OUT_DIR=$(mktemp -d); KEEP=0; }

source "$HERE/bench/netns_link.sh"
HOSTS=()   # namespace of each host: servers first, then workers
ADDRS=()
PIDS=()

cleanup() {
  netns_stop_pids
  netns_star_down
  [[ $KEEP == 1 ]] || rm -rf "$OUT_DIR"
}
trap cleanup EXIT INT TERM

netns_star_up csts 215 $((SERVERS + WORKERS)) "$RATE"
HOSTS=("${STAR_HOSTS[@]}")
ADDRS=("${STAR_ADDRS[@]}")
ROOT=${ADDRS[0]}

echo "# links: ${#HOSTS[@]} namespaces (S=$SERVERS servers, W=$WORKERS workers) on a bridge, veth + tbf $RATE each way per host"
if command -v iperf3 >/dev/null; then
  ip netns exec "${HOSTS[0]}" iperf3 -s -1 -B "$ROOT" -p 5201 >/dev/null 2>&1 &
  PIDS+=($!)
  sleep 0.5
  MBIT=$(ip netns exec "${HOSTS[SERVERS]}" iperf3 -c "$ROOT" -p 5201 -t 3 -f m 2>/dev/null | awk '/sender/ {print $(NF-3)}')
  echo "# iperf3 worker 0 -> server 0: ${MBIT:-?} Mbit/s"
fi
if [[ $SCRIPT == tfprofile ]]; then
  echo "# tensorflow_profile_benchmark.py --api keras, $PROFILE profile, compute x $COMPUTE_SCALE, $WARMUP warm-up and" \
       "$((ITERS * BATCHES_PER_ITER)) timed steps per run, $REPEATS run(s) per configuration, interleaved; $(nproc) cores," \
       "load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
elif [[ $SCRIPT == train ]]; then
  echo "# examples/pytorch_train.py (small CNN), batch $TRAIN_BATCH per worker, $THREADS torch thread(s) per worker," \
       "$TRAIN_STEPS steps ($WARMUP untimed), target loss $TARGET_LOSS over $LOSS_WINDOW steps, $REPEATS run(s) per" \
       "configuration, interleaved; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
else
  echo "# $MODEL ${IMAGE}x${IMAGE}, batch $BATCH per worker, $THREADS torch thread(s) per worker, $WARMUP warm-up batches," \
       "$ITERS x $BATCHES_PER_ITER timed batches per run, $REPEATS run(s) per configuration, interleaved; $(nproc) cores," \
       "load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
fi

PORT=29700
RUNS="$OUT_DIR/runs.txt"
: > "$RUNS"
# The worker's script and arguments for one run (SCRIPT) into WORKER_ARGV; its summary goes to $1.
worker_argv() {
  local result=$1 policy=$2 scheme=$3; shift 3
  if [[ $SCRIPT == tfprofile ]]; then
    WORKER_ARGV=("$HERE/examples/tensorflow/tensorflow_profile_benchmark.py" --api keras --profile "$PROFILE" \
      --compute-scale "$COMPUTE_SCALE" --steps $((ITERS * BATCHES_PER_ITER)) --warmup "$WARMUP" --policy "$policy" \
      "$@" --result "$result")
  elif [[ $SCRIPT == train ]]; then
    # The scheme goes to the optimizer only: COMMSCHED_COMPRESSION would also compress the loss all-reduces.
    WORKER_ARGV=("$HERE/examples/pytorch_train.py" --batch-size "$TRAIN_BATCH" --threads "$THREADS" --steps "$TRAIN_STEPS" \
      --warmup "$WARMUP" --policy "$policy" "$@" --compression "$scheme" --target-loss "$TARGET_LOSS" \
      --loss-window "$LOSS_WINDOW" --result "$result")
  else
    WORKER_ARGV=("$HERE/examples/pytorch_synthetic_benchmark.py" --model "$MODEL" --image-size "$IMAGE" --batch-size "$BATCH" \
      --threads "$THREADS" --num-warmup-batches "$WARMUP" --num-batches-per-iter "$BATCHES_PER_ITER" \
      --num-iters "$ITERS" --policy "$policy" "$@" --result "$result")
  fi
}

# run_once CONFIG REP: one fresh cluster; appends "CONFIG REP total_img_s STEPS_TO_LOSS TIME_TO_LOSS_S" ("-" where not
# measured or not reached; or "CONFIG REP FAILED") to $RUNS.
run_once() {
  local config=$1 rep=$2 policy=${1%%[+@]*} xi=() servers=() workers=() rc=0 src=0 scheme=none
  xi=(--no-cross-iteration); [[ ${config%%@*} == *+xi ]] && xi=(--cross-iteration)
  [[ $config == *@* ]] && scheme=${config#*@}
  PORT=$((PORT + 1))
  local result="$OUT_DIR/$config.$rep.json" log="$OUT_DIR/$config.$rep.log"
  local envs=(COMMSCHED_SECRET="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"  # beyond loopback: authenticate
              COMMSCHED_NUM_WORKERS="$WORKERS" COMMSCHED_NUM_SERVERS="$SERVERS" COMMSCHED_ROOT_ADDR="$ROOT"
              COMMSCHED_ROOT_PORT="$PORT" COMMSCHED_BACKEND=ps PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
              COMMSCHED_COMPRESSION="$([[ $SCRIPT == train ]] && echo none || echo "$scheme")"
              OMP_NUM_THREADS="$THREADS")
  for ((s = 0; s < SERVERS; ++s)); do
    ip netns exec "${HOSTS[s]}" env "${envs[@]}" COMMSCHED_ROLE=server COMMSCHED_RANK="$s" \
      COMMSCHED_BIND="${ADDRS[s]}" timeout "$RUN_TIMEOUT" "$BIN" server >>"$log" 2>&1 &
    servers+=($!)
  done
  worker_argv "$result" "$policy" "$scheme" "${xi[@]}"
  for ((w = 0; w < WORKERS; ++w)); do
    local i=$((SERVERS + w))
    ip netns exec "${HOSTS[i]}" env "${envs[@]}" COMMSCHED_ROLE=worker COMMSCHED_RANK="$w" \
      COMMSCHED_BIND="${ADDRS[i]}" timeout "$RUN_TIMEOUT" "$PYTHON" "${WORKER_ARGV[@]}" \
      >>"$log" 2>&1 &
    workers+=($!)
  done
  PIDS+=("${servers[@]}" "${workers[@]}")
  for p in "${workers[@]}"; do wait "$p" || rc=$?; done
  for p in "${servers[@]}"; do wait "$p" || src=$?; done
  # A server that fails only at teardown (after every worker finished its measurement) does not void the run; it is
  # reported beside the figure.
  if [[ $rc == 0 && -s $result ]]; then
    local total
    total=$("$PYTHON" -c '
import json, sys
r = json.load(open(sys.argv[1]))
def f(v): return "-" if v is None else str(v)
total = r.get("img_s_total", r.get("images_per_s"))
if total is None:  # tfprofile: steps/s x 1000
    total = round(1e6 / r["step_ms"], 1)
print(total, f(r.get("steps_to_loss")), f(r.get("time_to_loss_s")))' "$result")
    echo "$config $rep $total" >> "$RUNS"
    echo "  run $rep $config: $total (img/s total, steps to loss, time to loss s)"
    [[ $src == 0 ]] || { echo "  (a server exited $src at teardown; log $log:)"; grep -h "error" "$log" | tail -n 3; }
  else
    echo "$config $rep FAILED" >> "$RUNS"
    echo "  run $rep $config: FAILED (exit $rc); log $log:" >&2
    tail -n 5 "$log" >&2
  fi
}

for ((r = 0; r < REPEATS; ++r)); do
  for c in $CONFIGS; do run_once "$c" "$r"; done
done
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) at end"

PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$RUNS" "$SCRIPT" $CONFIGS <<'PY'
import sys
from commsched._C import mean_ci95 as stats  # (mean, 95% half-width): the one Student t table, base/stats.h
runs, script, configs = {}, sys.argv[2], sys.argv[3:]
to_loss = {}  # config -> rep -> (steps, seconds), where measured
for line in open(sys.argv[1]):
    config, rep, value, *loss = line.split()
    runs.setdefault(config, {})[int(rep)] = None if value == "FAILED" else float(value)
    if loss and loss[0] != "-":
        to_loss.setdefault(config, {})[int(rep)] = (int(loss[0]), float(loss[1]))
    elif loss:
        to_loss.setdefault(config, {})[int(rep)] = None
label = {"wfbp": "wfbp (baseline)", "bytescheduler": "bytescheduler",
         "bytescheduler+xi": "bytescheduler + cross-iteration"}
base = runs.get("wfbp", {})
print("\n| configuration | total img/s per run | mean img/s | 95% interval | ratio vs wfbp (of means) |"
      " paired ratio (mean, 95% interval) |")
print("|---|---|---:|---:|---:|---:|")
bm = stats([v for v in base.values() if v is not None])[0] if any(v is not None for v in base.values()) else None
for c in configs:
    r = runs.get(c, {})
    ok = [v for v in r.values() if v is not None]
    cells = ", ".join("FAILED" if r[k] is None else f"{r[k]:.1f}" for k in sorted(r))
    if not ok:
        print(f"| {label.get(c, c)} | {cells} | - | - | - | - |")
        continue
    m, ci = stats(ok)
    pairs = [r[k] / base[k] for k in r if r[k] is not None and base.get(k)]
    pm, pci = stats(pairs) if pairs else (float("nan"), float("nan"))
    ratio = f"{m / bm:.3f}" if bm else "-"
    paired = "1" if c == "wfbp" else f"{pm:.3f} ± {pci:.3f}"
    print(f"| {label.get(c, c)} | {cells} | {m:.1f} | ± {ci:.1f} | {ratio} | {paired} |")
if to_loss and script == "train":  # only the training script measures a loss
    print("\n| configuration | steps to loss per run | time to loss per run (s) |")
    print("|---|---|---|")
    for c in configs:
        r = to_loss.get(c, {})
        print(f"| {label.get(c, c)} | " + ", ".join("not reached" if r[k] is None else str(r[k][0]) for k in sorted(r)) +
              " | " + ", ".join("-" if r[k] is None else f"{r[k][1]:.1f}" for k in sorted(r)) + " |")
PY

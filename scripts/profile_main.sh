#!/usr/bin/env bash
# Main job, part 2: a torch model built from a model profile (examples/profile_model.py: the profile's real gradient
# tensors, compute emulated by sleeping) trained by a Horovod-style script (examples/pytorch_profile_benchmark.py:
# DistributedOptimizer with named_parameters only) through the real plugin, launcher and parameter server, so that the
# scheduler's gain shows on a machine with few cores. Three rows, each a fresh local cluster:
#   wfbp waiting in step()        the plain baseline (Horovod's behaviour)
#   wfbp + cross-iteration        the same order, with commsched's per-layer overlap of the next forward
#   bytescheduler (defaults)      what an unchanged script gets: priorities, automatic knobs, overlap
# and, beside the measured speedups, the simulator's prediction for the same cell (every worker simulated, links
# emulated as COMMSCHED_EMULATE_RATE paces them, the same automatic knobs): the simulator's WFBP overlaps the next
# forward per layer as commsched does, so it predicts the ratio to the second row.
#   PROFILE (resnet50), PROFILE_WORKERS (4), PROFILE_SERVERS (2), PROFILE_RATE (2gbit per process),
#   PROFILE_STEPS (8), PROFILE_WARMUP (3), PROFILE_COMPUTE_SCALE (1), TUNE=1 adds a fourth row, the scheduler auto-tuned live (short trials; slow for big
#   profiles), SKIP_BUILD=1 to use an existing build.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=$(realpath -m "${BUILD_DIR:-build}")
[ "${SKIP_BUILD:-0}" = 1 ] || ./scripts/build.sh
PROFILE=${PROFILE:-resnet50}
WORKERS=${PROFILE_WORKERS:-4}
SERVERS=${PROFILE_SERVERS:-2}
RATE=${PROFILE_RATE:-2gbit}
STEPS=${PROFILE_STEPS:-8}
WARMUP=${PROFILE_WARMUP:-3}
COMPUTE_SCALE=${PROFILE_COMPUTE_SCALE:-1}
export PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p out
run() {  # run <label> <benchmark args...>
  local label=$1; shift
  echo "== profile $PROFILE, $label: $WORKERS workers, $SERVERS server(s), emulated link ${RATE}"
  "$BUILD_DIR/plugins/commsched" launch -w "$WORKERS" -s "$SERVERS" --emulate-rate "$RATE" -- \
    /usr/bin/python3 examples/pytorch_profile_benchmark.py --profile "$PROFILE" --steps "$STEPS" --warmup "$WARMUP" \
    --compute-scale "$COMPUTE_SCALE" --result "out/profile_$label.json" "$@"
}
run wfbp --policy wfbp --no-cross-iteration
run wfbp_overlap --policy wfbp
run bytescheduler --policy bytescheduler
if [ "${TUNE:-0}" = 1 ]; then
  export COMMSCHED_TUNER_TRIALS=${COMMSCHED_TUNER_TRIALS:-8} COMMSCHED_TUNER_MIN_TRIALS=${COMMSCHED_TUNER_MIN_TRIALS:-6}
  export COMMSCHED_TUNER_WARMUP=${COMMSCHED_TUNER_WARMUP:-1} COMMSCHED_TUNER_WINDOW=${COMMSCHED_TUNER_WINDOW:-2}
  export COMMSCHED_TUNER_WINDOWS=${COMMSCHED_TUNER_WINDOWS:-1} COMMSCHED_TUNER_DRIFT=${COMMSCHED_TUNER_DRIFT:-0}
  run tuned --policy bytescheduler --tune
fi
"$BUILD_DIR/plugins/commsched" bench --models "$PROFILE" --bandwidths "$RATE" --workers "$WORKERS" \
  --servers "$SERVERS" --network ps --ps-workers each --emulated-links --policies bytescheduler,wfbp \
  --partitions 4MiB --credit-multipliers 4 --small-tensor 0 --out out/profile_sim >/dev/null
/usr/bin/python3 - "$PROFILE" "${TUNE:-0}" <<'PY'
import csv, json, sys
keys = ["wfbp", "wfbp_overlap", "bytescheduler"] + (["tuned"] if sys.argv[2] == "1" else [])
rows = {k: json.load(open(f"out/profile_{k}.json")) for k in keys}
sim = {r["policy"]: float(r["iteration_ms"]) for r in csv.DictReader(open("out/profile_sim/results.csv"))}
base = rows["wfbp"]["step_ms"]
print(f"\n{sys.argv[1]} profile ({rows['wfbp']['gradient_mib']:.1f} MiB of gradients, compute "
      f"{rows['wfbp']['compute_ms']:.1f} ms/step emulated), {rows['wfbp']['workers']} workers")
print(f"{'configuration':34} {'ms/step':>9} {'95% CI':>8} {'speedup':>8} {'simulated ms':>13}")
labels = (("wfbp, waiting in step()", "wfbp", None), ("wfbp + cross-iteration", "wfbp_overlap", "wfbp"),
          ("bytescheduler (defaults)", "bytescheduler", "bytescheduler-auto"))
if "tuned" in rows:
    labels += (("bytescheduler, tuned live", "tuned", None),)
for label, key, sim_key in labels:
    r = rows[key]
    predicted = f"{sim[sim_key]:13.1f}" if sim_key else f"{'-':>13}"
    print(f"{label:34} {r['step_ms']:9.1f} {r['step_ms_ci95']:8.1f} {base / r['step_ms']:7.2f}x {predicted}")
measured = rows["wfbp_overlap"]["step_ms"] / rows["bytescheduler"]["step_ms"]
predicted = sim["wfbp"] / sim["bytescheduler-auto"]
print(f"scheduler over wfbp + cross-iteration: measured {measured:.2f}x, simulator {predicted:.2f}x")
PY

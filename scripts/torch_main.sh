#!/usr/bin/env bash
# Main job on a real model: a local parameter-server cluster (commsched launch) trains examples/pytorch_train.py with
# the WFBP baseline (gradients in production order, step() waits for all) and with the scheduler (bytescheduler:
# priorities, partitions, credit; cross-iteration updates), and prints both and the speedup.
#   WORKERS (2), SERVERS (1), RATE (EMULATED link rate per process, default 1gbit; 0: unshaped loopback),
#   STEPS (40), SKIP_BUILD=1 to use an existing build. Extra arguments go to pytorch_train.py.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=$(realpath -m "${BUILD_DIR:-build}")
[ "${SKIP_BUILD:-0}" = 1 ] || ./scripts/build.sh
WORKERS=${WORKERS:-2}
SERVERS=${SERVERS:-1}
RATE=${RATE:-1gbit}
STEPS=${STEPS:-40}
export PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p out
run() {  # run <label> <train args...>
  local label=$1; shift
  echo "== $label: $WORKERS workers, $SERVERS server(s), emulated link ${RATE}"
  "$BUILD_DIR/plugins/commsched" launch -w "$WORKERS" -s "$SERVERS" --emulate-rate "$RATE" -- \
    /usr/bin/python3 examples/pytorch_train.py --steps "$STEPS" --check --result "out/torch_$label.json" "$@"
}
run wfbp --policy wfbp "$@"
run bytescheduler --policy bytescheduler --cross-iteration "$@"
/usr/bin/python3 - <<'PY'
import json
base, sched = (json.load(open(f"out/torch_{k}.json")) for k in ("wfbp", "bytescheduler"))
print(f"\n{'configuration':34} {'ms/step':>9} {'95% CI':>8} {'img/s':>8} {'loss':>15}")
for label, r in (("wfbp (baseline)", base), ("bytescheduler + cross-iteration", sched)):
    print(f"{label:34} {r['step_ms']:9.1f} {r['step_ms_ci95']:8.1f} {r['images_per_s']:8.1f} "
          f"{r['loss_first']:7.3f}->{r['loss_last']:.3f}")
print(f"speedup (img/s, bytescheduler / wfbp): {sched['images_per_s'] / base['images_per_s']:.2f}x")
PY

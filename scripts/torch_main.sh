#!/usr/bin/env bash
# Main job on a real model: a local parameter-server cluster (commsched launch) trains examples/pytorch_train.py with
# the WFBP baseline (gradients in production order, step() waits for all) and with the scheduler (bytescheduler:
# priorities, partitions, credit; cross-iteration updates) at its default knobs and auto-tuned live (the Bayesian tuner
# picks partition size and credit while training runs, rank 0 deciding for all), and prints all three and the speedups.
# The tuner's trials are short here (COMMSCHED_TUNER_* override them); its trial log goes to out/tuner_trials.csv.
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
run wfbp --policy wfbp --no-cross-iteration "$@"
run bytescheduler --policy bytescheduler --cross-iteration "$@"
export COMMSCHED_TUNER_TRIALS=${COMMSCHED_TUNER_TRIALS:-8} COMMSCHED_TUNER_MIN_TRIALS=${COMMSCHED_TUNER_MIN_TRIALS:-6}
export COMMSCHED_TUNER_WARMUP=${COMMSCHED_TUNER_WARMUP:-1} COMMSCHED_TUNER_WINDOW=${COMMSCHED_TUNER_WINDOW:-2}
export COMMSCHED_TUNER_WINDOWS=${COMMSCHED_TUNER_WINDOWS:-2} COMMSCHED_TUNER_CSV=${COMMSCHED_TUNER_CSV:-out/tuner_trials.csv}
# The steps timed after tuning must measure the kept knobs: no re-tuning on drift here (this machine's noise is
# larger than the 25% that would trigger it on a quiet cluster).
export COMMSCHED_TUNER_DRIFT=${COMMSCHED_TUNER_DRIFT:-0}
run tuned --policy bytescheduler --cross-iteration --tune "$@"
/usr/bin/python3 - <<'PY'
import json
base, sched, tuned = (json.load(open(f"out/torch_{k}.json")) for k in ("wfbp", "bytescheduler", "tuned"))
def size(b):
    return "unlimited" if b == 0 else "one batch in flight" if b == 1 else f"{b / 2**20:.2f} MiB"
print(f"\n{'configuration':40} {'ms/step':>9} {'95% CI':>8} {'img/s':>8} {'loss':>15}")
rows = (("wfbp (baseline)", base), ("bytescheduler + cross-iteration", sched),
        ("bytescheduler + cross-iteration, tuned", tuned))
for label, r in rows:
    print(f"{label:40} {r['step_ms']:9.1f} {r['step_ms_ci95']:8.1f} {r['images_per_s']:8.1f} "
          f"{r['loss_first']:7.3f}->{r['loss_last']:.3f}")
p, c = tuned["knobs"]["partition_bytes"], tuned["knobs"]["credit_bytes"]
print(f"auto-tuner: {tuned['tuner_trials']} trials in {tuned['tuning_steps']} steps, kept partition {size(p)}, "
      f"credit {size(c)}")
for label, r in rows[1:]:
    print(f"speedup over wfbp (img/s), {label}: {r['images_per_s'] / base['images_per_s']:.2f}x")
PY
echo
echo "== part 2: a model profile's tensors with emulated compute (scripts/profile_main.sh)"
SKIP_BUILD=1 BUILD_DIR="$BUILD_DIR" ./scripts/profile_main.sh

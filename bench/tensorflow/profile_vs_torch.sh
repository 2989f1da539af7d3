#!/usr/bin/env bash
# The scheduler's gain over WFBP on TensorFlow beside the same gain on PyTorch, one flag apart: a model profile's
# tensors with emulated compute (examples/tensorflow/tensorflow_profile_benchmark.py and
# examples/pytorch_profile_benchmark.py), each row a fresh local cluster on an emulated link:
#   tensorflow wfbp (waiting in apply()), tensorflow bytescheduler (defaults: cross-iteration), torch wfbp (waiting in
#   step()), torch bytescheduler (defaults: cross-iteration); TF_API=tape runs the TensorFlow rows with
#   DistributedGradientTape instead of commsched.keras's DistributedOptimizer (no cross-iteration there)
# then each framework's speedup and the ratio of the TensorFlow gain to the torch gain ((speedup - 1) over
# (speedup - 1)).
#   PROFILE (resnet50), COMPUTE_SCALE (1), WORKERS (4), SERVERS (2), RATE (2gbit), STEPS (6), WARMUP (2), TF_API
#   (keras), PYTHON (the test venv's, which
#   has tensorflow and torch), BUILD_DIR (build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=$(realpath -m "${BUILD_DIR:-build}")
PYTHON=${PYTHON:-$HOME/.cache/commsched/test-venv/bin/python}
PROFILE=${PROFILE:-resnet50}
WORKERS=${WORKERS:-4}
SERVERS=${SERVERS:-2}
RATE=${RATE:-2gbit}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
TF_API=${TF_API:-keras}
COMPUTE_SCALE=${COMPUTE_SCALE:-1}
OUT=${OUT:-out/tf_profile}
export PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT"
run() {  # run <label> <script> <args...>
  local label=$1 script=$2; shift 2
  echo "== $label: $PROFILE, $WORKERS workers, $SERVERS server(s), emulated link $RATE"
  "$BUILD_DIR/plugins/commsched" launch -w "$WORKERS" -s "$SERVERS" --emulate-rate "$RATE" -- \
    "$PYTHON" "$script" --profile "$PROFILE" --steps "$STEPS" --warmup "$WARMUP" --compute-scale "$COMPUTE_SCALE" --result "$OUT/$label.json" "$@" \
    2>&1 | grep -E "ms/step|Error|error" | grep -v oneDNN || true
}
TF_WAIT=(); [ "$TF_API" = keras ] && TF_WAIT=(--no-cross-iteration)
run tf_wfbp examples/tensorflow/tensorflow_profile_benchmark.py --api "$TF_API" --policy wfbp "${TF_WAIT[@]}"
run tf_bytescheduler examples/tensorflow/tensorflow_profile_benchmark.py --api "$TF_API" --policy bytescheduler
run torch_wfbp examples/pytorch_profile_benchmark.py --policy wfbp --no-cross-iteration
run torch_bytescheduler examples/pytorch_profile_benchmark.py --policy bytescheduler
"$PYTHON" - "$OUT" <<'PY'
import json, sys
r = {k: json.load(open(f"{sys.argv[1]}/{k}.json")) for k in ("tf_wfbp", "tf_bytescheduler", "torch_wfbp",
                                                             "torch_bytescheduler")}
def row(k):
    return f"{r[k]['step_ms']:.1f} +- {r[k]['step_ms_ci95']:.1f}"
tf_speedup = r["tf_wfbp"]["step_ms"] / r["tf_bytescheduler"]["step_ms"]
torch_speedup = r["torch_wfbp"]["step_ms"] / r["torch_bytescheduler"]["step_ms"]
print(f"| framework | wfbp ms/step | bytescheduler ms/step | speedup |")
print(f"| tensorflow | {row('tf_wfbp')} | {row('tf_bytescheduler')} | {tf_speedup:.3f} |")
print(f"| torch | {row('torch_wfbp')} | {row('torch_bytescheduler')} | {torch_speedup:.3f} |")
if torch_speedup > 1 and tf_speedup > 0:
    print(f"TensorFlow's gain over WFBP as a fraction of torch's: {(tf_speedup - 1) / (torch_speedup - 1):.2f}")
else:
    print("no fraction: torch shows no gain over WFBP in this run")
PY

#!/usr/bin/env bash
# Compiled training with the scheduler: bench/torch/compile_bench.py (a model profile's tensors, compute emulated by
# sleeping inside custom ops so torch.compile compiles the whole model) under `commsched launch` with W workers, S
# servers and an EMULATED link rate, in four configurations run interleaved (REPEATS rounds, so drift on a shared
# machine hits all alike): eager and compiled, each with WFBP waiting in step() and with the scheduler at its defaults
# (cross-iteration on). Prints each configuration's mean ms/step and the scheduler's gain over WFBP, eager and
# compiled, and which share of the eager gain compiled training keeps.
#
#   bench/torch/compile_bench.sh [BUILD_DIR] [RATE] [REPEATS]          e.g. bench/torch/compile_bench.sh build 2gbit 3
#
# Environment: PYTHON (a python with torch >= 2.4 for the compiled rows; default /usr/bin/python3), WORKERS (4),
# SERVERS (2), PROFILE (resnet50), COMPUTE_SCALE (8: multiplies the profiled compute, so that it is comparable to
# the communication at 2 Gbit/s, as in bench/RESULTS.md's profile runs), STEPS (10), WARMUP (3; the first compiled
# step compiles), RUN_TIMEOUT (600 s).
set -euo pipefail

BUILD=$(realpath -m "${1:-build}")
RATE=${2:-2gbit}
REPEATS=${3:-3}
PYTHON=${PYTHON:-/usr/bin/python3}
WORKERS=${WORKERS:-4}
SERVERS=${SERVERS:-2}
PROFILE=${PROFILE:-resnet50}
COMPUTE_SCALE=${COMPUTE_SCALE:-8}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
BIN="$BUILD/plugins/commsched"
[[ -x "$BIN" ]] || { echo "compile_bench: $BIN not found (build the commsched target)" >&2; exit 2; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

declare -A ARGS=(
  [eager-wfbp]="--policy wfbp --no-cross-iteration"
  [eager-sched]=""
  [compiled-wfbp]="--compile --policy wfbp --no-cross-iteration"
  [compiled-sched]="--compile"
)
CONFIGS=(eager-wfbp eager-sched compiled-wfbp compiled-sched)
if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if hasattr(torch.library, "custom_op") else 1)'; then
  echo "compile_bench: $("$PYTHON" -c 'import torch; print(torch.__version__)') has no torch.library.custom_op" \
       "(torch >= 2.4): set PYTHON to a newer torch" >&2
  exit 2
fi

for round in $(seq "$REPEATS"); do
  for c in "${CONFIGS[@]}"; do
    # shellcheck disable=SC2086  # ARGS holds several words
    PYTHONPATH="$BUILD/python" timeout "$RUN_TIMEOUT" "$BIN" launch -w "$WORKERS" -s "$SERVERS" --emulate-rate "$RATE" \
      -- "$PYTHON" "$HERE/bench/torch/compile_bench.py" --profile "$PROFILE" --compute-scale "$COMPUTE_SCALE" --steps "$STEPS" --warmup "$WARMUP" \
      ${ARGS[$c]} --result "$OUT/$c.$round.json" >"$OUT/$c.$round.log" 2>&1 ||
      { echo "compile_bench: $c (round $round) failed:" >&2; tail -20 "$OUT/$c.$round.log" >&2; exit 1; }
    echo "round $round $c: $("$PYTHON" -c 'import json, sys; print("%.1f ms/step" % json.load(open(sys.argv[1]))["step_ms"])' "$OUT/$c.$round.json")"
  done
done

"$PYTHON" - "$OUT" "$REPEATS" "${CONFIGS[@]}" <<'EOF'
import json, sys
out, repeats, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ms = {c: [json.load(open(f"{out}/{c}.{r}.json"))["step_ms"] for r in range(1, repeats + 1)] for c in configs}
mean = {c: sum(v) / len(v) for c, v in ms.items()}
first = json.load(open(f"{out}/{configs[0]}.1.json"))
print(f"\n{first['profile']} (compute x{first['compute_scale']}), {first['workers']} workers, torch {first['torch']}, "
      f"{repeats} rounds")
for c in configs:
    print(f"  {c:15s} {mean[c]:8.1f} ms/step   ({', '.join(f'{x:.1f}' for x in ms[c])})")
eager, comp = mean["eager-wfbp"] / mean["eager-sched"], mean["compiled-wfbp"] / mean["compiled-sched"]
print(f"  scheduler gain over WFBP: eager {eager:.3f}x, compiled {comp:.3f}x; "
      f"compiled keeps {(comp - 1) / (eager - 1) if eager != 1 else float('nan'):.2f} of the eager gain")
EOF

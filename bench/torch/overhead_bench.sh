#!/usr/bin/env bash
# The plugin's per-step overhead on torch 1.13 (Debian's, /usr/bin/python3) beside a torch 2.x (the test venv's), run
# alternately ROUNDS times (bench/torch/overhead_bench.py: one process, plain optimizer vs DistributedOptimizer,
# interleaved step by step). Prints each round's overhead and the median over rounds, and the ratio 2.x / 1.13.
#   bench/torch/overhead_bench.sh [BUILD_DIR]     ROUNDS (3), STEPS (200), LAYERS (80), PYTHON_OLD, PYTHON_NEW,
#                                                 EXTRA (e.g. --no-cross-iteration)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=$(realpath -m "${1:-build}")
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-200}
LAYERS=${LAYERS:-80}
PYTHON_OLD=${PYTHON_OLD:-/usr/bin/python3}
PYTHON_NEW=${PYTHON_NEW:-$HOME/.cache/commsched/test-venv/bin/python}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for r in $(seq "$ROUNDS"); do
  for side in old new; do
    py=$PYTHON_OLD
    [[ $side == new ]] && py=$PYTHON_NEW
    # shellcheck disable=SC2086  # EXTRA holds flags
    PYTHONPATH="$BUILD/python" "$py" bench/torch/overhead_bench.py --steps "$STEPS" --layers "$LAYERS" \
      --result "$OUT/$side.$r.json" ${EXTRA:-} | tail -1
  done
done
/usr/bin/python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
med, cpu = {}, {}
for side in ("old", "new"):
    runs = [json.load(open(f"{out}/{side}.{r}.json")) for r in range(1, rounds + 1)]
    med[side] = statistics.median(r["overhead_us"] for r in runs)
    cpu[side] = statistics.median(r["overhead_cpu_us"] for r in runs)
    print(f"torch {runs[0]['torch']}: overhead median {med[side]:.0f} us/step over {rounds} rounds "
          f"({med[side] / runs[0]['tensors']:.2f} us/tensor; each round: "
          f"{', '.join('%.0f' % r['overhead_us'] for r in runs)}); CPU time {cpu[side]:.0f} us/step "
          f"({cpu[side] / runs[0]['tensors']:.2f} us/tensor)")
print(f"overhead on torch 2.x / on 1.13: {med['new'] / med['old']:.2f} (CPU time: {cpu['new'] / cpu['old']:.2f})")
PY

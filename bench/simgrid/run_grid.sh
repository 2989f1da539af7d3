#!/usr/bin/env bash
# The simulator grid of issue 26 (item 3), judged by the every-worker model: the five profiles x 1/10/25/100 Gbit/s x
# the worker counts given, on the parameter server (every worker simulated) and on the ring. One `commsched-sim
# bench` per (network, workers), each into its own folder, so an interrupted grid keeps what it finished and a rerun
# skips it; then summarize.py judges every cell.
#
#   bench/simgrid/run_grid.sh BUILD_DIR OUT_DIR [WORKERS...]      (default: 8 16 32 64 128 256)
#
# The targets judge the scheduler at its automatic knobs against the baselines and the bound, so by default the
# scheduler's searched row runs one knob setting (its automatic row is always there); FULL_GRID=1 searches the
# whole default knob grid as well (about ten times the CPU). NETWORKS="ps ring" by default. PER_MODEL=1: one run per
# model too (folders <network>-w<workers>-<model>), so that a large worker count keeps every model it finished.
# EXTRA_ARGS: more flags for every run (e.g. "--ps-reply-bound 0": the servers' replies in arrival order).
# Runs under nice.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR OUT_DIR [WORKERS...]" >&2
  exit 2
fi
build=$1
out=$2
shift 2
workers=("$@")
[ ${#workers[@]} -gt 0 ] || workers=(8 16 32 64 128 256)
sim="$build/simulator/commsched-sim"
[ -x "$sim" ] || { echo "$0: no simulator at $sim (build the target commsched_sim_bench)" >&2; exit 2; }
knobs=(--partitions 256KiB --credit-multipliers 4 --small-tensor 64KiB)
[ "${FULL_GRID:-0}" = 1 ] && knobs=()
models=(resnet50,transformer-base,bert-base,vgg16,bert-large)  # one run; PER_MODEL=1: cheapest first
[ "${PER_MODEL:-0}" = 1 ] && models=(resnet50 transformer-base bert-base vgg16 bert-large)
mkdir -p "$out"
for w in "${workers[@]}"; do
  for net in ${NETWORKS:-ps ring}; do
    for m in "${models[@]}"; do
      name="$net-w$w"
      [ "${PER_MODEL:-0}" = 1 ] && name="$name-$m"
      dir="$out/$name"
      if [ -f "$dir/results.csv" ]; then
        echo "$dir: done before, skipped"
        continue
      fi
      TIMEFORMAT="%R s wall, %U s user, %S s system"
      { time nice -n 10 "$sim" bench --models "$m" --bandwidths 1Gbit,10Gbit,25Gbit,100Gbit --workers "$w" \
          --network "$net" --ps-workers each "${knobs[@]}" ${EXTRA_ARGS:-} --out "$dir.partial" >"$out/$name.log" 2>&1; } \
        2>"$out/$name.time"
      mv "$dir.partial" "$dir"
      echo "$dir: $(cat "$out/$name.time")"
    done
  done
done
python3 "$(dirname "$0")/summarize.py" "$out"

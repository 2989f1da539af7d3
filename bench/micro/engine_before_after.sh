#!/usr/bin/env bash
# Engine overhead per partition, side by side in one run: the engine at git ref $1 (default 8f219e9, the last
# engine without the flow-graph stage chain) and the engine of this tree, both built from their own sources with
# the same bench/micro/engine_micro_bench.cc, run interleaved $ROUNDS times pinned to one core (taskset -c $CPU).
# Prints, per benchmark, the median over rounds of each run's median ns per partition (wall and CPU), for both, and the ratios.
#   bench/micro/engine_before_after.sh [ref]        (ROUNDS=5 CPU=0 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
REF=${1:-8f219e9}
ROUNDS=${ROUNDS:-5}
CPU=${CPU:-0}
OLD=${OLD_DIR:-/tmp/commsched-engine-$REF}
BENCH_SRC=bench/micro/engine_micro_bench.cc
if [[ ! -x $OLD/build/bench/micro/engine_micro_bench ]] || ! cmp -s "$BENCH_SRC" "$OLD/$BENCH_SRC"; then
  rm -rf "$OLD" && mkdir -p "$OLD"
  git archive "$REF" | tar -x -C "$OLD"
  cp "$BENCH_SRC" "$OLD/$BENCH_SRC"  # the same benchmark for both engines (the Engine API it uses is unchanged)
  cmake -S "$OLD" -B "$OLD/build" -G Ninja -DCOMMSCHED_BUILD_TESTS=OFF \
    -DCOMMSCHED_BUILD_PYTHON=OFF >/dev/null
  cmake --build "$OLD/build" --target engine_micro_bench >/dev/null
fi
cmake --build "${BUILD_DIR:-build}" --target engine_micro_bench >/dev/null
NEW=${BUILD_DIR:-build}/bench/micro/engine_micro_bench
out=$(mktemp -d)
for r in $(seq "$ROUNDS"); do
  for side in old new; do
    bin=$NEW
    [[ $side == old ]] && bin=$OLD/build/bench/micro/engine_micro_bench
    taskset -c "$CPU" "$bin" --benchmark_filter=BM_EnginePerPartition \
      --benchmark_format=json --benchmark_out="$out/$side.$r.json" >/dev/null
  done
done
/usr/bin/python3 - "$out" "$ROUNDS" "$REF" <<'PY'
import json, statistics, sys
out, rounds, ref = sys.argv[1], int(sys.argv[2]), sys.argv[3]
res = {}
for side in ("old", "new"):
    for r in range(1, rounds + 1):
        for b in json.load(open(f"{out}/{side}.{r}.json"))["benchmarks"]:
            if b.get("aggregate_name") == "median":  # each run: the median of the benchmark's own repetitions
                r_ = res.setdefault(b["run_name"], {})
                r_.setdefault(side, []).append(b["ns_per_partition"] * 1e9)
                r_.setdefault(side + "_cpu", []).append(b["cpu_ns_per_partition"])
print(f"engine cost per partition (ns), median of {rounds} interleaved runs, one core; old = {ref}, new = this tree")
print("real = wall time; cpu = CPU time of all the process's threads (what other load on the core does not inflate)")
print(f"{'benchmark':58s} {'old real':>8s} {'new real':>8s} {'new/old':>7s} {'old cpu':>8s} {'new cpu':>8s} {'new/old':>7s}")
for name, v in res.items():
    o, n = statistics.median(v["old"]), statistics.median(v["new"])
    oc, nc = statistics.median(v["old_cpu"]), statistics.median(v["new_cpu"])
    print(f"{name:58s} {o:8.0f} {n:8.0f} {n / o:7.2f} {oc:8.0f} {nc:8.0f} {nc / oc:7.2f}")
PY

#!/usr/bin/env python3
"""Judges the simulator grid that run_grid.sh wrote: per cell (network, model, link rate, workers) the scheduler at its
automatic knobs (the `bytescheduler-auto` row) against the best baseline (speed ratio, target >= 0.98) and against the
lower bounds (time ratio, target <= 1.10 in >= 95% of cells), then the shares, how many cells no schedule can bring
within 1.10x of the simple bound (their dependency bound, which every schedule pays, is already above it), and every
row of any policy that came in below its bound (the bound must hold for all: simulator.h, dependency_bound_s).

    python3 bench/simgrid/summarize.py [--searched] OUT_DIR   (reads OUT_DIR/<network>-w<workers>/results.csv)

--searched judges the scheduler's searched row instead (the best of the knob grid, or with `commsched-sim bench
--tune N` the knobs the Bayesian optimiser found in N trials: what the live tuner can reach).
"""
import csv
import pathlib
import sys

SCHEDULER = "bytescheduler"
AUTO = SCHEDULER + "-auto"


def cells(out_dir):
    """{(network, model, gbps, workers): {policy: row}} over every results.csv under out_dir."""
    found = {}
    for path in sorted(pathlib.Path(out_dir).glob("*-w*/results.csv")):
        network = path.parent.name.split("-w")[0]
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                key = (network, row["model"], float(row["bandwidth_gbps"]), int(row["workers"]))
                found.setdefault(key, {})[row["policy"]] = row
    return found


def judge(rows, judged_row=AUTO):
    """(auto ms, best baseline, its ms, auto vs best baseline speed, vs simple bound, vs dependency bound) or None."""
    auto = rows.get(judged_row)
    baselines = [r for p, r in rows.items() if not p.startswith(SCHEDULER)]
    if auto is None or not baselines:
        return None
    best = min(baselines, key=lambda r: float(r["iteration_ms"]))
    t = float(auto["iteration_ms"])
    return (t, best["policy"], float(best["iteration_ms"]), float(best["iteration_ms"]) / t,
            t / float(auto["lower_bound_ms"]), t / float(auto["dependency_bound_ms"]))


def below_bound(found):
    """Every row (any policy, any knobs) that came in below its cell's dependency bound, and how many rows there are.
    The CSV gives milliseconds to 3 decimals, so a row equal to the bound may read up to 0.001 ms below it."""
    rows = [(key, r) for key, cell in found.items() for r in cell.values()]
    below = [(key, r["policy"]) for key, r in rows
             if float(r["iteration_ms"]) < float(r["dependency_bound_ms"]) - 0.0011]
    return below, len(rows)


def main():
    args = sys.argv[1:]
    judged_row = SCHEDULER if args[:1] == ["--searched"] else AUTO
    args = args[1:] if judged_row == SCHEDULER else args
    if len(args) != 1:
        sys.exit(__doc__)
    found = cells(args[0])
    if not found:
        sys.exit(f"summarize.py: no */results.csv under {args[0]}")
    name = "searched" if judged_row == SCHEDULER else "auto"
    print(f"| network | model | Gbit/s | workers | {name} ms | best baseline ms | {name} speed / baseline |"
          f" {name} / bound | {name} / dependency bound |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    judged = []
    for key in sorted(found):
        j = judge(found[key], judged_row)
        if j is None:
            continue
        judged.append((key, j))
        network, model, gbps, workers = key
        t, base, base_ms, vs_base, vs_bound, vs_dep = j
        flag = lambda ok: "" if ok else " **x**"
        print(f"| {network} | {model} | {gbps:g} | {workers} | {t:.1f} | {base} {base_ms:.1f} |"
              f" {vs_base:.3f}{flag(vs_base >= 0.98)} | {vs_bound:.3f}{flag(vs_bound <= 1.10)} |"
              f" {vs_dep:.3f}{flag(vs_dep <= 1.10)} |")
    for network in sorted({k[0] for k, _ in judged}) + [None]:
        part = [j for k, j in judged if network is None or k[0] == network]
        n = len(part)
        base_ok = sum(j[3] >= 0.98 for j in part)
        bound_ok = sum(j[4] <= 1.10 for j in part)
        dep_ok = sum(j[5] <= 1.10 for j in part)
        # auto / bound = (auto / dependency bound) x (dependency bound / bound), and auto / dependency bound >= 1.
        unreachable = sum(j[4] / j[5] > 1.10 for j in part)
        print(f"\n{network or 'all'}: {n} cells; {name} >= 0.98x best baseline in {base_ok} ({100 * base_ok / n:.0f}%);"
              f" <= 1.10x the bound in {bound_ok} ({100 * bound_ok / n:.0f}%),"
              f" the dependency bound in {dep_ok} ({100 * dep_ok / n:.0f}%);"
              f" {unreachable} cells no schedule can bring within 1.10x the bound"
              f" (at most {100 * (n - unreachable) / n:.0f}% can)")
    below, rows = below_bound(found)
    print(f"\nrows below their dependency bound (any policy): {len(below)} of {rows}"
          + "".join(f"\n  {key} {policy}" for key, policy in below))


if __name__ == "__main__":
    main()

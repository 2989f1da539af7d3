#!/usr/bin/env python3
"""Two (or more) builds of collective_bench side by side: runs them alternately, RUNS times each, so load drift hits
every build alike, and prints per case the median and range of the ratio to plain Gloo, the median us/step of both
sides, rank 0's voluntary context switches and CPU time per step (each switch is a thread wake-up on the critical
path; both vary less with load than wall time does) and the 90th percentile of rank 0's single steps (waits for a
core show there first).

    bench/collective/compare_builds.py OLD/collective_bench NEW/collective_bench [--runs 5] [--fifo] [-- BENCH ARGS...]

A build can be a wrapper script that sets environment variables (COMMSCHED_COLLECTIVE_SPIN=0, say) and execs one.
Bench arguments default to --ranks 2 --iters 30 --blocks 5 (the issue's command); --breakdown is always added.

--fifo runs every build under `chrt -f 1` (real-time FIFO priority 1; root or CAP_SYS_NICE): its threads then take a
core from any ordinary process the moment they wake, so on a machine busy with other work (builds) both sides are
timed about as on an idle one, without the up-to-a-tick (4 ms at HZ=250) waits behind other processes that swamp the
ratio there. It is not an idle machine: no core is ever idle, so waking a thread never waits for a sleeping core, and
among equal real-time threads nothing preempts (a thread that spins without yielding would hold its core). Label such
numbers as taken with --fifo.
"""
import argparse
import collections
import os
import re
import statistics
import subprocess
import sys

RATIO = re.compile(r"\| (\S+) \| \d+ \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|")
# Rank 0's phase row: csw plain and backend, then (builds from issue 26 on) CPU us plain and backend and the single
# steps' p50 / p90, plain and backend.
PHASES = re.compile(r"\| 0 \| (\S+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| ([\d.]+) \| ([\d.]+) \|"
                    r"(?: ([\d.]+) \| ([\d.]+) \| [\d.]+ / ([\d.]+) \| [\d.]+ / ([\d.]+) \|)?")
NAN = float("nan")


def run_once(binary, bench_args, fifo):
    """{case: (ratio, plain us, backend us, csw plain, csw backend, cpu plain, cpu backend, p90 plain, p90 backend)}
    from one run."""
    command = (["chrt", "-f", "1"] if fifo else []) + [binary] + bench_args
    out = subprocess.run(command, capture_output=True, text=True, timeout=900, check=True).stdout
    rows, use = {}, {}
    for line in out.splitlines():
        if m := RATIO.match(line):
            rows[m.group(1)] = (float(m.group(4)), float(m.group(2)), float(m.group(3)))
        elif m := PHASES.match(line):
            use[m.group(1)] = tuple(float(g) if g else NAN for g in m.groups()[1:])
    return {case: row + use.get(case, (NAN,) * 6) for case, row in rows.items()}


def main():
    argv = sys.argv[1:]
    bench_args = ["--ranks", "2", "--iters", "30", "--blocks", "5"]
    if "--" in argv:
        bench_args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("builds", nargs="+", help="collective_bench executables (or wrappers) to compare")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--fifo", action="store_true", help="run every build under chrt -f 1 (see above)")
    a = p.parse_args(argv)
    results = collections.defaultdict(lambda: collections.defaultdict(list))
    for i in range(a.runs):
        for b in a.builds:
            for case, row in run_once(b, bench_args + ["--breakdown"], a.fifo).items():
                results[b][case].append(row)
        print(f"run {i + 1}/{a.runs} done, load average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    med = statistics.median
    for b in a.builds:
        fifo = " (under chrt -f 1)" if a.fifo else ""
        print(f"\n{b}: {a.runs} runs of collective_bench {' '.join(bench_args)}{fifo}\n")
        print("| case | ratio median [min-max] | plain Gloo us/step | GlooBackend us/step | rank 0 csw/step plain | backend "
              "| rank 0 CPU us/step plain | backend | rank 0 step p90 us plain | backend |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for case, rows in results[b].items():
            col = list(zip(*rows))
            print(f"| {case} | {med(col[0]):.2f} [{min(col[0]):.2f}-{max(col[0]):.2f}] | "
                  + " | ".join(f"{med(c):.1f}" for c in col[1:]) + " |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Two (or more) builds of collective_bench side by side: runs them alternately, RUNS times each, so load drift hits
every build alike, and prints per case the median and range of the ratio to plain Gloo, the median us/step of both
sides, and rank 0's voluntary context switches per step (each is a thread wake-up on the critical path; they vary
less with load than wall time does).

    bench/collective/compare_builds.py OLD/collective_bench NEW/collective_bench [--runs 5] [-- BENCH ARGS...]

A build can be a wrapper script that sets environment variables (COMMSCHED_COLLECTIVE_SPIN=0, say) and execs one.
Bench arguments default to --ranks 2 --iters 30 --blocks 5 (the issue's command); --breakdown is always added.
"""
import argparse
import collections
import os
import re
import statistics
import subprocess
import sys

RATIO = re.compile(r"\| (\S+) \| \d+ \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|")
PHASES = re.compile(r"\| 0 \| (\S+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| ([\d.]+) \| ([\d.]+) \|")


def run_once(binary, bench_args):
    """{case: (ratio, plain us, backend us, csw plain, csw backend)} from one run of the bench."""
    out = subprocess.run([binary] + bench_args, capture_output=True, text=True, timeout=900, check=True).stdout
    rows, csw = {}, {}
    for line in out.splitlines():
        if m := RATIO.match(line):
            rows[m.group(1)] = (float(m.group(4)), float(m.group(2)), float(m.group(3)))
        elif m := PHASES.match(line):
            csw[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return {case: row + csw.get(case, (float("nan"), float("nan"))) for case, row in rows.items()}


def main():
    argv = sys.argv[1:]
    bench_args = ["--ranks", "2", "--iters", "30", "--blocks", "5"]
    if "--" in argv:
        bench_args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("builds", nargs="+", help="collective_bench executables (or wrappers) to compare")
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args(argv)
    results = collections.defaultdict(lambda: collections.defaultdict(list))
    for i in range(a.runs):
        for b in a.builds:
            for case, row in run_once(b, bench_args + ["--breakdown"]).items():
                results[b][case].append(row)
        print(f"run {i + 1}/{a.runs} done, load average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    med = statistics.median
    for b in a.builds:
        print(f"\n{b}: {a.runs} runs of collective_bench {' '.join(bench_args)}\n")
        print("| case | ratio median [min-max] | plain Gloo us/step | GlooBackend us/step | rank 0 csw/step plain | backend |")
        print("|---|---:|---:|---:|---:|---:|")
        for case, rows in results[b].items():
            col = list(zip(*rows))
            print(f"| {case} | {med(col[0]):.2f} [{min(col[0]):.2f}-{max(col[0]):.2f}] | {med(col[1]):.1f} | "
                  f"{med(col[2]):.1f} | {med(col[3]):.1f} | {med(col[4]):.1f} |")


if __name__ == "__main__":
    main()

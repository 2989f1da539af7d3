#!/usr/bin/env python3
"""Real multi-process runs of the model profiles over the parameter server, set beside the simulator's prediction.

Each cell (model x bandwidth x workers x policy) is run --trials times with `commsched run --backend ps`: W worker and
S server processes on this machine, compute emulated by sleeping per layer (plugins/api/synthetic_model), links
EMULATED by the transport's token bucket on every process's sends (COMMSCHED_EMULATE_RATE). The mean of the trial means
and its 95% interval (Student t) are reported next to `commsched bench --mode sim` for the same cell and knobs, with the
relative error of the simulation.

The emulation limits what each process sends, not what a server receives, so runs use S = W servers by default: then no
server receives more than one worker sends and the simulator's server-ingress limit never binds (see bench/sim/README.md).

Usage:
  bench/cluster/run_cluster.py --commsched build/plugins/commsched --models resnet50 --bandwidths 1gbit \\
      --workers 2 --policies wfbp,bytescheduler --trials 3 --out cluster-results
"""
import argparse
import csv
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROW = re.compile(r"^\s*(\S+)\s+iteration\s+([\d.]+) ms\s+±\s+([\d.]+) ms .*data (\S+)")
# two-sided 95% Student t quantiles for 1..10 degrees of freedom
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


def ci95(values):
    if len(values) < 2:
        return float("nan")
    t = T95[min(len(values) - 1, len(T95)) - 1]
    return t * statistics.stdev(values) / math.sqrt(len(values))


def run_trial(args, model, bw, workers, servers, policy):
    cmd = [args.commsched, "run", "--backend", "ps", "--model", model, "--policies", policy, "-w", str(workers),
           "-s", str(servers), "--bandwidth", bw, "--iterations", str(args.iterations), "--warmup", str(args.warmup),
           "--compute-scale", str(args.compute_scale), "--partition", args.partition, "--credit", args.credit,
           "--small-tensor", args.small_tensor, "--timeline-dir", ""]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    for line in out.stdout.splitlines():
        m = ROW.match(line)
        if m and m.group(1) == policy:
            if m.group(4) != "exact":
                raise RuntimeError(f"{policy}: reduced data wrong in {' '.join(cmd)}")
            return float(m.group(2))
    raise RuntimeError(f"no result row for {policy} in:\n{out.stdout}")


def simulate(args, model, bw, workers, servers, policy):
    with tempfile.TemporaryDirectory() as tmp:
        part = parse_size(args.partition)
        cmd = [args.sim, "bench", "--mode", "sim", "--models", model, "--bandwidths", bw, "--workers", str(workers),
               "--servers", str(servers), "--network", "ps", "--latency", args.latency, "--policies", policy,
               "--partitions", args.partition, "--credit-multipliers", str(parse_size(args.credit) / part),
               "--small-tensor", args.small_tensor, "--iterations", "6", "--warmup", "1", "--out", tmp]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        with open(os.path.join(tmp, "results.csv")) as f:
            row = next(csv.DictReader(f))
        return float(row["iteration_ms"])


def parse_size(s):
    m = re.fullmatch(r"([\d.]+)\s*(|k|kib|kb|m|mib|mb|g|gib|gb)", s.strip().lower())
    if not m:
        sys.exit(f"run_cluster: cannot parse size '{s}'")
    mult = {"": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1 << 20, "mib": 1 << 20, "mb": 10 ** 6,
            "g": 1 << 30, "gib": 1 << 30, "gb": 10 ** 9}[m.group(2)]
    return float(m.group(1)) * mult


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commsched", required=True, help="the commsched executable (with `run --backend ps`)")
    ap.add_argument("--sim", help="executable with the `bench` subcommand (default: --commsched)")
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--bandwidths", default="1gbit")
    ap.add_argument("--workers", default="2")
    ap.add_argument("--servers", type=int, default=0, help="0: as many as workers")
    ap.add_argument("--policies", default="wfbp,bytescheduler")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compute-scale", type=float, default=1.0)
    ap.add_argument("--partition", default="1MiB")
    ap.add_argument("--credit", default="4MiB")
    ap.add_argument("--small-tensor", default="64KiB")
    ap.add_argument("--latency", default="50us", help="latency the simulator assumes per message")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per trial")
    ap.add_argument("--out", default="cluster-results")
    args = ap.parse_args()
    args.sim = args.sim or args.commsched
    if args.compute_scale != 1.0:
        sys.exit("run_cluster: the simulator has no compute scale; write a scaled profile instead")
    os.makedirs(args.out, exist_ok=True)

    rows = []
    for model in args.models.split(","):
        for bw in args.bandwidths.split(","):
            for w in map(int, args.workers.split(",")):
                s = args.servers or w
                for policy in args.policies.split(","):
                    trials = [run_trial(args, model, bw, w, s, policy) for _ in range(args.trials)]
                    predicted = simulate(args, model, bw, w, s, policy)
                    mean = statistics.mean(trials)
                    rows.append({"model": model, "bandwidth": bw, "workers": w, "servers": s, "policy": policy,
                                 "cluster_ms": round(mean, 2), "ci95_ms": round(ci95(trials), 2),
                                 "sim_ms": round(predicted, 2), "sim_error": round(predicted / mean - 1, 4),
                                 "trials_ms": " ".join(f"{t:.1f}" for t in trials)})
                    print(rows[-1], flush=True)

    with open(os.path.join(args.out, "cluster.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    with open(os.path.join(args.out, "cluster.md"), "w") as f:
        f.write("| model | bandwidth | workers | servers | policy | cluster ms (95% CI) | sim ms | sim error |\n")
        f.write("|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['model']} | {r['bandwidth']} | {r['workers']} | {r['servers']} | {r['policy']} | "
                    f"{r['cluster_ms']:.1f} ± {r['ci95_ms']:.1f} | {r['sim_ms']:.1f} | {100 * r['sim_error']:+.1f}% |\n")
    print(f"run_cluster: wrote {args.out}/cluster.csv and cluster.md")


if __name__ == "__main__":
    main()

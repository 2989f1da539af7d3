#!/usr/bin/env python3
"""Real multi-process runs of the model profiles over the parameter server, set beside the simulator's prediction.

Each cell (model x bandwidth x workers x policy) is run --trials times as `commsched launch -- commsched
synthetic-worker` (what `commsched run --backend ps` runs): W worker and S server processes on this machine, compute
emulated by sleeping per layer (workload/synthetic_model), links EMULATED by the transport's token bucket on every
process's sends (COMMSCHED_EMULATE_RATE), or with --links netns (root) over REAL shaped links: every process in its own
network namespace on a bridge, each host's link shaped by tbf both ways (netns_trial.sh). The mean of the trial means
and its 95% interval (Student t) are reported next to `commsched bench --mode sim` for the same cell and knobs, with
the ratio sim / real.

Warm-up: the first iterations are not steady. Iteration 0 asks the root server for the owner of every key, and the
root's answers queue behind its own paced sums, so iteration 1, which waits for iteration 0's gradients, is slow too
(resnet50, 4 workers, 0.25 Gbit/s, bytescheduler: 4.88 s, then 3.52, 3.57, 3.55, 3.49 s). Hence --warmup 2. (An
earlier version also dropped the last measured iteration, which then held the final drain; synthetic_model now runs
one trailing iteration unmeasured itself.)

The emulation limits what each process sends, not what a server receives, so runs use S = W servers by default: then no
server sends more than one worker does (each server sends W copies of its 1/S of the keys).

Usage:
  bench/cluster/run_cluster.py --commsched build/plugins/commsched --models resnet50 --bandwidths 1gbit \\
      --workers 2,4 --policies wfbp,bytescheduler --trials 3 --out cluster-results
"""
import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# two-sided 95% Student t quantiles for 1..10 degrees of freedom
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


def ci95(values):
    if len(values) < 2:
        return float("nan")
    t = T95[min(len(values) - 1, len(T95)) - 1]
    return t * statistics.stdev(values) / math.sqrt(len(values))


def run_trial(args, model, bw, workers, servers, policy):
    for attempt in range(1, args.attempts + 1):
        try:
            return run_trial_once(args, model, bw, workers, servers, policy)
        except RuntimeError as e:
            if attempt == args.attempts:
                raise
            print(f"run_cluster: attempt {attempt} failed, running the trial again: {str(e).splitlines()[-1]}",
                  file=sys.stderr, flush=True)


def run_trial_once(args, model, bw, workers, servers, policy):
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        if args.links == "netns":
            cmd = [os.path.join(HERE, "netns_trial.sh"), args.commsched, model, bw, str(workers), str(servers), policy,
                   args.partition, args.credit, args.small_tensor, str(args.iterations), str(args.warmup), result]
        else:
            cmd = [args.commsched, "launch", "-w", str(workers), "-s", str(servers), "--emulate-rate", bw, "--",
                   args.commsched, "synthetic-worker", "--model", model, "--policy", policy,
                   "--iterations", str(args.iterations), "--warmup", str(args.warmup),
                   "--partition", args.partition, "--credit", args.credit, "--small-tensor", args.small_tensor,
                   "--timeline-dir", "", "--result", result]
        env = dict(os.environ, NETNS_AUTH=args.auth)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        if out.returncode != 0 or not os.path.exists(result):
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        with open(result) as f:
            r = json.load(f)
    if not r["data_ok"] or r["error"]:
        raise RuntimeError(f"{policy}: reduced data wrong or error '{r['error']}' in {' '.join(cmd)}")
    return 1e3 * statistics.mean(r["iterations"])


def simulate(args, model, bw, workers, servers, policy, ps_workers):
    with tempfile.TemporaryDirectory() as tmp:
        part = parse_size(args.partition)
        rate = f"{parse_rate(bw) * args.link_efficiency / 1e6:.6g}mbit"  # the goodput the simulator is given
        cmd = [args.sim, "bench", "--mode", "sim", "--models", model, "--bandwidths", rate, "--workers", str(workers),
               "--servers", str(servers), "--network", "ps", "--latency", args.latency, "--policies", policy,
               "--partitions", args.partition, "--credit-multipliers", str(parse_size(args.credit) / part),
               "--small-tensor", args.small_tensor, "--iterations", "12", "--warmup", "4",
               "--ps-workers", ps_workers, "--out", tmp] + (["--emulated-links"] if args.links == "emulated" else [])
        if ps_workers == "each" and args.links == "netns":  # the symmetric model has FIFO links only
            cmd += ["--link-model", args.link_model]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        with open(os.path.join(tmp, "results.csv")) as f:
            # The row of the knobs given, not the scheduler's automatic row ("POLICY-auto"), which the grid adds first
            rows = [r for r in csv.DictReader(f) if r["policy"] == policy]
        if len(rows) != 1:
            sys.exit(f"run_cluster: expected one simulated row for {policy} at the given knobs, got {len(rows)}")
        return float(rows[0]["iteration_ms"])


def parse_rate(s):
    m = re.fullmatch(r"([\d.]+)\s*([kmgt]?)(bit|bps|bit/s)?", s.strip().lower())
    if not m:
        sys.exit(f"run_cluster: cannot parse rate '{s}'")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]


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
    ap.add_argument("--links", choices=["emulated", "netns"], default="emulated",
                    help="emulated: the transport's token bucket on loopback (COMMSCHED_EMULATE_RATE); netns (root): "
                         "every process in its own network namespace on a bridge, its link shaped with tbf both ways "
                         "(netns_trial.sh), predicted with the simulator's real-NIC model")
    ap.add_argument("--auth", choices=["on", "off"], default="on",
                    help="netns: on (a fresh secret per trial: ZeroMQ CURVE authenticates and encrypts every byte, CPU "
                         "the simulator does not charge) or off (COMMSCHED_AUTH=off, as on a trusted network)")
    ap.add_argument("--policies", default="wfbp,bytescheduler")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="leading iterations not measured (see above: keep >= 2)")
    ap.add_argument("--partition", default="1MiB")
    ap.add_argument("--credit", default="4MiB")
    ap.add_argument("--small-tensor", default="64KiB")
    ap.add_argument("--latency", default="50us", help="latency the simulator assumes per message")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per trial")
    ap.add_argument("--attempts", type=int, default=3, help="a failed trial (cluster error) is run again up to this")
    ap.add_argument("--out", default="cluster-results")
    ap.add_argument("--resimulate", metavar="CSV",
                    help="run no cluster: take the real cells of an earlier cluster.csv and simulate them again (after "
                         "a simulator change); --partition/--credit/--small-tensor/--latency must match that run")
    ap.add_argument("--link-model", choices=["fifo", "fair"], default="fifo",
                    help="netns: how the every-worker simulation shares a real NIC (fifo: one message at a time in "
                         "arrival order; fair: max-min among connections, as TCP does)")
    ap.add_argument("--link-efficiency", type=float,
                    help="payload share of the shaped rate given to the simulator (default: 1448/1514 for netns, "
                         "TCP payload per 1514-byte Ethernet frame with timestamps, as tbf counts frames; 1 for "
                         "emulated links, whose token bucket counts message bytes)")
    args = ap.parse_args()
    args.sim = args.sim or args.commsched
    if args.link_efficiency is None:
        args.link_efficiency = 1448 / 1514 if args.links == "netns" else 1.0
    os.makedirs(args.out, exist_ok=True)

    def row(model, bw, w, s, policy, mean, ci, trials):
        each = simulate(args, model, bw, w, s, policy, "each")
        one = simulate(args, model, bw, w, s, policy, "one")
        r = {"model": model, "bandwidth": bw, "workers": w, "servers": s, "policy": policy,
             "cluster_ms": round(mean, 2), "ci95_ms": round(ci, 2),
             "sim_ms": round(each, 2), "sim_over_real": round(each / mean, 4),
             "sim_one_ms": round(one, 2), "sim_one_over_real": round(one / mean, 4), "trials_ms": trials}
        print(r, flush=True)
        return r

    rows = []
    if args.resimulate:
        with open(args.resimulate) as f:
            for r in csv.DictReader(f):
                rows.append(row(r["model"], r["bandwidth"], int(r["workers"]), int(r["servers"]), r["policy"],
                                float(r["cluster_ms"]), float(r["ci95_ms"]), r["trials_ms"]))
    for model in ([] if args.resimulate else args.models.split(",")):
        for bw in args.bandwidths.split(","):
            for w in map(int, args.workers.split(",")):
                s = args.servers or w
                for policy in args.policies.split(","):
                    trials = [run_trial(args, model, bw, w, s, policy) for _ in range(args.trials)]
                    rows.append(row(model, bw, w, s, policy, statistics.mean(trials), ci95(trials),
                                    " ".join(f"{t:.1f}" for t in trials)))

    with open(os.path.join(args.out, "cluster.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    with open(os.path.join(args.out, "cluster.md"), "w") as f:
        f.write("| model | bandwidth | workers | servers | policy | real ms (95% CI) | sim ms, each worker | sim / real "
                "| sim ms, symmetric | sim / real |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['model']} | {r['bandwidth']} | {r['workers']} | {r['servers']} | {r['policy']} | "
                    f"{r['cluster_ms']:.1f} ± {r['ci95_ms']:.1f} | {r['sim_ms']:.1f} | {r['sim_over_real']:.3f} | "
                    f"{r['sim_one_ms']:.1f} | {r['sim_one_over_real']:.3f} |\n")
    print(f"run_cluster: wrote {args.out}/cluster.csv and cluster.md")


if __name__ == "__main__":
    main()

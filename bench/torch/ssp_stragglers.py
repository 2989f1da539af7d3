#!/usr/bin/env python3
"""Stragglers on the parameter server: COMMSCHED_PS_MODE=sync against ssp (k=1, 2) and async, side by side in one
run, with one worker's compute slowed 1.5x and 2x. Compute is EMULATED by sleeping (--compute-ms per step, times the
slowdown on the slow worker); the model is a small MLP on the example's generated images, so the sleeps dominate and
the real arithmetic only makes the loss fall.

Every worker trains for --seconds of wall time, then joins (Horovod's join: the others go on without it), so a fast
worker that is not held back does more steps. Throughput: every worker's images over the time the run trained.
Time to target: rank 0's (a full-speed worker's) time until the mean of its last 5 losses is below --target-loss.

    python3 bench/torch/ssp_stragglers.py                     # every configuration, a table at the end
    python3 bench/torch/ssp_stragglers.py --straggle rotating  # each step a different worker is the slow one

--straggle persistent (default): the last rank is slow on every step. rotating: on step s, rank s mod W is slow, so
one worker is always slow but never the same one for long: the case bounded staleness is made for.

What to expect: with a persistent straggler, ssp(k) cannot raise throughput in steady state: a fast worker waits once
it is k rounds ahead, so over the run it does at most k more steps than the slow one (the bound working as
designed); only async lets the fast workers run at full speed (W-1 of W workers at 1/c, the slow one at 1/(f c):
1.75x sync's at f = 2 with 4 workers). With a rotating straggler every worker is slow one step in W, and ssp with
k >= 1 absorbs it: each worker averages (W - 1 + f) / W compute per step instead of f (1.6x at f = 2, W = 4).
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[2]
CLASSES = 10


def worker(a):
    import torch
    import torch.nn.functional as F
    from torch import nn

    import commsched.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    patterns = torch.randn(CLASSES, 3 * 32 * 32)
    model = nn.Sequential(nn.Linear(3 * 32 * 32, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=a.lr), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(1 + rank)
    losses, times = [], []
    worst = {}  # rank -> the largest lag this worker heard of (commsched.torch.stragglers())
    start = time.perf_counter()
    step = 0
    while time.perf_counter() - start < a.seconds:
        y = torch.randint(0, CLASSES, (a.batch_size,), generator=gen)
        x = patterns[y] + 3.0 * torch.randn(a.batch_size, 3 * 32 * 32, generator=gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        slow = (rank == size - 1) if a.straggle == "persistent" else (step % size == rank)
        time.sleep(a.compute_ms * (a.slowdown if slow else 1.0) / 1e3)  # the emulated compute
        loss.backward()
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
        step += 1
        for s in hvd.stragglers():
            w = worst.setdefault(s["rank"], {"iterations_behind": 0, "seconds_behind": 0.0})
            w["iterations_behind"] = max(w["iterations_behind"], s["iterations_behind"])
            w["seconds_behind"] = max(w["seconds_behind"], round(s["seconds_behind"], 3))
    opt.flush()
    trained_s = time.perf_counter() - start
    hvd.join()
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "steps": step, "trained_s": trained_s, "losses": losses, "times": times,
                   "stragglers": worst}, f)
    hvd.shutdown()


def time_to_target(losses, times, target, window=5):
    for n in range(window, len(losses) + 1):
        if sum(losses[n - window:n]) / window < target:
            return times[n - 1]
    return None


def commsched_bin():
    built = ROOT / "build" / "plugins" / "commsched"
    return os.environ.get("COMMSCHED_BIN") or (str(built) if built.exists() else shutil.which("commsched"))


def run_one(a, mode, k, slowdown):
    out = tempfile.mkdtemp(prefix="ssp_bench_")
    env = dict(os.environ, COMMSCHED_PS_MODE=mode, COMMSCHED_STALENESS=str(k or 0))
    env.setdefault("PYTHONPATH", str(ROOT / "build" / "python"))
    cmd = [commsched_bin(), "launch", "-w", str(a.workers), "-s", "1", "--", sys.executable, str(HERE), "--worker",
           "--out", out, "--seconds", str(a.seconds), "--compute-ms", str(a.compute_ms), "--slowdown", str(slowdown),
           "--straggle", a.straggle, "--batch-size", str(a.batch_size), "--lr", str(a.lr)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.seconds * 4 + 120)
    if p.returncode != 0:
        raise SystemExit(f"{mode} k={k} slowdown {slowdown}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    ranks = [json.loads((pathlib.Path(out) / f"rank{r}.json").read_text()) for r in range(a.workers)]
    shutil.rmtree(out)
    images = sum(r["steps"] for r in ranks) * a.batch_size
    trained = max(r["trained_s"] for r in ranks)
    r0 = ranks[0]
    return {"mode": mode, "k": k, "slowdown": slowdown, "steps": [r["steps"] for r in ranks],
            "images_per_s": images / trained, "time_to_target_s": time_to_target(r0["losses"], r0["times"], a.target_loss),
            "last_loss_rank0": sum(r0["losses"][-5:]) / 5, "worst_lag_heard_by_rank0": r0["stragglers"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=12.0, help="wall time each worker trains")
    ap.add_argument("--compute-ms", type=float, default=50.0, help="emulated compute per step at full speed")
    ap.add_argument("--slowdown", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--slowdowns", default="1.5,2")
    ap.add_argument("--straggle", choices=["persistent", "rotating"], default="persistent")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--target-loss", type=float, default=0.1)
    ap.add_argument("--result", help="write every row as JSON here")
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    rows = []
    for slowdown in [float(s) for s in a.slowdowns.split(",")]:
        for mode, k in [("sync", None), ("ssp", 1), ("ssp", 2), ("async", None)]:
            rows.append(run_one(a, mode, k, slowdown))
            r = rows[-1]
            ttt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s"
            name = mode + ("" if k is None else f"(k={k})")
            print(f"{a.straggle} {slowdown}x  {name:10s} {r['images_per_s']:8.1f} img/s  steps {r['steps']}  "
                  f"time to {a.target_loss}: {ttt}  rank 0 heard: {r['worst_lag_heard_by_rank0']}", flush=True)
    print(f"\n{a.workers} workers, {a.compute_ms} ms emulated compute per step, {a.seconds} s each, straggle={a.straggle}")
    print("| slowdown | mode | images/s | x sync | time to target (s) | steps per rank |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        base = next(b for b in rows if b["slowdown"] == r["slowdown"] and b["mode"] == "sync")
        ttt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        name = r["mode"] + ("" if r["k"] is None else f"(k={r['k']})")
        print(f"| {r['slowdown']}x | {name} | {r['images_per_s']:.1f} | {r['images_per_s'] / base['images_per_s']:.2f} "
              f"| {ttt} | {r['steps']} |")
    if a.result:
        pathlib.Path(a.result).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Elastic recovery against a plain restart, and runs that must not hang (issue 30's elastic target).

Each trial runs tests/python/elastic_worker.py on 4 workers (Gloo, or --servers S parameter servers) under
`commsched launch --min-workers 2`; one worker
(the victim cycles through the launcher ids 0..3, rank 0 included) is killed in the middle of step K, and the other
three must finish every step with equal parameters. Side by side in the same trial, a plain restart from the same
commit: 3 fresh workers (`commsched launch -w 3`) that load the state rank 0 saved at that commit.

- elastic restore: from the victim's death to the survivors' first step after the rollback (detection, leaving the
  broken group, forming and connecting the next generation, restore and sync);
- plain restart: from starting the 3-worker launch to its first step (process start, imports, init, loading the
  commit, sync). A supervisor's time to notice the failure is not counted there, so the ratio favours the restart.

A trial that does not finish within --timeout counts as a hang. Prints one line per trial and a summary.

    PYTHONPATH=build/python python3 bench/torch/elastic_recovery.py --trials 20
"""
import argparse
import glob
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "python" / "elastic_worker.py"


def commsched_bin():
    if os.environ.get("COMMSCHED_BIN"):
        return os.environ["COMMSCHED_BIN"]
    import commsched._C as C
    return str(pathlib.Path(C.__file__).resolve().parents[2] / "plugins" / "commsched")


def run(cmd, env, timeout):
    """(returncode or None on timeout, output); the whole process group is killed on timeout."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def first_steps(log):
    return [float(t) for t in re.findall(r"first step at (\d+\.\d+)", log)]


def survivors_equal(out):
    import torch
    models = [torch.load(f) for f in sorted(glob.glob(os.path.join(out, "model.*.pt")))]
    if len(models) != 3 or any(m["size"] != 3 or m["steps"] != 24 for m in models):
        return False
    return all(torch.equal(v, models[0]["model"][k]) for m in models for k, v in m["model"].items())


def trial(i, args, env):
    victim, step = i % 4, 5 + (i * 7) % 13
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as out2:
        cmd = [commsched_bin(), "launch", "-w", "4", "-s", str(args.servers), "--min-workers", "2", "--", sys.executable,
               str(WORKER), "--out", out]
        rc, log = run(cmd, {**env, "ELASTIC_VICTIM": str(victim), "ELASTIC_FAULT": "kill",
                            "ELASTIC_FAULT_STEP": str(step), "ELASTIC_SAVE_AT": str(step)}, args.timeout)
        killed = re.search(r"kill at step \d+ \((\d+\.\d+)\)", log)
        starts = first_steps(log)
        ok = rc == 0 and survivors_equal(out) and killed and len(starts) >= 2
        elastic_s = starts[1] - float(killed.group(1)) if ok else None
        restart_s = None
        if ok:
            cmd = [commsched_bin(), "launch", "-w", "3", "-s", str(args.servers), "--", sys.executable, str(WORKER),
                   "--out", out2]
            began = time.time()
            rc2, log2 = run(cmd, {**env, "ELASTIC_RESUME": os.path.join(out, "commit.pt")}, args.timeout)
            if rc2 == 0 and first_steps(log2):
                restart_s = first_steps(log2)[0] - began
        verdict = "hang" if rc is None else ("ok" if ok else "FAILED")
        print(f"trial {i}: victim {victim} at step {step}: {verdict}" +
              (f", elastic restore {elastic_s:.2f} s, plain restart {restart_s:.2f} s" if restart_s else ""),
              flush=True)
        if not ok and args.verbose:
            print(log)
        return verdict, elastic_s, restart_s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--servers", type=int, default=0, help="parameter servers (0: Gloo)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(WORKER.parent)] + [p for p in env.get("PYTHONPATH", "").split(":") if p])
    if args.servers == 0:
        env.setdefault("COMMSCHED_BACKEND", "gloo")
    results = [trial(i, args, env) for i in range(args.trials)]
    passed = sum(v == "ok" for v, _, _ in results)
    hangs = sum(v == "hang" for v, _, _ in results)
    pairs = [(e, r) for _, e, r in results if e is not None and r is not None]
    print(f"{passed} of {len(results)} trials passed, {hangs} hung")
    if pairs:
        el, rs = [e for e, _ in pairs], [r for _, r in pairs]
        print(f"elastic restore: median {statistics.median(el):.2f} s, max {max(el):.2f} s; plain restart from the "
              f"same commit: median {statistics.median(rs):.2f} s, min {min(rs):.2f} s; worst ratio "
              f"{max(e / r for e, r in pairs):.2f}x (target <= 2x)")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

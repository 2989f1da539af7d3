#!/usr/bin/env python3
"""Step time of a model profile's tensors with emulated compute (examples/profile_model.py), trained as a Horovod
script would be: DistributedOptimizer(optimizer, named_parameters=...) only, no commsched extras, so what it measures
is what an unchanged horovod.torch script gets.

    commsched launch -w 4 -s 2 --emulate-rate 2gbit -- python3 examples/pytorch_profile_benchmark.py \\
        --profile resnet50 --policy wfbp --no-cross-iteration
    commsched launch -w 4 -s 2 --emulate-rate 2gbit -- python3 examples/pytorch_profile_benchmark.py --profile resnet50

Prints ms/step (mean and 95% interval over --steps steps after --warmup) and writes it with the configuration to
--result (rank 0).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import commsched.torch as hvd  # noqa: E402  (a Horovod script: `import horovod.torch as hvd`)
from commsched._C import mean_ci95  # noqa: E402
from profile_model import ProfileModel, load_profile  # noqa: E402


def ci95(values):
    """Half-width of the 95% interval of the mean (Student t, the engine's one table); 0 below two values."""
    return mean_ci95(values)[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="resnet50", help="a name in workload/profiles or a .json path")
    ap.add_argument("--compute-scale", type=float, default=1.0, help="multiplies the profiled compute times")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--policy", help="wfbp, bytescheduler, ... (default: COMMSCHED_POLICY)")
    ap.add_argument("--cross-iteration", action=argparse.BooleanOptionalAction, default=None,
                    help="the library default (on) unless given; --no-cross-iteration waits in step()")
    ap.add_argument("--tune", action="store_true", help="auto-tune partition size and credit while training")
    ap.add_argument("--result")
    a = ap.parse_args()

    torch.set_num_threads(1)
    hvd.init(policy=a.policy, tune=a.tune or None)
    model = ProfileModel(load_profile(a.profile), a.compute_scale)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         cross_iteration=a.cross_iteration)
    x = torch.full((4,), 1.0 + hvd.rank())
    ctx = hvd.context()

    def step():
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    tuning_steps = 0
    while a.tune and not ctx.tuner_state()["finished"]:  # time only what follows tuning
        step()
        tuning_steps += 1
    times = []
    for i in range(a.warmup + a.steps):
        start = time.perf_counter()
        step()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)
    optimizer.flush()
    ms = [t * 1e3 for t in times]
    result = {"profile": model.profile_name, "policy": ctx.policy, "cross_iteration": bool(optimizer.cross_iteration),
              "workers": hvd.size(), "gradient_mib": model.gradient_bytes / 2**20, "compute_ms": model.compute_s * 1e3,
              "step_ms": sum(ms) / len(ms), "step_ms_ci95": ci95(ms), "steps": a.steps, "tuned": bool(a.tune),
              "tuning_steps": tuning_steps, "knobs": dict(ctx.knobs())}
    if hvd.rank() == 0:
        print(f"{result['profile']}: {result['policy']}{' + cross-iteration' if result['cross_iteration'] else ''}, "
              f"{hvd.size()} workers: {result['step_ms']:.1f} +- {result['step_ms_ci95']:.1f} ms/step "
              f"(compute {result['compute_ms']:.1f} ms, {result['gradient_mib']:.1f} MiB of gradients)")
        if a.result:
            with open(a.result, "w") as f:
                json.dump(result, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The plugin's own cost per training step: one process (the single-rank loopback backend, no network), a model of
many small tensors (the shape that costs a plugin most: hooks, task submission, waits per tensor), the same steps with
a plain torch optimizer and with commsched.torch's DistributedOptimizer, interleaved step by step so that drift on a
shared machine hits both alike. The overhead is the median per-step difference; per tensor, that over the tensors.
Beside wall time it reports the process's CPU time (every thread's, the engine's included) per step the same way:
on a loaded machine wall time also counts waiting for a core, CPU time does not.

    python3 bench/torch/overhead_bench.py --layers 80 --width 64 --steps 200 [--no-cross-iteration] [--result F]

bench/torch/overhead_bench.sh runs it with torch 1.13 and a torch 2.x side by side.
"""
import argparse
import json
import pathlib
import statistics
import time

import torch

import commsched.torch as hvd


def model(layers, width, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def stepper(net, opt, x):
    def step():
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()
    return step


def measure(steps, warmup, plain, plugin):
    """Per-step wall and CPU seconds of each, alternating which goes first (so neither always follows the other)."""
    for _ in range(warmup):
        plain()
        plugin()
    times = {"plain": [], "plugin": []}
    cpu = {"plain": [], "plugin": []}
    for i in range(steps):
        order = [("plain", plain), ("plugin", plugin)]
        for label, fn in order if i % 2 == 0 else order[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[label].append(time.perf_counter() - t0)
            cpu[label].append(time.process_time() - c0)
    return times, cpu


def median_difference_us(times):
    return statistics.median(1e6 * (b - p) for p, b in zip(times["plain"], times["plugin"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=80, help="Linear layers (2 tensors each)")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--cross-iteration", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--result")
    a = ap.parse_args()

    torch.set_num_threads(1)  # the plugin's threads, not torch's intra-op pool, are what is measured
    hvd.init()
    x = torch.randn(32, a.width)
    plain_net, plugin_net = model(a.layers, a.width, 0), model(a.layers, a.width, 0)
    plain = stepper(plain_net, torch.optim.SGD(plain_net.parameters(), lr=1e-3), x)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(plugin_net.parameters(), lr=1e-3),
                                   named_parameters=plugin_net.named_parameters(),
                                   cross_iteration=a.cross_iteration)
    plugin = stepper(plugin_net, opt, x)
    times, cpu = measure(a.steps, a.warmup, plain, plugin)
    if hasattr(opt, "flush"):
        opt.flush()
    tensors = sum(1 for _ in plugin_net.parameters())
    plain_us = 1e6 * statistics.median(times["plain"])
    plugin_us = 1e6 * statistics.median(times["plugin"])
    overhead, overhead_cpu = median_difference_us(times), median_difference_us(cpu)
    result = {"torch": torch.__version__, "tensors": tensors, "cross_iteration": bool(opt.cross_iteration),
              "plain_us": plain_us, "plugin_us": plugin_us, "overhead_us": overhead,
              "overhead_us_per_tensor": overhead / tensors, "overhead_cpu_us": overhead_cpu, "steps": a.steps}
    print(f"torch {result['torch']}: {tensors} tensors, plain {plain_us:.0f} us/step, with commsched "
          f"{plugin_us:.0f} us/step{' (cross-iteration)' if result['cross_iteration'] else ''}: overhead "
          f"{overhead:.0f} us/step, {overhead / tensors:.2f} us/tensor; CPU time {overhead_cpu:.0f} us/step, "
          f"{overhead_cpu / tensors:.2f} us/tensor", flush=True)
    if a.result:
        pathlib.Path(a.result).write_text(json.dumps(result))
    hvd.shutdown()


if __name__ == "__main__":
    main()

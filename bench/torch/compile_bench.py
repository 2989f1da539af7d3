#!/usr/bin/env python3
"""One worker of the compiled-training benchmark (bench/torch/compile_bench.sh): a model profile's gradient tensors
(workload/profiles) with its compute emulated by sleeping, as examples/profile_model.py does, but through opaque
custom ops (torch.library) so that torch.compile compiles the whole model into one graph (the sleeps stay calls
inside it). Trained through DistributedOptimizer at its defaults as a Horovod script would be; --compile compiles
the model with torch.compile(model). Rank 0 prints and writes ms/step.

    commsched launch -w 4 -s 2 --emulate-rate 2gbit -- python3 bench/torch/compile_bench.py --compile \\
        --policy bytescheduler --result out.json
"""
import argparse
import json
import os
import pathlib
import sys
import time

import torch
from torch import nn

import commsched.torch as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from profile_model import load_profile  # noqa: E402
from pytorch_profile_benchmark import ci95  # noqa: E402


def _define_ops():
    """Forward: sleeps, returns x's copy; backward: sleeps, gives each parameter a constant gradient (the mean of
    the output gradient, so it differs per step and per worker). Opaque to dynamo, so a compiled model keeps them."""
    lib = "commsched_bench"

    @torch.library.custom_op(f"{lib}::compute", mutates_args=())
    def compute(x: torch.Tensor, forward_s: float, backward_s: float, params: list[torch.Tensor]) -> torch.Tensor:
        time.sleep(forward_s)
        return x.clone()

    @compute.register_fake
    def _(x, forward_s, backward_s, params):
        return torch.empty_like(x)

    @torch.library.custom_op(f"{lib}::compute_backward", mutates_args=())
    def compute_backward(grad_out: torch.Tensor, backward_s: float,
                         params: list[torch.Tensor]) -> list[torch.Tensor]:
        time.sleep(backward_s)
        g = float(grad_out.mean())
        return [torch.full_like(p, g) for p in params]

    @compute_backward.register_fake
    def _(grad_out, backward_s, params):
        return [torch.empty_like(p) for p in params]

    def setup_context(ctx, inputs, output):
        ctx.backward_s = inputs[2]
        ctx.save_for_backward(*inputs[3])

    def backward(ctx, grad_out):
        return grad_out, None, None, compute_backward(grad_out, ctx.backward_s, list(ctx.saved_tensors))

    compute.register_autograd(backward, setup_context=setup_context)
    return compute


class Layer(nn.Module):
    def __init__(self, tensors, op, compute_scale):
        super().__init__()
        self.op = op
        self.forward_s = compute_scale * sum(t["forward_ms"] for t in tensors) / 1e3
        self.backward_s = compute_scale * sum(t["backward_ms"] for t in tensors) / 1e3
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(t["elements"])) for t in tensors)

    def forward(self, x):
        return self.op(x, self.forward_s, self.backward_s, list(self.weights))


def build(profile, compute_scale):
    op = _define_ops()
    layers = {}
    for t in profile["tensors"]:
        layers.setdefault(t["layer"], []).append(t)
    return nn.Sequential(*(Layer(layers[k], op, compute_scale) for k in sorted(layers)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="resnet50")
    ap.add_argument("--compute-scale", type=float, default=1.0, help="multiplies the profiled compute times")
    ap.add_argument("--compile", action="store_true", help="torch.compile(model) (default backend, inductor)")
    ap.add_argument("--policy", help="wfbp, bytescheduler, ... (default: COMMSCHED_POLICY)")
    ap.add_argument("--cross-iteration", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--result")
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init(policy=a.policy)
    model = build(load_profile(a.profile), a.compute_scale)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
                                   named_parameters=model.named_parameters(), cross_iteration=a.cross_iteration)
    call = torch.compile(model) if a.compile else model
    x = torch.full((4,), 1.0 + hvd.rank())
    times = []
    for i in range(a.warmup + a.steps):
        start = time.perf_counter()
        opt.zero_grad()
        call(x).sum().backward()
        opt.step()
        if i >= a.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    opt.flush()
    result = {"profile": a.profile, "compute_scale": a.compute_scale, "compiled": a.compile, "policy": hvd.context().policy,
              "cross_iteration": bool(opt.cross_iteration), "workers": hvd.size(), "torch": torch.__version__,
              "step_ms": sum(times) / len(times), "step_ms_ci95": ci95(times)}
    if hvd.rank() == 0:
        print(json.dumps(result), flush=True)
        if a.result:
            pathlib.Path(a.result).write_text(json.dumps(result))
    hvd.shutdown()


if __name__ == "__main__":
    main()

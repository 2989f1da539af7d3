"""One worker of test_cross_iteration_default.py: a Horovod-style training loop that never passes model= (only
named_parameters, as horovod.torch scripts do), with the things that make deferred updates hard to keep exact: a
learning-rate scheduler stepping between step() and the next forward, two backward passes per step, zero_grad
alternating set_to_none, a module used twice in one forward, a ParameterList and modules without parameters. Saves the final
parameters to OUT/<rank>.pt and whether step() really deferred updates to the next forward."""
import argparse
import json
import os

import torch
from torch import nn
import torch.nn.functional as F

import commsched.torch as hvd

IN, HIDDEN, OUT = 6, 8, 3
PASSES = 2


class TwiceUsed(nn.Module):
    """`a` runs twice per forward, `gain` sits in a ParameterList; with --reads-weight the head reads `b.weight` without calling `b`."""

    def __init__(self, reads_weight):
        super().__init__()
        self.a = nn.Linear(HIDDEN, HIDDEN)
        self.inp = nn.Linear(IN, HIDDEN)
        self.act = nn.Tanh()
        self.b = nn.Linear(HIDDEN, OUT)
        self.gain = nn.ParameterList([nn.Parameter(torch.ones(HIDDEN))])  # a container: never called itself
        self.reads_weight = reads_weight

    def forward(self, x):
        h = self.act(self.a(self.act(self.a(self.act(self.inp(x)))))) * self.gain[0]
        return F.linear(h, self.b.weight, self.b.bias) if self.reads_weight else self.b(h)


def micro_batch(step, micro, total):
    g = torch.Generator().manual_seed(7000 + 10 * step + micro)
    return torch.randn(total, IN, generator=g), torch.randint(0, OUT, (total,), generator=g)


def train(steps, per_worker, rank, size, reads_weight, wrap):
    torch.manual_seed(0)
    model = TwiceUsed(reads_weight)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-4)
    if wrap:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       backward_passes_per_step=PASSES)
    return model, loop(model, opt, steps, per_worker, rank, size)


def loop(call, opt, steps, per_worker, rank, size):
    """The training loop (also compiled_worker.py's); returns the most updates step() ever left pending."""
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    deferred = 0
    for step in range(steps):
        opt.zero_grad(set_to_none=step % 2 == 0)
        for micro in range(PASSES):
            x, y = micro_batch(step, micro, per_worker * size)
            lo, hi = rank * per_worker, (rank + 1) * per_worker
            F.cross_entropy(call(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
        sched.step()
        deferred = max(deferred, getattr(opt, "pending_updates", 0))
    return deferred


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reads-weight", action="store_true")
    a = ap.parse_args()
    hvd.init()
    model, deferred = train(a.steps, a.batch, hvd.rank(), hvd.size(), a.reads_weight, wrap=True)
    # model.state_dict() right after step(): the updates still pending must show in it.
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, os.path.join(a.out, f"{hvd.rank()}.pt"))
    with open(os.path.join(a.out, f"{hvd.rank()}.json"), "w") as f:
        json.dump({"deferred": deferred}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()

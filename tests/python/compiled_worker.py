"""One worker of test_torch_compile.py: the training loop of unchanged_script_worker.py (a learning-rate scheduler
stepping between step() and the next forward, two backward passes per step, zero_grad alternating set_to_none, a
module called twice, a ParameterList) on a compiled model, with DistributedOptimizer at its defaults. Saves the final
parameters to OUT/<rank>.pt and OUT/<rank>.json: whether step() deferred updates (the overlap survived), how many
graph breaks dynamo made, and how many times a module inside a compiled graph landed its updates (the op of
commsched.torch.compiled.land)."""
import argparse
import contextlib
import json
import os

import torch

import commsched.torch as hvd
from commsched.torch import cross_iteration
from unchanged_script_worker import PASSES, TwiceUsed, loop

LANDED = []  # the parameter positions of every landing inside a compiled graph, in order


def count_landings():
    """Records each call of the op's body (it runs eagerly, at the op's place in the compiled graph)."""
    body = cross_iteration.CrossIteration._land_from_graph

    def spy(self, params, positions):
        LANDED.append(list(positions))
        return body(self, params, positions)
    cross_iteration.CrossIteration._land_from_graph = spy  # copied into the optimizer's class when it is wrapped


class WithGraphBreak(TwiceUsed):
    """The same model with a graph break in the middle of its forward (two compiled graphs, eager code between)."""

    def forward(self, x):
        h = self.act(self.a(self.act(self.inp(x))))
        torch._dynamo.graph_break()
        return self.b(self.act(self.a(h)) * self.gain[0])


def build(graph_break, how, backend, reads_weight):
    """The model and what to call: torch.compile(model) ('wrap'), model.compile() ('inplace') or eager ('none')."""
    torch.manual_seed(0)
    model = (WithGraphBreak if graph_break else TwiceUsed)(reads_weight=reads_weight)
    if how == "wrap":
        return model, torch.compile(model, backend=backend)
    if how == "inplace":
        model.compile(backend=backend)
    return model, model


def compiled_autograd(backend):
    """Backward passes run through compiled autograd (torch >= 2.4; its switch is private API there)."""
    return torch._dynamo.compiled_autograd._enable(torch.compile(backend=backend))


def train(a, rank, size):
    model, call = build(a.graph_break, a.compile, a.backend, a.reads_weight)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-4)
    # Made before the first compiled call, so the process-wide hooks exist when the wrapper first runs.
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), backward_passes_per_step=PASSES,
                                   model=model if a.pass_model else None)
    return model, loop(call, opt, a.steps, a.batch, rank, size)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--compile", choices=["wrap", "inplace", "none"], default="wrap")
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--graph-break", action="store_true")
    ap.add_argument("--pass-model", action="store_true")
    ap.add_argument("--reads-weight", action="store_true", help="the head reads b.weight without calling b")
    ap.add_argument("--compiled-autograd", action="store_true", help="the backward compiled too (compiled autograd)")
    a = ap.parse_args()
    hvd.init()
    count_landings()
    torch._dynamo.utils.counters.clear()
    with compiled_autograd(a.backend) if a.compiled_autograd else contextlib.nullcontext():
        model, deferred = train(a, hvd.rank(), hvd.size())
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, os.path.join(a.out, f"{hvd.rank()}.pt"))
    with open(os.path.join(a.out, f"{hvd.rank()}.json"), "w") as f:
        json.dump({"deferred": deferred, "graph_breaks": breaks, "landed_in_graph": len(LANDED),
                   "compiled_backwards": torch._dynamo.utils.counters["compiled_autograd"]["captures"]}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()

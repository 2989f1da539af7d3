"""One worker of test_horovod_optimizer_args.py: trains with Horovod's DistributedOptimizer arguments and saves, per
case, the final parameters (OUT/<case>.<rank>.pt) and what the test checks besides (OUT/<rank>.json: submission
order, error messages). `train` with wrap=False is the single-process reference."""
import argparse
import gc
import json
import os

import torch
from torch import nn
import torch.nn.functional as F

import commsched.torch as hvd
from unchanged_script_worker import OUT, PASSES, TwiceUsed, micro_batch

VOCAB, DIM = 20, 5


class Bag(nn.Module):
    """An embedding with sparse gradients feeding a linear head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, sparse=True)
        self.head = nn.Linear(DIM, OUT)

    def forward(self, x):
        return self.head(self.emb(x).mean(dim=1))


def batch(model, step, micro, total):
    x, y = micro_batch(step, micro, total)
    if isinstance(model, Bag):
        x = (x.abs() * 7).long() % VOCAB  # token ids: each rank touches different rows
    return x, y


def train(steps, per_worker, rank, size, wrap, sparse=False, args=lambda named: {}, late=False):
    """args(named parameters) -> DistributedOptimizer's keyword arguments (groups= needs the model's parameters).
    late: layer `a` joins the optimizer halfway, through add_param_group (as when unfreezing for fine-tuning)."""
    torch.manual_seed(0)
    model = Bag() if sparse else TwiceUsed(reads_weight=False)
    held_back = list(model.a.parameters()) if late else []
    # Sparse gradients: plain SGD (its sparse update); dense ones: momentum too.
    opt = torch.optim.SGD([p for p in model.parameters() if all(p is not q for q in held_back)], lr=0.2,
                          momentum=0.0 if sparse else 0.9)
    order = []
    if wrap:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       backward_passes_per_step=PASSES, **args(dict(model.named_parameters())))
        # Which gradients went out, in order (groups= holds a group back until all of it is ready).
        submit = opt._submit
        opt._submit = lambda p: (order.append(opt._names[p]), submit(p))[1]
    for step in range(steps):
        if held_back and step == steps // 2:
            opt.add_param_group({"params": held_back, "lr": 0.1})
        opt.zero_grad()
        for micro in range(PASSES):
            x, y = batch(model, step, micro, per_worker * size)
            lo, hi = rank * per_worker, (rank + 1) * per_worker
            F.cross_entropy(model(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
    if wrap:
        opt.flush()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, order


def errors(model_params, foreign):
    """Each bad argument, and the message it raised."""
    cases = {
        "groups_and_num_groups": dict(groups=2, num_groups=2),
        "foreign_group_member": dict(groups=[[foreign]]),
        "duplicate_group_member": dict(groups=[[model_params[0]], [model_params[0]]]),
        "negative_groups": dict(groups=-1),
        "predivide_with_sum": dict(op=hvd.Sum, gradient_predivide_factor=2.0),
        "adasum": dict(op=hvd.Adasum),
        "max": dict(op=hvd.Max),
    }
    out = {}
    for case, kwargs in cases.items():
        opt = torch.optim.SGD(model_params, lr=0.1)
        try:
            hvd.DistributedOptimizer(opt, **kwargs)
            out[case] = None
        except ValueError as e:
            out[case] = str(e)
        gc.collect()
    return out


def add_group_refusals():
    """What add_param_group() raises between backward() and step(), and for a parameter missing from
    named_parameters (then the optimizer keeps the groups it had)."""
    model = TwiceUsed(reads_weight=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.b.parameters(), lr=0.1), cross_iteration=False,
                                   named_parameters=model.b.named_parameters())
    out = {}
    F.cross_entropy(model(torch.zeros(2, model.inp.in_features)), torch.zeros(2, dtype=torch.long)).backward()
    for case in ("mid_step", "unnamed"):
        try:
            opt.add_param_group({"params": list(model.a.parameters())})
        except (RuntimeError, ValueError) as e:
            out[case] = f"{e} (groups: {len(opt.param_groups)})"
        opt.synchronize()
    # Halfway through backward_passes_per_step=2: the first pass is accumulated, nothing is on the wire yet.
    model = TwiceUsed(reads_weight=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.b.parameters(), lr=0.1), cross_iteration=False,
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    F.cross_entropy(model(torch.zeros(2, model.inp.in_features)), torch.zeros(2, dtype=torch.long)).backward()
    try:
        opt.add_param_group({"params": list(model.a.parameters())})
    except RuntimeError as e:
        out["mid_accumulation"] = f"{e} (groups: {len(opt.param_groups)})"
    return out


# groups=: the first and the last layer in one group (in backward order: the last and the first gradient).
GROUP_CASES = {
    "plain": lambda named: {},
    "num_groups": lambda named: {"num_groups": 3},
    "groups": lambda named: {"groups": [[named["inp.weight"], named["b.weight"]]]},
    "predivide": lambda named: {"gradient_predivide_factor": 2.0},
}


def run_cases(a, rank, size, report):
    if a.case == "process_set":
        pairs = hvd.add_process_set([0, 1])  # collective: every rank registers it
        try:
            report["states"]["process_set"], _ = train(a.steps, a.batch, rank, 2, True,
                                                       args=lambda named: {"process_set": pairs})
        except ValueError as e:
            report["refused"] = str(e)
    elif a.case == "groups":
        for case, args in GROUP_CASES.items():
            report["states"][case], report[f"order.{case}"] = train(a.steps, a.batch, rank, size, True, args=args)
            gc.collect()  # the previous optimizer's hooks go with it
    elif a.case in ("sparse", "sparse_as_dense"):
        dense = a.case == "sparse_as_dense"
        report["states"][a.case], _ = train(a.steps, a.batch, rank, size, True, sparse=True,
                                            args=lambda named: {"sparse_as_dense": dense})
    elif a.case == "add_param_group":
        report["states"][a.case], _ = train(a.steps, a.batch, rank, size, True, late=True)
        report["refusals"] = add_group_refusals()
    elif a.case == "errors":
        model = TwiceUsed(reads_weight=False)
        report["errors"] = errors(list(model.parameters()), torch.nn.Parameter(torch.zeros(2)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", required=True,
                    choices=["process_set", "groups", "sparse", "sparse_as_dense", "add_param_group", "errors"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    report = {"states": {}}
    run_cases(a, rank, size, report)
    for case, state in report.pop("states").items():
        torch.save(state, os.path.join(a.out, f"{case}.{rank}.pt"))
    with open(os.path.join(a.out, f"{rank}.json"), "w") as f:
        json.dump(report, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""One worker of the torch plugin's tests (started by `commsched launch`): trains the shared small model with
DistributedOptimizer for each optimizer given and saves its final parameters to OUT/<optimizer>.<rank>.pt."""
import argparse
import os

import torch
from torch import nn

import commsched.torch as hvd
import torch_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizers", default="sgd,adam")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="per worker")
    ap.add_argument("--out", required=True)
    ap.add_argument("--width", type=int, default=4, help="first layer width (tests give ranks different ones)")
    ap.add_argument("--width-rank", type=int, default=-1, help="only this rank uses --width")
    a = ap.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    width = a.width if a.width_rank in (-1, rank) else 4
    for kind in a.optimizers.split(","):
        model = make_model_for(rank, width)
        opt = torch_model.make_optimizer(kind, model.parameters())
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), model=model)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        deferred = 0
        for step in range(a.steps):
            x, y = torch_model.global_batch(step, a.batch * size)
            lo, hi = rank * a.batch, (rank + 1) * a.batch
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[lo:hi]), y[lo:hi])
            loss.backward()
            opt.step()
            deferred = max(deferred, opt.pending_updates)
        if opt.cross_iteration and deferred == 0:
            raise SystemExit("cross-iteration mode deferred no update")
        opt.flush()
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                   os.path.join(a.out, f"{kind}.{rank}.pt"))
    hvd.shutdown()


def make_model_for(rank, width):
    # Every worker builds the same model from the same seed; rank > 0 perturbs its copy so that
    # broadcast_parameters really has something to do.
    model = torch_model.make_model(width=width)
    if rank > 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * rank)
    return model


if __name__ == "__main__":
    main()

"""One worker of test_mixed_precision.py's plain GradScaler test: torch's own AMP recipe, scaler.step(optimizer) with
no synchronize() first, beside single-process training on the combined batch (every rank computes it). One step's
gradients overflow on rank 0 only: both sides skip it. Prints the largest difference from the reference."""
import copy

import torch
from torch import nn
import torch.nn.functional as F

import commsched.torch as hvd

STEPS, OVERFLOW_STEP = 5, 2


def data(step, rank):
    g = torch.Generator().manual_seed(10 * step + rank)
    x = torch.randn(16, 64, generator=g)
    if step == OVERFLOW_STEP and rank == 0:
        x[0, 0] = float("inf")
    return x, torch.randint(0, 3, (16,), generator=g)


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 3))
    ref = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    scaler, ref_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0), torch.amp.GradScaler("cpu", init_scale=1024.0)
    skipped = []
    for step in range(STEPS):
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(data(step, rank)[0]), data(step, rank)[1])).backward()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < scale:
            skipped.append(step)
        ref_opt.zero_grad()
        ref_scaler.scale(sum(F.cross_entropy(ref(data(step, r)[0]), data(step, r)[1]) for r in range(size)) /
                         size).backward()
        ref_scaler.step(ref_opt)
        ref_scaler.update()
    opt.flush()
    worst = max(float((p - q).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
    print(f"rank {rank}: skipped {skipped}, largest difference from single-process training {worst:.3g}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

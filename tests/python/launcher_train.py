"""One training script for every launcher (commsched launch, torchrun, mpirun, srun, Ray Train, the Kubernetes env
contracts): it sets no COMMSCHED_* variable and reads nothing of its launcher; commsched.torch.init() derives the
cluster. Trains a small model on a fixed global batch (each rank its slice), checks exact sums through the Horovod
and the BytePS names, and writes the final weights to OUT/model.RANK.pt.

Run as a script (`python launcher_train.py --out DIR`) or call train(out) from a Ray Train training function.
"""
import argparse
import os

import torch

import commsched.torch as bps  # BytePS's spelling; the Horovod names live in the same module

STEPS = 6
GLOBAL_BATCH = 24


def exact_sums():
    """Integer-valued sums are exact in float32 on every backend: they check the cluster's shape end to end."""
    n, r = bps.size(), bps.rank()
    total = bps.allreduce(torch.tensor([r + 1.0]), op=bps.Sum).item()
    mean = bps.push_pull(torch.tensor([2.0 * (r + 1)]), average=True, name="launcher.mean").item()
    assert total == n * (n + 1) / 2, f"rank {r}: sum {total}"
    assert mean == n + 1, f"rank {r}: push_pull mean {mean}"
    return total


def train(out):
    # Bitwise equal across launchers: torchrun and commsched launch give each worker one thread, mpirun and srun
    # leave torch's default, and a matmul's sums round differently with another thread count.
    torch.set_num_threads(1)
    bps.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    n, r = bps.size(), bps.rank()
    per_rank = GLOBAL_BATCH // n
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(GLOBAL_BATCH, 4, generator=gen)  # the same global batch everywhere; each rank takes its slice
        y = x.sum(1, keepdim=True)
        mine = slice(per_rank * r, per_rank * (r + 1))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
    total = exact_sums()
    torch.save(model.state_dict(), os.path.join(out, f"model.{r}.pt"))
    print(f"rank {r} of {n} local {bps.local_rank()}/{bps.local_size()} on {bps.context().backend}: sum {total}",
          flush=True)
    bps.shutdown()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    train(ap.parse_args().out)

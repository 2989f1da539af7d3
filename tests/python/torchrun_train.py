"""A Horovod-style training script as torchrun starts it: no COMMSCHED_* variable, only torchrun's contract.
Trains a small model with DistributedOptimizer and writes the final weights (rank, size, backend in the name)."""
import argparse
import os

import torch

import commsched.torch as hvd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    hvd.init()
    assert hvd.rank() == int(os.environ["RANK"]) and hvd.size() == int(os.environ["WORLD_SIZE"])
    assert hvd.local_rank() == int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(16, 4, generator=gen)  # the same global batch everywhere; each rank takes its half
        y = x.sum(1, keepdim=True)
        mine = slice(8 * hvd.rank(), 8 * hvd.rank() + 8)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
    torch.save(model.state_dict(), os.path.join(args.out, f"model.{hvd.rank()}.pt"))
    print(f"rank {hvd.rank()} of {hvd.size()} on {hvd.context().backend}: sum of ones {total.item()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

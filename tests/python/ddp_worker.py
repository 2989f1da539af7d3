"""DDP with the commsched comm hook against plain DDP (its own gloo all-reduce), in one process on the same data:
after --steps steps both models' parameters must agree within 1e-6. Runs under torchrun (torch.distributed from its
variables) or under `commsched launch` (torch.distributed through a file store, --store)."""
import argparse
import os

import torch
import torch.distributed as dist

import commsched.torch as hvd
import commsched.torch.ddp as cddp


def make_model():
    torch.manual_seed(0)
    # 1.2 M parameters: more than DDP's first bucket (1 MiB, whatever bucket_cap_mb says), so there are several.
    return torch.nn.Sequential(torch.nn.Linear(16, 768), torch.nn.ReLU(), torch.nn.Linear(768, 768), torch.nn.ReLU(),
                               torch.nn.Linear(768, 768), torch.nn.ReLU(), torch.nn.Linear(768, 4))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--store", default="")
    args = ap.parse_args()
    hvd.init()
    if args.store:
        dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=hvd.rank(), world_size=hvd.size())
    else:
        dist.init_process_group("gloo")
    # 1 MB buckets: the model has several, and the hook sees their order.
    plain = torch.nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=1)
    hooked = torch.nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=1)
    state = cddp.register(hooked)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (plain, hooked)]
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    for _ in range(args.steps):
        x = torch.randn(32, 16, generator=gen)
        y = torch.randn(32, 4, generator=gen)
        for m, o in zip((plain, hooked), opts):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
    worst = max(float((a - b).abs().max()) for a, b in zip(plain.parameters(), hooked.parameters()))
    moved = max(float((a - b).abs().max()) for a, b in zip(make_model().parameters(), hooked.parameters()))
    torch.save(hooked.module.state_dict(), os.path.join(args.out, f"hooked.{hvd.rank()}.pt"))
    print(f"rank {hvd.rank()}: max |plain - hooked| = {worst:.3g}, moved {moved:.3g}, "
          f"bucket priorities {sorted(state.priorities.items())}", flush=True)
    prios = [state.priorities[i] for i in sorted(state.priorities)]
    assert len(prios) > 1, f"one bucket only: {prios}"
    assert prios == sorted(prios, reverse=True), f"later buckets (earlier layers) must be more urgent: {prios}"
    assert moved > 1e-3, "the model did not train"
    assert worst <= 1e-6, f"parameters differ from plain DDP by {worst}"
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""One worker of test_mixed_precision.py: trains through DistributedOptimizer at its defaults (cross-iteration on) in
each mixed-precision mode this torch can run, and saves per mode the final parameters (OUT/<mode>.<rank>.pt), the
losses and, with GradScaler, which steps it skipped (OUT/<rank>.json; a mode this torch cannot run is listed under
"skipped" with the reason)."""
import argparse
import json
import os

import torch
from torch import nn
import torch.nn.functional as F

import commsched.torch as hvd

IN, HIDDEN, OUT, STEPS, BATCH = 8, 16, 4, 12, 8


def make_model(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, OUT)).to(dtype)


def data(step, rank, size, dtype):
    """A fixed learnable task (labels from a fixed linear map), each rank its own slice of the step's batch."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH * size, IN, generator=g)
    y = (x @ torch.randn(IN, OUT, generator=torch.Generator().manual_seed(99))).argmax(dim=1)
    lo, hi = rank * BATCH, (rank + 1) * BATCH
    return x[lo:hi].to(dtype), y[lo:hi]


OVERFLOW_STEP = 2  # rank 0 alone gets an inf input there: every rank must skip that step alike


def grad_scaler():
    """A CPU GradScaler (torch >= 2.3: torch.amp.GradScaler('cpu')), or None."""
    return torch.amp.GradScaler("cpu") if hasattr(torch.amp, "GradScaler") else None


def train_autocast(rank, size, report):
    scaler = grad_scaler()
    if scaler is None:
        report["notes"]["autocast"] = f"torch {torch.__version__} has no CPU GradScaler: autocast alone"
    model = make_model(torch.float32)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    losses, skipped = [], []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = data(step, rank, size, torch.float32)
        if scaler is not None and step == OVERFLOW_STEP and rank == 0:
            x[0, 0] = float("inf")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        losses.append(float(loss) if step != OVERFLOW_STEP else None)
        if scaler is None:
            loss.backward()
            opt.step()
            continue
        scaler.scale(loss).backward()
        # Horovod's pattern: the averaged gradients first, so every rank unscales (and finds inf in) the same ones.
        opt.synchronize()
        scaler.unscale_(opt)
        scale = scaler.get_scale()
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < scale:
            skipped.append(step)
    report["skipped_steps"] = skipped
    return model, losses


def train_plain(rank, size, dtype, compression):
    model = make_model(dtype)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=compression)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = data(step, rank, size, dtype)
        loss = F.cross_entropy(model(x).float(), y)
        losses.append(float(loss))
        loss.backward()
        opt.step()
    return model, losses


def fp16_unsupported():
    try:
        nn.Linear(2, 2).half()(torch.zeros(1, 2, dtype=torch.float16))
        return None
    except RuntimeError as e:
        return f"torch {torch.__version__} cannot run float16 layers on the CPU ({e})"


MODES = {
    "autocast": lambda r, s, rep: train_autocast(r, s, rep),
    "bf16_params": lambda r, s, rep: train_plain(r, s, torch.bfloat16, hvd.Compression.none),
    "fp16_params": lambda r, s, rep: train_plain(r, s, torch.float16, hvd.Compression.none),
    "fp16_compression": lambda r, s, rep: train_plain(r, s, torch.float32, hvd.Compression.fp16),
    "bf16_compression": lambda r, s, rep: train_plain(r, s, torch.float32, hvd.Compression.bf16),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    report = {"losses": {}, "skipped": {}, "notes": {}}
    for mode, run in MODES.items():
        reason = fp16_unsupported() if mode == "fp16_params" else None
        if reason:
            report["skipped"][mode] = reason
            continue
        model, report["losses"][mode] = run(rank, size, report)
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                   os.path.join(a.out, f"{mode}.{rank}.pt"))
    with open(os.path.join(a.out, f"{rank}.json"), "w") as f:
        json.dump(report, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()

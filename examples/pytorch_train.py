#!/usr/bin/env python3
"""Trains a small CNN on generated images with commsched.torch and reports its step time and loss.

    commsched launch -w 2 -s 1 -- python3 examples/pytorch_train.py --policy wfbp
    commsched launch -w 2 -s 1 --emulate-rate 1gbit -- python3 examples/pytorch_train.py --policy bytescheduler --cross-iteration

The data: every class is a fixed random 3x32x32 pattern; a sample is its class's pattern under heavy noise, so the
loss really falls within tens of steps. Each worker draws its own samples (seeded by rank). The model ends in a wide
fully connected layer (4 M parameters) whose gradient is produced first in backward but needed last in forward:
exactly the tensor priority scheduling lets the convolutions overtake.
Rank 0 prints the summary and, with --result, writes it as JSON.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

import commsched.torch as hvd
from commsched._C import mean_ci95  # (mean, 95% half-width): Student t, the engine's one table

CLASSES = 10


class SmallCNN(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 16 * 16, hidden)
        self.fc2 = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def make_batch(patterns, batch, generator):
    y = torch.randint(0, CLASSES, (batch,), generator=generator)
    x = patterns[y] + 2.0 * torch.randn(batch, 3, 32, 32, generator=generator)
    return x, y


def first_step_below(losses, target, window):
    """The number of steps after which the mean of the last `window` losses is first below `target`; None if never."""
    for n in range(window, len(losses) + 1):
        if sum(losses[n - window:n]) / window < target:
            return n
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", help="wfbp, bytescheduler, bsp, fusion, mgwfbp (default: COMMSCHED_POLICY)")
    ap.add_argument("--cross-iteration", action=argparse.BooleanOptionalAction, default=None,
                    help="apply updates in the next forward (overlap); the library default (on) unless given")
    ap.add_argument("--tune", action="store_true",
                    help="auto-tune partition size and credit first (COMMSCHED_TUNER_* apply); then run --steps more")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    ap.add_argument("--batch-size", type=int, default=16, help="per worker")
    ap.add_argument("--hidden", type=int, default=256, help="width of the wide fully connected layer")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--result", help="rank 0 writes the summary here (JSON)")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the loss fell by a third")
    ap.add_argument("--compression", default="none",
                    help="gradient compression: none, fp16, bf16, topk:RATIO, signsgd (the engine's stage)")
    ap.add_argument("--target-loss", type=float,
                    help="also report steps-to-loss: the first step whose running loss (mean over the workers and the "
                         "last --loss-window steps) is below this, and time-to-loss = those steps x the mean step time")
    ap.add_argument("--loss-window", type=int, default=5, help="steps in the running loss of --target-loss")
    a = ap.parse_args()
    if a.loss_window < 1:
        ap.error(f"--loss-window ({a.loss_window}) must be at least 1")
    if a.steps <= a.warmup:
        ap.error(f"--steps ({a.steps}) must exceed --warmup ({a.warmup})")

    torch.set_num_threads(a.threads)
    hvd.init(policy=a.policy, tune=True if a.tune else None)
    torch.manual_seed(0)
    patterns = torch.randn(CLASSES, 3, 32, 32)
    model = SmallCNN(a.hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr * hvd.size(), momentum=0.9)
    compression = hvd.Compression.topk(float(a.compression[5:])) if a.compression.startswith("topk:") else \
        getattr(hvd.Compression, a.compression)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), model=model,
                                         cross_iteration=a.cross_iteration, compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(1 + hvd.rank())

    ctx = hvd.context()
    losses, step_s = [], []
    tuning_steps = 0
    step = 0
    while len(step_s) < a.steps:
        if a.tune and not ctx.tuner_state()["finished"]:
            tuning_steps += 1
            if tuning_steps > 1000:
                raise SystemExit("the auto-tuner did not finish within 1000 steps")
            step_s.clear()  # time only the steps after tuning (the final knobs apply from the next step)
        start = time.perf_counter()
        x, y = make_batch(patterns, a.batch_size, generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        step_s.append(time.perf_counter() - start)
        losses.append(loss.item())
        if hvd.rank() == 0 and step % 10 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
        step += 1
    optimizer.flush()
    # Average the first and last few losses over every worker.
    first = hvd.allreduce(torch.tensor(sum(losses[:3]) / 3), name="loss.first").item()
    last = hvd.allreduce(torch.tensor(sum(losses[-3:]) / 3), name="loss.last").item()
    mean_s, ci_s = mean_ci95(step_s[a.warmup:])
    steps_to_loss, mean_losses = None, None
    if a.target_loss is not None:  # every worker's loss per step, averaged (one all-reduce after training)
        mean_losses = hvd.allreduce(torch.tensor(losses, dtype=torch.float64), name="loss.per_step").tolist()
        steps_to_loss = first_step_below(mean_losses, a.target_loss, a.loss_window)
    tuner = ctx.tuner_state()
    summary = {
        "policy": ctx.policy, "backend": ctx.backend, "compression": a.compression, "cross_iteration": optimizer.cross_iteration,
        "workers": hvd.size(), "batch_size": a.batch_size, "steps": a.steps, "warmup": a.warmup,
        "step_ms": mean_s * 1e3, "step_ms_ci95": ci_s * 1e3,
        "images_per_s": a.batch_size * hvd.size() / mean_s, "loss_first": first, "loss_last": last,
        "parameters": sum(p.numel() for p in model.parameters()),
        "knobs": dict(ctx.knobs()), "tuning_steps": tuning_steps, "tuner_trials": tuner["trials"],
        "target_loss": a.target_loss, "loss_window": a.loss_window, "loss_per_step": mean_losses,
        "steps_to_loss": steps_to_loss,
        "time_to_loss_s": None if steps_to_loss is None else steps_to_loss * mean_s,
    }
    if hvd.rank() == 0:
        print(f"{summary['policy']}{' + cross-iteration' if summary['cross_iteration'] else ''} on "
              f"{summary['backend']}, {hvd.size()} workers: {summary['step_ms']:.1f} ms/step "
              f"(95% CI ±{summary['step_ms_ci95']:.1f}), {summary['images_per_s']:.1f} img/s, "
              f"loss {first:.3f} -> {last:.3f}", flush=True)
        if a.target_loss is not None:
            print(f"steps to loss {a.target_loss}: " + ("not reached" if steps_to_loss is None else
                  f"{steps_to_loss} ({summary['time_to_loss_s']:.1f} s at the mean step time)"), flush=True)
        if a.result:
            with open(a.result, "w") as f:
                json.dump(summary, f, indent=1)
    hvd.shutdown()
    if a.check and not last < first * 2 / 3:
        raise SystemExit(f"the loss did not fall enough: {first:.3f} -> {last:.3f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Synthetic-data throughput of a torchvision model with commsched.torch (after Horovod's benchmark of the same name).

    commsched launch -w 4 -s 1 --emulate-rate 10gbit -- python3 examples/pytorch_synthetic_benchmark.py --policy wfbp
    commsched launch -w 4 -s 1 --emulate-rate 10gbit -- python3 examples/pytorch_synthetic_benchmark.py \\
        --policy bytescheduler --cross-iteration

Prints img/s per worker and in total, as the mean of --num-iters measurements with a 95% interval, after
--num-warmup-batches batches that are not timed.
"""
import argparse
import json
import math
import timeit

import torch
import torch.nn.functional as F
import torchvision.models

import commsched.torch as hvd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18", help="torchvision model name (resnet50, vgg16, ...)")
    ap.add_argument("--batch-size", type=int, default=16, help="per worker")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--num-warmup-batches", type=int, default=2)
    ap.add_argument("--num-batches-per-iter", type=int, default=3)
    ap.add_argument("--num-iters", type=int, default=5)
    ap.add_argument("--policy", help="wfbp, bytescheduler, bsp, fusion, mgwfbp (default: COMMSCHED_POLICY)")
    ap.add_argument("--cross-iteration", action=argparse.BooleanOptionalAction, default=None,
                    help="apply updates in the next forward (overlap); the library default (on) unless given")
    ap.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression on the wire")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--result", help="rank 0 writes the measurements and the configuration here as JSON")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    hvd.init(policy=a.policy)
    try:
        model = getattr(torchvision.models, a.model)()
    except AttributeError:
        ap.error(f"--model {a.model}: not a torchvision model")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    compression = hvd.Compression.fp16 if a.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), model=model,
                                         compression=compression, cross_iteration=a.cross_iteration)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(a.batch_size, 3, a.image_size, a.image_size)
    target = torch.randint(0, 1000, (a.batch_size,))

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    ctx = hvd.context()
    log(f"model {a.model}, batch {a.batch_size} per worker, {hvd.size()} workers, policy {ctx.policy}"
        f"{' + cross-iteration' if optimizer.cross_iteration else ''}, backend {ctx.backend}")
    timeit.timeit(benchmark_step, number=a.num_warmup_batches)
    rates = []
    for i in range(a.num_iters):
        t = timeit.timeit(benchmark_step, number=a.num_batches_per_iter)
        rate = a.batch_size * a.num_batches_per_iter / t
        log(f"iter #{i}: {rate:.1f} img/s per worker")
        rates.append(rate)
    optimizer.flush()
    mean = sum(rates) / len(rates)
    ci = 1.96 * math.sqrt(sum((r - mean) ** 2 for r in rates) / max(1, len(rates) - 1) / len(rates))
    log(f"img/s per worker: {mean:.1f} +- {ci:.1f} (95% interval)")
    log(f"total img/s on {hvd.size()} worker(s): {hvd.size() * mean:.1f} +- {hvd.size() * ci:.1f}")
    if a.result and hvd.rank() == 0:
        with open(a.result, "w") as f:
            json.dump({"model": a.model, "batch_size": a.batch_size, "image_size": a.image_size, "workers": hvd.size(),
                       "policy": ctx.policy, "cross_iteration": bool(optimizer.cross_iteration),
                       "backend": ctx.backend, "threads": a.threads, "num_batches_per_iter": a.num_batches_per_iter,
                       "rates_per_worker": rates, "img_s_per_worker": mean, "img_s_per_worker_ci95": ci,
                       "img_s_total": hvd.size() * mean, "img_s_total_ci95": hvd.size() * ci}, f, indent=1)
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""One worker of the DDP benchmark: an MLP of equal layers trained with DistributedDataParallel, its gradients
averaged by DDP's own gloo all-reduce (--mode plain) or by commsched through the comm hook (--mode hook; commsched's
backend from the cluster contract: Gloo without servers, the PS with them). Rank 0 writes the mean step time.

    ddp_bench.py --mode plain|hook --store FILE --result OUT.json [--layers 8 --width 1024 --batch 32 ...]
    ddp_bench.py --summarize RUNS.txt CONFIG...      # the table of bench/torch/netns_ddp_bench.sh
"""
import argparse
import json
import sys
import time

from commsched._C import mean_ci95  # the one Student t table (base/stats.h)


def train(a):
    import torch
    import torch.distributed as dist

    import commsched.torch as hvd
    import commsched.torch.ddp as cddp

    torch.set_num_threads(a.threads)
    hvd.init()
    dist.init_process_group("gloo", init_method=f"file://{a.store}", rank=hvd.rank(), world_size=hvd.size())
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=a.bucket_mb)
    if a.mode == "hook":
        cddp.register(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(a.batch, a.width)
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    dist.barrier()
    if hvd.rank() == 0:
        with open(a.result, "w") as f:
            json.dump({"mode": a.mode, "backend": hvd.context().backend, "workers": hvd.size(),
                       "step_s": sum(times) / len(times), "steps": len(times)}, f)
    dist.destroy_process_group()
    hvd.shutdown()


def summarize(path, configs):
    runs = {}
    for line in open(path):
        config, rep, value = line.split()
        runs.setdefault(config, {})[int(rep)] = None if value == "FAILED" else float(value)
    base = runs.get(configs[0], {})
    print(f"\n| configuration | step ms per run | mean step ms | 95% interval | paired speed-up vs {configs[0]} |")
    print("|---|---|---:|---:|---:|")
    for c in configs:
        r = runs.get(c, {})
        ok = [v for v in r.values() if v is not None]
        cells = ", ".join("FAILED" if r[k] is None else f"{1e3 * r[k]:.1f}" for k in sorted(r))
        if not ok:
            print(f"| {c} | {cells} | - | - | - |")
            continue
        m, ci = mean_ci95(ok)
        pairs = [base[k] / r[k] for k in r if r[k] and base.get(k)]
        pm, pci = mean_ci95(pairs) if pairs else (float("nan"), float("nan"))
        print(f"| {c} | {cells} | {1e3 * m:.1f} | ± {1e3 * ci:.1f} | {pm:.3f} ± {pci:.3f} |")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--summarize":
        return summarize(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("plain", "hook"), required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bucket-mb", type=float, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    train(ap.parse_args())


if __name__ == "__main__":
    main()

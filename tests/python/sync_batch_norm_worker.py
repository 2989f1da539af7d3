"""SyncBatchNorm on 2 ranks beyond the basic case (horovod_api_worker.py): unequal batch sizes, float16 inputs with
more than 65504 elements per channel (statistics in float32), and an input on another device than the default one
(as a CUDA input meets: the statistics must live on the input's device). Each is checked against torch's BatchNorm
over the whole batch in one process. Prints 'sync batch norm ok'."""
import torch

import commsched.torch as hvd


def check(name, cond, what=""):
    assert cond, f"rank {hvd.rank()}: {name}: {what}"


def main():
    hvd.init()
    me = hvd.rank()
    gen = torch.Generator().manual_seed(0)

    # Unequal batches: rank 0 has 3 samples, rank 1 has 7; two steps (running statistics, momentum=None).
    x = torch.randn(10, 4, 5, 5, generator=gen)
    lo, hi = (0, 3) if me == 0 else (3, 10)
    sbn, bn = hvd.SyncBatchNorm(4, momentum=None), torch.nn.BatchNorm2d(4, momentum=None)
    part, whole = x[lo:hi].clone().requires_grad_(), x.clone().requires_grad_()
    weights = torch.randn(10, 4, 5, 5, generator=gen)
    for _ in range(2):
        (sbn(part) * weights[lo:hi]).sum().backward()
        (bn(whole) * weights).sum().backward()
    check("unequal batches: output", torch.allclose(sbn(part), bn(whole)[lo:hi], atol=1e-5))
    check("unequal batches: input gradient", torch.allclose(part.grad, whole.grad[lo:hi], atol=1e-4))
    check("unequal batches: weight gradient",
          torch.allclose(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), bn.weight.grad, atol=1e-4))
    check("unequal batches: running statistics", torch.allclose(sbn.running_mean, bn.running_mean, atol=1e-6) and
          torch.allclose(sbn.running_var, bn.running_var, atol=1e-5))

    # float16, 4 x 100 x 100 = 40000 elements per channel on each rank: 80000 in all, past float16's 65504.
    half = (torch.randn(8, 2, 100, 100, generator=gen) * 3 + 5).half()
    sbn, bn = hvd.SyncBatchNorm(2), torch.nn.BatchNorm2d(2)
    out = sbn(half[4 * me:4 * me + 4])
    want = bn(half.float())[4 * me:4 * me + 4]
    check("float16: dtype", out.dtype == torch.float16, str(out.dtype))
    check("float16: output", torch.allclose(out.float(), want, atol=1e-2), f"{(out.float() - want).abs().max()}")
    check("float16: running statistics", torch.allclose(sbn.running_mean, bn.running_mean, atol=1e-3) and
          torch.allclose(sbn.running_var, bn.running_var, atol=1e-3), f"{sbn.running_var} vs {bn.running_var}")

    if hasattr(torch, "set_default_device"):  # torch >= 2.0
        sbn = hvd.SyncBatchNorm(3)
        x = torch.randn(4, 3, 5, generator=gen, requires_grad=True)
        torch.set_default_device("meta")
        try:
            y = sbn(x)
        finally:
            torch.set_default_device("cpu")
        y.sum().backward()
        check("another default device", y.device.type == "cpu" and x.grad is not None)
    print(f"rank {me}: sync batch norm ok", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""Gradients through Horovod's collectives on 2 ranks (horovod.torch's broadcast, allgather, alltoall,
reducescatter and grouped forms are autograd functions): each rank weights the outputs with numbers that say where
they came from, and checks its input's gradient against what the collective's math gives. Prints 'gradients ok'."""
import torch

import commsched.torch as hvd


def grad_of(make_loss, x):
    x = x.clone().requires_grad_()
    make_loss(x).backward()
    return x.grad


def check(name, got, want):
    assert got.shape == want.shape and torch.allclose(got, want), f"rank {hvd.rank()}: {name}: {got} != {want}"


def splits_of(r):
    return [1, 3] if r == 0 else [2, 2]


def main():
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    assert n == 2
    weight = [(r + 1.0) * torch.arange(1.0, 4.0) for r in range(n)]  # rank r's weights of a 3-element output
    x = torch.full((3,), me + 1.0)

    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        check(f"allreduce {op}", grad_of(lambda t: (hvd.allreduce(t, op=op) * weight[me]).sum(), x),
              sum(weight) * scale)
        got = grad_of(lambda t: (hvd.grouped_allreduce([t, 2 * t], op=op)[1] * weight[me]).sum(), x)
        check(f"grouped_allreduce {op}", got, 2 * sum(weight) * scale)
    # Only root 1's input reaches the outputs: it gets their gradients averaged (as Horovod), rank 0 zeros.
    got = grad_of(lambda t: (hvd.broadcast(t, root_rank=1) * weight[me]).sum(), x)
    check("broadcast", got, sum(weight) / n if me == 1 else torch.zeros(3))

    # allgather: rank r gives r + 1 rows; rank r weights the whole output by r + 1: averaged, 1.5 everywhere.
    rows = torch.ones(me + 1, 2)
    check("allgather", grad_of(lambda t: (hvd.allgather(t) * (me + 1)).sum(), rows), torch.full((me + 1, 2), 1.5))
    got = grad_of(lambda t: (hvd.grouped_allgather([t])[0] * (me + 1)).sum(), rows)
    check("grouped_allgather", got, torch.full((me + 1, 2), 1.5))

    # reducescatter of 5 rows: rank 0 keeps 3, rank 1 keeps 2; rank r weights its block by r + 1.
    block_weight = torch.tensor([1.0, 1.0, 1.0, 2.0, 2.0]).unsqueeze(1).expand(5, 2)
    five = torch.ones(5, 2)
    got = grad_of(lambda t: (hvd.reducescatter(t, op=hvd.Sum, prescale_factor=3.0) * (me + 1)).sum(), five)
    check("reducescatter", got, block_weight * 3.0)
    got = grad_of(lambda t: (hvd.grouped_reducescatter([t], op=hvd.Average)[0] * (me + 1)).sum(), five)
    check("grouped_reducescatter", got, block_weight / n)

    # alltoall: receiver j weights its k-th received row by 10 * j + k + 1; that gradient goes back to the sender.
    sent = torch.ones(4, 1)
    got = grad_of(lambda t: (hvd.alltoall(t, splits=splits_of(me))[0] *
                             (10 * me + torch.arange(1.0, 1.0 + sum(splits_of(r)[me] for r in range(n)))
                              ).unsqueeze(1)).sum(), sent)
    want = []
    for j in range(n):
        offset = sum(splits_of(r)[j] for r in range(me))
        want += [10 * j + offset + q + 1.0 for q in range(splits_of(me)[j])]
    check("alltoall", got, torch.tensor(want).unsqueeze(1))
    check("alltoall without splits",
          grad_of(lambda t: (hvd.alltoall(t) * (10 * me + torch.arange(1.0, 3.0))).sum(), torch.ones(2)),
          torch.tensor([1.0, 11.0]) + me)
    print(f"rank {me}: gradients ok", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

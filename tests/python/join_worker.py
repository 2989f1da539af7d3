"""Horovod's join on the parameter server, 3 ranks with uneven data: rank r runs r + 2 steps of an averaged
all-reduce, then joins. While a rank has joined it counts as zeros (the average still divides by the full size, as in
Horovod); join() returns the last rank on every rank; afterwards the same tensor name lines up on every rank again."""
import torch

import commsched.torch as hvd

hvd.init()
me, size = hvd.rank(), hvd.size()
assert size == 3
for step in range(me + 2):
    got = hvd.allreduce(torch.full((1000,), float(me + 1)), name="grad", op=hvd.Average)
    live = [r for r in range(size) if step < r + 2]  # ranks that have not joined yet at this step
    want = sum(r + 1 for r in live) / size
    assert torch.allclose(got, torch.full((1000,), want)), (me, step, got[:3], want)
last = hvd.join()
assert last == size - 1, (me, last)
after = hvd.allreduce(torch.full((10,), float(me)), name="grad", op=hvd.Sum)
assert torch.equal(after, torch.full((10,), 3.0)), (me, after)
print(f"rank {me}: join ok (last {last})", flush=True)
hvd.shutdown()

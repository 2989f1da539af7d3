"""A training script written for horovod.torch; only the import is changed. Uses the public Horovod API only:
init, size, rank, local_rank, local_size, DistributedOptimizer (fp16 compression, backward_passes_per_step,
synchronize + skip_synchronize for gradient clipping), broadcast_parameters, broadcast_optimizer_state, allreduce
(metric averaging, Sum), allreduce_async_ / poll / synchronize, broadcast."""
import torch
import torch.nn.functional as F
from torch import nn

import commsched.torch as hvd  # was: import horovod.torch as hvd

hvd.init()
torch.manual_seed(42 + hvd.rank())  # different initial weights: broadcast_parameters must fix that
torch.set_num_threads(1)
assert 0 <= hvd.local_rank() < hvd.local_size() and 0 <= hvd.rank() < hvd.size()

model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size(), momentum=0.5)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16, backward_passes_per_step=2, op=hvd.Average)

g = torch.Generator().manual_seed(hvd.rank())
x = torch.randn(256, 16, generator=g)
y = (x[:, 0] > 0).long()
first_loss = None
for epoch in range(15):
    optimizer.zero_grad()
    for xs, ys in ((x[:128], y[:128]), (x[128:], y[128:])):  # two backward passes per step
        loss = F.cross_entropy(model(xs), ys)
        loss.backward()
    if epoch % 2 == 0:
        optimizer.step()
    else:  # Horovod's recipe for gradient clipping
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with optimizer.skip_synchronize():
            optimizer.step()
    avg_loss = hvd.allreduce(loss.detach(), name="avg_loss").item()
    first_loss = first_loss if first_loss is not None else avg_loss

# Every worker holds the same weights after training.
for name, p in model.named_parameters():
    mean = hvd.allreduce(p.detach(), name=f"check.{name}")
    assert torch.allclose(mean, p.detach(), atol=1e-6), f"{name} differs across workers"

count = torch.ones(1)
handle = hvd.allreduce_async_(count, name="count", op=hvd.Sum)
while not hvd.poll(handle):
    pass
assert hvd.synchronize(handle).item() == hvd.size()
token = hvd.broadcast(torch.tensor([float(hvd.rank())]), root_rank=0, name="token")
assert token.item() == 0.0
assert avg_loss < first_loss, (first_loss, avg_loss)
if hvd.rank() == 0:
    print(f"horovod-style script: OK (loss {first_loss:.3f} -> {avg_loss:.3f}, {hvd.size()} workers)", flush=True)
hvd.shutdown()

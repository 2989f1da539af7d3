"""A few collectives and optimizer steps, traced with COMMSCHED_TIMELINE (set by the test)."""
import torch

import commsched.torch as hvd

hvd.init()
model = torch.nn.Linear(64, 64)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
hvd.allreduce(torch.ones(1000), name="aligned.probe")
hvd.shutdown()

"""Process sets on 3 ranks: the static set {0, 2} reduces and gathers without rank 1; rank 1 meanwhile works in
the dynamic set {1}; then every rank meets in the global set again. The set's members meet in the job's one store
(served for the global set at the root), under the set's keys."""
import torch

import commsched.torch as hvd
from commsched import _C
from commsched.torch import runtime

evens = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[evens])
me = hvd.rank()
assert hvd.size() == 3
mine = torch.tensor([float(me + 1)])
if evens.included():
    assert evens.rank() == me // 2 and evens.size() == 2
    assert hvd.allreduce(mine, op=hvd.Sum, process_set=evens).item() == 4.0  # 1 + 3, rank 1 not involved
    assert hvd.allgather(mine, process_set=evens).tolist() == [1.0, 3.0]
    assert hvd.broadcast(mine, root_rank=2, process_set=evens).item() == 3.0
    assert hvd.allreduce(mine, op=hvd.Max, process_set=evens).item() == 3.0
    hvd.barrier(process_set=evens)
    job = runtime.context()
    store = _C.StoreClient(job.root_addr, job.root_port, 10.0)
    hosts = [store.get(f"pset/{evens.process_set_id}/host/{r}", 5.0) for r in range(2)]
    assert all(h for h in hosts), hosts  # both members published their host in the job's store
    try:
        hvd.broadcast(mine, root_rank=1, process_set=evens)
        raise AssertionError("a root outside the set must be refused")
    except ValueError as e:
        assert "not a rank of the process set" in str(e), e
else:
    assert evens.rank() == -1
alone = hvd.add_process_set([1])  # collective: every rank registers it
if alone.included():
    assert hvd.allreduce(mine, op=hvd.Sum, process_set=alone).item() == 2.0
assert hvd.allreduce(mine, op=hvd.Sum).item() == 6.0
assert hvd.remove_process_set(alone)
print(f"rank {me}: process sets ok", flush=True)
hvd.shutdown()

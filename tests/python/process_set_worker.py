"""Process sets on 3 ranks: the static set {0, 2} reduces and gathers without rank 1; rank 1 meanwhile works in
the dynamic set {1}; then every rank meets in the global set again."""
import torch

import commsched.torch as hvd

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

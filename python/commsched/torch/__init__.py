"""commsched.torch: Horovod-compatible PyTorch API over the commsched scheduler.

    import commsched.torch as hvd          # instead of: import horovod.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Policy, partition size, credit and backend come from the environment (COMMSCHED_POLICY, COMMSCHED_PARTITION_BYTES,
COMMSCHED_CREDIT_BYTES, COMMSCHED_BACKEND, ...) or from init(policy=..., partition_bytes=...), so one script runs
the baseline and the scheduler. Run several workers with `commsched launch -w 4 -s 1 -- python3 train.py`.
"""
from commsched.torch.compression import Compression
from commsched.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from commsched.torch.ops import (Adasum, Average, Sum, allreduce, allreduce_, allreduce_async, allreduce_async_,
                                 broadcast, broadcast_, broadcast_async, broadcast_async_, poll, push_pull,
                                 push_pull_async, push_pull_async_inplace, push_pull_inplace, synchronize)
from commsched.torch.optimizer import DistributedOptimizer
from commsched.torch.runtime import (NotInitializedError, context, init, is_initialized, local_rank, local_size, rank,
                                     shutdown, size)


def mpi_threads_supported():
    """Horovod compatibility: commsched does not use MPI."""
    return False


def mpi_enabled():
    return False

"""commsched.torch: Horovod-compatible PyTorch API over the commsched scheduler.

    import commsched.torch as hvd          # instead of: import horovod.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Policy, partition size, credit and backend come from the environment (COMMSCHED_POLICY, COMMSCHED_PARTITION_BYTES,
COMMSCHED_CREDIT_BYTES, COMMSCHED_BACKEND, ...) or from init(policy=..., partition_bytes=...), so one script runs
the baseline and the scheduler. Run several workers with `commsched launch -w 4 -s 1 -- python3 train.py`, or with
`torchrun --nproc_per_node 4 train.py` (Gloo all-reduce, no servers). DistributedDataParallel users:
commsched.torch.ddp.register(model).
"""
# torch first: commsched._C links the NCCL it was built with, and once that is loaded a CUDA build of torch that
# needs a newer NCCL (its wheel brings its own libnccl.so.2) fails to import ("undefined symbol: ncclCommResume");
# with torch loaded first, both use torch's NCCL.
import torch  # noqa: F401  isort: skip

from commsched import _C, _build_queries
from commsched._build_queries import (ccl_built, cuda_built, ddl_built, gloo_built, mpi_built,  # noqa: F401
                                      mpi_enabled, mpi_threads_supported, nccl_built, rocm_built)
from commsched.torch import elastic
from commsched.torch.collectives import (alltoall, alltoall_async, allgather, allgather_async, barrier,
                                         grouped_allgather, grouped_allgather_async, grouped_allreduce,
                                         grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                                         grouped_reducescatter, grouped_reducescatter_async, join, reducescatter,
                                         reducescatter_async, sparse_allreduce_async)
from commsched.torch.compression import Compression
from commsched.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                       broadcast_parameters)
from commsched.torch.ops import (Adasum, Average, Max, Min, Product, Sum, allreduce, allreduce_, allreduce_async,
                                 allreduce_async_, broadcast, broadcast_, broadcast_async, broadcast_async_, poll,
                                 push_pull, push_pull_async, push_pull_async_inplace, push_pull_inplace, synchronize)
from commsched.torch.optimizer import DistributedOptimizer
from commsched.torch.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from commsched.torch.runtime import (HorovodInternalError, NotInitializedError, context, cross_rank, cross_size, init,
                                     is_homogeneous, is_initialized, local_rank, local_size, rank, shutdown, size)
from commsched.torch.sync_batch_norm import SyncBatchNorm


def stragglers():
    """The ranks that hold the others back, most seconds behind first: a list of dicts with rank, iterations_behind
    (behind the furthest rank) and seconds_behind (since the first other rank passed the iteration it is at), each
    rank's last lag heard in the past 3 s (with synchronous training a straggler has caught up by the time the
    others' step returns). On the parameter server every server reports what it sees each heartbeat; on Gloo rank
    0's order negotiation does. Lags under 20 ms are not reported (the ordinary spread of an iteration)."""
    return context().stragglers()


def start_timeline(file_path, mark_cycles=False):
    """Writes this rank's trace to file_path with the rank in the name ('t.json' -> 't.rank0.json'; '{rank}' is
    replaced where present) from now on; `commsched trace-merge` joins the ranks' files. mark_cycles is ignored
    (iteration boundaries are always marked)."""
    del mark_cycles
    context()
    if _C.start_timeline(str(file_path)) == 0:
        raise RuntimeError("start_timeline: this engine has no timeline (it was built with timeline='')")


def stop_timeline():
    """Finishes the trace file (valid JSON); later events are not recorded until start_timeline()."""
    context()
    _C.stop_timeline()


# Horovod's build queries are commsched._build_queries'; gloo_enabled: what this process's backend uses.
def gloo_enabled():
    return _build_queries.backend_is("gloo", is_initialized, context)

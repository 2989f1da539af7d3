"""commsched.tensorflow.keras: the same module as commsched.keras (Horovod's horovod.tensorflow.keras)."""
from commsched.keras import *  # noqa: F401,F403
from commsched.keras import (DistributedOptimizer, PartialDistributedOptimizer, allgather, allreduce,  # noqa: F401
                             broadcast, SyncBatchNormalization, broadcast_global_variables, callbacks, elastic,
                             load_model, reducescatter)

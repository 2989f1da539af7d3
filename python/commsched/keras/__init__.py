"""commsched.keras: Horovod's Keras API for Keras 3 on the TensorFlow backend, over the commsched scheduler.

    import commsched.keras as hvd               # or commsched.tensorflow.keras; instead of horovod.keras
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(loss=..., optimizer=opt, jit_compile=False)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()], verbose=1 if hvd.rank() == 0 else 0)

jit_compile=False: the operations are host callbacks, which XLA cannot compile (Keras turns XLA on by default only
where a GPU is present).
"""
import keras as _keras

from commsched.keras import callbacks, elastic
from commsched.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer
from commsched.tensorflow import (Average, Compression, HorovodInternalError, Max, Min, NotInitializedError,
                                  ProcessSet, Sum, add_process_set, broadcast_global_variables, ccl_built,
                                  cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
                                  gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
                                  local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                  remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)
from commsched.tensorflow import allgather as _allgather
from commsched.tensorflow import allreduce as _allreduce
from commsched.tensorflow import broadcast as _broadcast
from commsched.tensorflow import reducescatter as _reducescatter
from commsched.tensorflow.sync_batch_norm import SyncBatchNormalization

if not _keras.__version__.startswith("3."):
    raise ImportError(f"commsched.keras needs Keras 3 (this is Keras {_keras.__version__})")


def allreduce(value, name=None, average=True, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """The average (or sum, min, max) of `value` over every worker, as a tensor."""
    return _allreduce(value, average=None if op is not None else average, name=name, op=op,
                      compression=compression, prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def allgather(value, name=None):
    return _allgather(value, name=name)


def broadcast(value, root_rank, name=None):
    return _broadcast(value, root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """This rank's rows of the average (or sum) of `value` over every worker (commsched.tensorflow.reducescatter)."""
    return _reducescatter(value, name=name, op=op)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """keras.models.load_model, with the model's optimizer wrapped in DistributedOptimizer."""
    del custom_optimizers
    model = _keras.models.load_model(filepath, custom_objects=custom_objects)
    if getattr(model, "optimizer", None) is not None:
        DistributedOptimizer(model.optimizer, compression=compression)
    return model

"""commsched.tensorflow: Horovod's TensorFlow 2 API over the commsched scheduler.

    import commsched.tensorflow as hvd          # instead of: import horovod.tensorflow as hvd
    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer.variables, root_rank=0)

Policy, partition size, credit and backend come from the environment (COMMSCHED_POLICY, ...) or from
init(policy=..., partition_bytes=...), as for commsched.torch. Sums and broadcasts run as native TensorFlow ops
(an asynchronous kernel per task, built against the installed TensorFlow: native.py), the other collectives as host
callbacks (tf.numpy_function); all work in eager mode and inside tf.function (not under XLA: compile with
jit_compile=False). Keras: commsched.keras (or commsched.tensorflow.keras).
"""
import tensorflow as tf

from commsched import _C, _build_queries, _elastic
from commsched._build_queries import (ccl_built, cuda_built, ddl_built, gloo_built, mpi_built,  # noqa: F401
                                      mpi_enabled, mpi_threads_supported, nccl_built, rocm_built)
from commsched import _runtime_core as _core
from commsched.tensorflow import elastic
from commsched.tensorflow import gradients as _gradients
from commsched.tensorflow import native as _native
from commsched.tensorflow import ops as _ops
from commsched.tensorflow.compression import Compression
from commsched.tensorflow.gradients import DistributedGradientTape, PartialDistributedGradientTape
from commsched.tensorflow.ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_object,
                                      allreduce, alltoall, broadcast, broadcast_, broadcast_object,
                                      broadcast_object_fn, broadcast_variables, global_process_set,
                                      grouped_allgather, grouped_allreduce, grouped_reducescatter, join,
                                      reducescatter)

HorovodInternalError = _core.HorovodInternalError
NotInitializedError = _core.NotInitializedError
_CALLER = "commsched.tensorflow"
_init_args = None  # init()'s arguments, for the Context of an elastic job's next generation


def init(policy=None, backend=None, comm=None, tune=None, process_sets=None, **options):
    """Connects this process to the cluster described by the environment (see README, Configuration). Keywords are
    the option registry's names (`commsched options`); `comm` is accepted for Horovod compatibility and ignored.
    Calling init() twice is harmless. In an elastic job (`commsched launch --min-workers`) a joiner waits here until
    the job lets it in (see commsched.tensorflow.elastic)."""
    del comm
    if process_sets:
        raise ValueError("commsched.tensorflow runs on the global process set only (process_sets= is for "
                         "commsched.torch)")

    def prepare():
        global _init_args
        _init_args = dict(policy=policy, backend=backend, tune=tune, **options)
        _elastic.start()  # an elastic job's worker: its rank in the current membership (a joiner waits for one)

    if _core.init(_CALLER, policy=policy, backend=backend, tune=tune, prepare=prepare, **options):
        _bind(_core.context(_CALLER))
        _core.on_shutdown(_unbind)


def _bind(ctx):
    """Points the operations at a new Context: the native ops, the size an average divides by, the model's sizes
    (the tuner's key) when a step has told them to an earlier Context."""
    _native.bind(ctx)
    _ops.set_group(rank=ctx.rank, size=ctx.size, local_rank=ctx.local_rank, local_size=ctx.local_size)
    _gradients.tell_model(ctx)


def _unbind():
    """The Context goes: the native ops let go of it, and results of its operations that were never waited for are
    dropped (their tasks end cancelled)."""
    _native.unbind()
    _ops.forget_pending()


def restart_for_membership():
    """An elastic job re-formed: the Context of the new generation (its ranks and rendezvous are in the environment,
    set by commsched._elastic), made with init()'s arguments. Operations already traced into a tf.function use it
    from their next run on."""
    shutdown()
    init(**dict(_init_args or {}))


def shutdown():
    _core.shutdown()


def is_initialized():
    return _core.is_initialized()


def context():
    """The commsched._C.Context (policy, knobs, tuner_state(), ...); raises NotInitializedError before init()."""
    return _core.context(_CALLER)


def size():
    return _core.context(_CALLER).size


def rank():
    return _core.context(_CALLER).rank


def stragglers():
    """The ranks that lag, as commsched.torch.stragglers() describes: dicts of rank, iterations_behind and
    seconds_behind, most seconds behind first."""
    return _core.context(_CALLER).stragglers()


def local_rank():
    return _core.context(_CALLER).local_rank


def local_size():
    return _core.context(_CALLER).local_size


def cross_size():
    ctx = _core.context(_CALLER)
    return max(1, ctx.size // max(1, ctx.local_size))


def cross_rank():
    ctx = _core.context(_CALLER)
    return ctx.rank // max(1, ctx.local_size)


def is_homogeneous():
    ctx = _core.context(_CALLER)
    return ctx.size % max(1, ctx.local_size) == 0


# Horovod's *_op: the values as int32 tensors, read when they run (inside a tf.function traced before an elastic job
# re-formed too).
def rank_op(name=None):
    return tf.identity(_ops.group_value("rank", tf.int32), name=name)


def local_rank_op(name=None):
    return tf.identity(_ops.group_value("local_rank", tf.int32), name=name)


def size_op(process_set_id=0, name=None):
    _check_process_set_id(process_set_id)
    return tf.identity(_ops.group_value("size", tf.int32), name=name)


def local_size_op(name=None):
    return tf.identity(_ops.group_value("local_size", tf.int32), name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1: this process belongs to the process set (every process belongs to the global one, id 0)."""
    _check_process_set_id(process_set_id)
    return tf.constant(1, tf.int32, name=name)


_GLOBAL_ONLY = ("commsched.tensorflow runs on the global process set only (global_process_set, id 0); process "
                "sets are in commsched.torch")


def _check_process_set_id(process_set_id):
    if process_set_id != 0:
        raise ValueError(f"process_set_id={process_set_id}: {_GLOBAL_ONLY}")


class ProcessSet:
    """Horovod's process sets: not in commsched.tensorflow (raises, saying so)."""

    def __init__(self, ranks_or_comm=None):
        raise NotImplementedError(f"ProcessSet({ranks_or_comm!r}): {_GLOBAL_ONLY}")


def add_process_set(process_set):
    raise NotImplementedError(f"add_process_set({process_set!r}): {_GLOBAL_ONLY}")


def remove_process_set(process_set):
    raise NotImplementedError(f"remove_process_set({process_set!r}): {_GLOBAL_ONLY}")


def broadcast_global_variables(root_rank):
    """TensorFlow 1's (graph collections of global variables, which TensorFlow 2 and Keras 3 do not have)."""
    raise NotImplementedError("broadcast_global_variables is TensorFlow 1's; with TensorFlow 2 call "
                              f"broadcast_variables(model.variables, root_rank={root_rank}) (and the optimizer's "
                              "variables after its first step), or with Keras "
                              "callbacks.BroadcastGlobalVariablesCallback(root_rank)")


class BroadcastGlobalVariablesHook:
    """TensorFlow 1's SessionRunHook (tf.estimator, gone from TensorFlow 2.16): raises, saying what to use."""

    def __init__(self, root_rank, device=""):
        del device
        broadcast_global_variables(root_rank)


def __getattr__(name):
    """SyncBatchNormalization on first use: it is a Keras 3 layer, and importing Keras is left to those who use it."""
    if name == "SyncBatchNormalization":
        from commsched.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module 'commsched.tensorflow' has no attribute '{name}'")


def DistributedOptimizer(optimizer, *args, **kwargs):
    """A Keras optimizer whose gradients are averaged over every worker: see commsched.keras.DistributedOptimizer."""
    from commsched.keras import DistributedOptimizer as keras_optimizer
    return keras_optimizer(optimizer, *args, **kwargs)


def start_timeline(file_path, mark_cycles=False):
    """Writes this rank's trace to file_path with the rank in the name from now on."""
    del mark_cycles
    _core.context(_CALLER)
    if _C.start_timeline(str(file_path)) == 0:
        raise RuntimeError("start_timeline: this engine has no timeline (it was built with timeline='')")


def stop_timeline():
    _core.context(_CALLER)
    _C.stop_timeline()


# Horovod's build queries are commsched._build_queries'; gloo_enabled: what this process's backend uses.
def gloo_enabled():
    return _build_queries.backend_is("gloo", is_initialized, lambda: _core.context(_CALLER))

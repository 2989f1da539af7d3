"""The torch side of the Horovod-style API's runtime: init() with torch's extras (an elastic job's membership,
process sets), the ranks, and submission of torch tensors (CPU and CUDA). The Context, init() keywords, waiting and
error messages that name tensors are commsched._runtime_core's, shared with TensorFlow and Keras.
"""
import torch

from commsched import _C, _elastic
from commsched import _runtime_core as core
from commsched._runtime_core import (  # noqa: F401  (the torch API's names for the shared runtime)
    HorovodInternalError, NotInitializedError, cross_iteration_default, is_initialized, on_shutdown, shutdown, wait)

_CALLER = "commsched.torch"
_init_args = None           # init()'s arguments, for the Context of an elastic job's next generation

_DTYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int32: "i32", torch.int64: "i64",
}


def init(policy=None, backend=None, comm=None, tune=None, process_sets=None, **options):
    """Connects this process to the cluster described by the environment (see README, Configuration).

    Keywords are the option registry's names (`commsched options`, the README's options table) and override the
    COMMSCHED_* variables: policy, backend, the engine's (partition_bytes="1MiB", credit_bytes="unlimited", ...), the
    tuner's (trials=8, ...), the parameter server's (chunk_bytes="1MiB", ...) and the collective's; an unknown keyword
    is an error naming the allowed ones. tune=True turns the online auto-tuner on (default: COMMSCHED_TUNE).
    `comm` is accepted for Horovod compatibility and ignored. process_sets: Horovod's static process sets (a list of
    ProcessSet), set up here on every rank. Calling init() twice is harmless.
    """
    del comm
    notice = _C.scheduler_role_notice()
    if notice:  # a BytePS job file's scheduler process: commsched has none to run
        print(notice, flush=True)
        raise SystemExit(0)

    def prepare():
        global _init_args
        _init_args = dict(policy=policy, backend=backend, tune=tune, **options)
        _elastic.start()  # an elastic job's worker: its rank in the current membership (a joiner waits for one)

    if core.init(_CALLER, policy=policy, backend=backend, tune=tune, prepare=prepare, **options):
        from commsched.torch import process_sets as _ps  # the sets need the global context
        _ps.setup(process_sets)


def restart_for_membership():
    """An elastic job re-formed: the Context of the new generation (its ranks and rendezvous are in the environment,
    set by commsched._elastic), made with init()'s arguments. Only the global process set survives."""
    shutdown()
    init(**dict(_init_args or {}))


def context():
    """The default Context; raises NotInitializedError before init()."""
    return core.context(_CALLER)


def size():
    return context().size


def rank():
    return context().rank


def local_rank():
    return context().local_rank


def local_size():
    return context().local_size


# Workers get consecutive ranks host by host (commsched launch, torchrun), local_size per host: the host index is
# Horovod's cross_rank and the number of hosts its cross_size.
def cross_size():
    ctx = context()
    return max(1, ctx.size // max(1, ctx.local_size))


def cross_rank():
    ctx = context()
    return ctx.rank // max(1, ctx.local_size)


def is_homogeneous():
    """Whether every host runs the same number of workers (true when size is a multiple of local_size)."""
    ctx = context()
    return ctx.size % max(1, ctx.local_size) == 0


def dtype_name(tensor, name):
    try:
        return _DTYPES[tensor.dtype]
    except KeyError:
        raise ValueError(f"tensor '{name}': dtype {tensor.dtype} is not supported (supported: "
                         f"{', '.join(str(d) for d in _DTYPES)})") from None


# The ready event of each CUDA task by name. A name is in flight at most once (the engine refuses a duplicate), so the
# previous event of a name is done with when the name comes again: one event per tensor, alive while its copy needs it.
_ready_events = {}


def cuda_ready_event(tensor, name, ctx):
    """Where the engine stages CUDA tensors through host memory, records an event on the producer's stream (PyTorch's
    current stream) and returns its cudaEvent_t address: the device-to-host copy waits for it on the device, so the
    gradient is complete and the Python thread never blocks. Elsewhere (NCCL) the backend's stream does not wait for
    PyTorch's, so the producer's stream is synced first (returns 0). The result comes back before the task completes,
    so the optimizer, which waits for the task, reads it."""
    stream = torch.cuda.current_stream(tensor.device)
    if not ctx.stages_device_copies:
        stream.synchronize()
        return 0
    event = torch.cuda.Event()
    event.record(stream)
    _ready_events[name] = event
    return int(event.cuda_event)


def submit(tensor, name, op, priority=0, root=0, ctx=None, compression=None):
    """Queues one task over a contiguous tensor's memory (no copy). `op`: 'reduce' (the backend's sum), 'broadcast'.
    ctx: the Context to use (a process set's); default: the global one. `compression`: the engine's scheme for this
    task ('fp16', 'bf16', 'topk:0.01', 'signsgd', 'none'); None: the run's default (COMMSCHED_COMPRESSION).

    The caller keeps `tensor` alive until the returned handle has completed.
    """
    ctx = ctx or context()
    if not tensor.is_contiguous():
        raise ValueError(f"tensor '{name}' is not contiguous")
    dtype = dtype_name(tensor, name)
    device = "cpu"
    device_index = 0
    ready_event = 0
    if tensor.is_cuda:
        device, device_index = "cuda", tensor.device.index or 0
        ready_event = cuda_ready_event(tensor, name, ctx)
    elif tensor.device.type != "cpu":
        raise ValueError(f"tensor '{name}' is on {tensor.device}; commsched carries CPU and CUDA tensors")
    core.name_task(name)
    return ctx.submit(name, int(priority), op, dtype, tensor.data_ptr(), tensor.numel(), device, device_index,
                      int(root), compression, ready_event)


def release_outside_backward(ctx=None):
    """Releases held tasks outside a backward (core.release_outside_backward); ctx: default, the global Context."""
    core.release_outside_backward(ctx or context())

"""The default Context of the Horovod-style API, tensor submission and error messages that name tensors.

The C++ engine completes tasks on its own thread and only fills a C++ handle; everything here runs on Python threads
and waits with the GIL released (``Handle.wait`` in small slices, so Ctrl-C still works).
"""
import atexit
import os
import re
import threading

import torch

from commsched import _C, _elastic
from commsched._runtime_core import env_flag  # noqa: F401  (one parser of 0/1 flags for both frameworks)

_lock = threading.Lock()
_ctx = None
_init_args = None           # init()'s arguments, for the Context of an elastic job's next generation
_names_by_key = {}
_WAIT_SLICE_S = 0.2

_DTYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int32: "i32", torch.int64: "i64",
}


class NotInitializedError(ValueError):
    """An API call before commsched.torch.init() (or after shutdown())."""


class HorovodInternalError(RuntimeError):
    """A collective failed inside commsched (a peer died or hung, the backend refused a tensor, ...); Horovod's name,
    so `except hvd.HorovodInternalError` in existing scripts catches it. The message names the tensor and the cause."""


_shutdown_hooks = []


def _registry_option(keyword):
    """The option registry's row for an init() keyword (a name or alias; dashes read as underscores)."""
    key = keyword.lower().replace("-", "_")
    for info in _C.options():
        if key == info["name"] or key in info["aliases"]:
            return info
    raise ValueError(f"commsched.torch.init(): unknown option '{keyword}' (allowed: "
                     f"{', '.join(i['name'] for i in _C.options())}; see `commsched options`)")


def _split_options(options):
    """Engine options go to the Context; the others (tuner, ps, collective) are read from the environment by their
    layer while the Context connects, so a keyword sets its variable for this process."""
    engine = {}
    for keyword, value in options.items():
        info = _registry_option(keyword)
        if info["group"] == "engine":
            engine[info["name"]] = str(value)
        elif info["group"] == "context":
            raise ValueError(f"commsched.torch.init(): pass '{info['name']}' as init({info['name']}=...)")
        else:
            os.environ[info["env"]] = str(value)
    return engine


def init(policy=None, backend=None, comm=None, tune=None, process_sets=None, **options):
    """Connects this process to the cluster described by the environment (see README, Configuration).

    Keywords are the option registry's names (`commsched options`, the README's options table) and override the
    COMMSCHED_* variables: policy, backend, the engine's (partition_bytes="1MiB", credit_bytes="unlimited", ...), the
    tuner's (trials=8, ...), the parameter server's (chunk_bytes="1MiB", ...) and the collective's; an unknown keyword
    is an error naming the allowed ones. tune=True turns the online auto-tuner on (default: COMMSCHED_TUNE).
    `comm` is accepted for Horovod compatibility and ignored. process_sets: Horovod's static process sets (a list of
    ProcessSet), set up here on every rank. Calling init() twice is harmless.
    """
    global _ctx, _init_args
    del comm
    notice = _C.scheduler_role_notice()
    if notice:  # a BytePS job file's scheduler process: commsched has none to run
        print(notice, flush=True)
        raise SystemExit(0)
    with _lock:
        if _ctx is not None:
            return
        _init_args = dict(policy=policy, backend=backend, tune=tune, **options)
        _elastic.start()  # an elastic job's worker: its rank in the current membership (a joiner waits for one)
        engine = _split_options(options)
        if policy is not None:
            engine["policy"] = str(policy)
        if "timeline" not in engine and not os.environ.get(_registry_option("timeline")["env"]):
            # No trace file until start_timeline() (Horovod's API starts one at any time).
            engine["timeline"] = _C.TIMELINE_DEFERRED
        _ctx = _C.Context(engine=engine, backend=backend or "", tune=tune)
    atexit.register(shutdown)
    from commsched.torch import process_sets as _ps  # the sets need the global context
    _ps.setup(process_sets)


def restart_for_membership():
    """An elastic job re-formed: the Context of the new generation (its ranks and rendezvous are in the environment,
    set by commsched._elastic), made with init()'s arguments. Only the global process set survives."""
    shutdown()
    args = dict(_init_args or {})
    init(**args)


def shutdown():
    """Stops the engine and the backend; tasks still pending fail with 'cancelled'. Idempotent."""
    global _ctx
    for hook in list(_shutdown_hooks):
        hook()
    with _lock:
        ctx, _ctx = _ctx, None
    if ctx is not None:
        ctx.shutdown()


def is_initialized():
    return _ctx is not None


def context():
    """The default Context; raises NotInitializedError before init()."""
    ctx = _ctx
    if ctx is None:
        raise NotInitializedError("commsched.torch has not been initialized: call commsched.torch.init() first "
                                  "(import commsched.torch as hvd; hvd.init())")
    return ctx


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
    _names_by_key.setdefault(_C.task_key(name), name)
    return ctx.submit(name, int(priority), op, dtype, tensor.data_ptr(), tensor.numel(), device, device_index,
                      int(root), compression, ready_event)


# Policies that hold tasks until the end of backward (Engine::backward_done), from the policy registry. Tasks of the
# eager API (broadcast_parameters, metric allreduce, ...) are not part of a backward, so they are released at once
# with Engine::flush, which neither ends an iteration nor lets MG-WFBP learn its merge plan from them (it did, when
# this called backward_done: a plan learned from broadcasts that all arrive at once merges everything, like BSP).
_HOLDING_POLICIES = frozenset(p["name"] for p in _C.policies() if p["holds_tasks"])


def release_outside_backward(ctx=None):
    ctx = ctx or context()
    if ctx.policy in _HOLDING_POLICIES:
        ctx.flush()


_KEY_RE = re.compile(r"key (\d+)")


def describe_error(message):
    """Adds the tensor name beside every wire key the message mentions ('key 123' -> "key 123 (tensor 'fc.weight')")."""
    def name_it(m):
        name = _names_by_key.get(int(m.group(1)))
        return m.group(0) + (f" (tensor '{name}')" if name else "")
    return _KEY_RE.sub(name_it, message)


def wait(handle, name):
    """Waits for a handle; raises RuntimeError naming the tensor when its task failed."""
    while not handle.wait(_WAIT_SLICE_S):
        pass
    err = handle.error
    if err is not None:
        raise HorovodInternalError(f"commsched: communication of '{name}' failed ({handle.code}): "
                                   f"{describe_error(err)}")



"""The framework-neutral half of a framework plugin: the process's Context, init() keywords, waiting on handles and
error messages that name tensors, and task submission over host (numpy) memory.

commsched.torch, commsched.tensorflow and commsched.keras build on it; commsched.torch.runtime adds only what needs
torch (tensor submission, CUDA ready events) and torch's init() extras (an elastic job's membership, process sets).

The C++ engine completes tasks on its own thread and only fills a C++ handle; everything here runs on Python threads
and waits with the GIL released (``Handle.wait`` in small slices, so Ctrl-C still works).
"""
import atexit
import collections
import itertools
import os
import re
import threading

import numpy as np

from commsched import _C

_lock = threading.Lock()
_ctx = None
_framework = None           # the plugin that called init(), for error messages ("commsched.tensorflow")
_names_by_key = {}
_noname_counts = collections.defaultdict(itertools.count)  # counted afresh in every Context (noname_index)
_WAIT_SLICE_S = 0.2
_shutdown_hooks = []        # run before the Context goes (native ops let go of it)

# numpy dtype name -> the engine's dtype. bfloat16 arrays come from TensorFlow (its own numpy type, named 'bfloat16').
_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32", "int64": "i64"}


class NotInitializedError(ValueError):
    """An API call before init() (or after shutdown())."""


class HorovodInternalError(RuntimeError):
    """A collective failed inside commsched (a peer died or hung, the backend refused a tensor, ...); Horovod's name,
    so `except hvd.HorovodInternalError` in existing scripts catches it. The message names the tensor and the cause."""


def _registry_option(keyword, caller):
    """The option registry's row for an init() keyword (a name or alias; dashes read as underscores)."""
    key = keyword.lower().replace("-", "_")
    for info in _C.options():
        if key == info["name"] or key in info["aliases"]:
            return info
    raise ValueError(f"{caller}.init(): unknown option '{keyword}' (allowed: "
                     f"{', '.join(i['name'] for i in _C.options())}; see `commsched options`)")


_INIT_PARAMETERS = ("backend", "tune")  # context options init() takes as its own parameters


def _split_options(options, caller):
    """Engine options go to the Context; the others (tuner, ps, collective) are read from the environment by their
    layer while the Context connects, so a keyword sets its variable for this process."""
    engine = {}
    for keyword, value in options.items():
        info = _registry_option(keyword, caller)
        if info["group"] == "engine":
            engine[info["name"]] = str(value)
        elif info["name"] in _INIT_PARAMETERS:
            raise ValueError(f"{caller}.init(): pass '{info['name']}' as init({info['name']}=...)")
        else:
            os.environ[info["env"]] = str(value)
    return engine


def init(caller, policy=None, backend=None, tune=None, prepare=None, **options):
    """Connects this process to the cluster described by the environment; `caller` names the plugin in messages.
    Keywords are the option registry's names (`commsched options`). prepare(): called just before the Context
    connects, under the same lock (torch: an elastic worker waits for its membership). Calling init() twice is
    harmless; returns whether this call connected."""
    global _ctx, _framework
    with _lock:
        if _ctx is not None:
            return False
        if prepare is not None:
            prepare()
        engine = _split_options(options, caller)
        if policy is not None:
            engine["policy"] = str(policy)
        # No trace file until start_timeline() unless one is asked for (Horovod's API starts one at any time;
        # HOROVOD_TIMELINE=DYNAMIC is Horovod's way of saying so): decided on the engine's own reading of the
        # environment, parsed once.
        _ctx = _C.Context(engine=engine, backend=backend or "", tune=tune, defer_timeline=True)
        _framework = caller
        _noname_counts.clear()
    atexit.register(shutdown)
    return True


def shutdown():
    """Stops the engine and the backend; tasks still pending fail with 'cancelled'. Idempotent."""
    global _ctx
    for hook in list(_shutdown_hooks):
        hook()
    with _lock:
        ctx, _ctx = _ctx, None
    if ctx is not None:
        ctx.shutdown()


def on_shutdown(hook):
    """Runs hook() at shutdown(), before the Context stops."""
    if hook not in _shutdown_hooks:
        _shutdown_hooks.append(hook)


def is_initialized():
    return _ctx is not None


def context(caller="commsched.tensorflow"):
    """The Context; raises NotInitializedError before init()."""
    ctx = _ctx
    if ctx is None:
        raise NotInitializedError(f"{caller} has not been initialized: call {caller}.init() first "
                                  f"(import {caller} as hvd; hvd.init())")
    return ctx


def noname_index(key):
    """The number of the next unnamed operation counted under `key` (a kind, a process set) in this Context, from 0.
    Ranks name an unnamed operation by this count, so they must agree on it: an elastic joiner, a fresh process,
    counts from 0, and so does every survivor once the generation it joins connects (a new Context)."""
    return next(_noname_counts[key])


def engine_dtype(array, name):
    try:
        return _DTYPES[array.dtype.name]
    except KeyError:
        raise ValueError(f"tensor '{name}': dtype {array.dtype.name} is not supported (supported: "
                         f"{', '.join(_DTYPES)})") from None


def submit(ctx, array, name, op, priority=0, root=0, compression=None):
    """Queues one task over a C-contiguous, writable numpy array's memory (no copy). `op`: 'reduce' (the backend's
    sum) or 'broadcast'. The caller keeps `array` alive until the returned handle has completed."""
    if not (array.flags.c_contiguous and array.flags.writeable):
        raise ValueError(f"tensor '{name}': the engine needs a C-contiguous writable array")
    dtype = engine_dtype(array, name)
    name_task(name)
    return ctx.submit(name, int(priority), op, dtype, array.ctypes.data, array.size, "cpu", 0, int(root),
                      compression, 0)


def name_task(name):
    """Remembers the tensor name of a task's wire key, for error messages (describe_error)."""
    _names_by_key.setdefault(_C.task_key(name), name)


# Policies that hold tasks until the end of backward (Engine::backward_done), from the policy registry. Tasks outside
# a backward (broadcasts, metric averages) are released at once with Engine::flush, which neither ends an iteration nor
# lets MG-WFBP learn its merge plan from them (it did, when backward_done was called: a plan learned from broadcasts
# that all arrive at once merges everything, like BSP).
_HOLDING_POLICIES = frozenset(p["name"] for p in _C.policies() if p["holds_tasks"])


def release_outside_backward(ctx):
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
    """Waits for a handle; raises HorovodInternalError naming the tensor when its task failed."""
    while not handle.wait(_WAIT_SLICE_S):
        pass
    err = handle.error
    if err is not None:
        raise HorovodInternalError(f"commsched: communication of '{name}' failed ({handle.code}): "
                                   f"{describe_error(err)}")


def cross_iteration_default():
    """COMMSCHED_CROSS_ITERATION as the option registry parses it (default on): whether a framework's
    DistributedOptimizer defers each update to the next forward when its cross_iteration= is not given."""
    return _C.context_env()["cross_iteration"]


def host_copy(value):
    """A C-contiguous, writable copy of `value` that the engine may write into (TensorFlow's buffers are read-only)."""
    return np.array(value, copy=True, order="C")

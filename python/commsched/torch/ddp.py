"""DistributedDataParallel through the commsched scheduler: a DDP communication hook.

    model = torch.nn.parallel.DistributedDataParallel(model)      # over a torch.distributed group (gloo)
    commsched.torch.ddp.register(model)                           # buckets now go through commsched

Each gradient bucket DDP hands to the hook becomes one commsched task: the engine partitions it, bounds the bytes in
flight (credit) and sends the most urgent partition first. Urgency comes from the bucket's position in forward order:
its priority is the forward position of its first parameter (model.parameters() order), so the buckets of the first
layers, which the next forward needs first, overtake those of the last layers. The result is DDP's: the average of
the bucket over every worker. The hook's Future is completed by one waiter thread (the engine completes tasks on its
own thread and never calls into Python).
"""
import queue
import threading

import torch
import torch.distributed as dist

from commsched.torch import ops, runtime

class _Waiter:
    """Completes the hooks' Futures in submission order as their tasks finish."""

    def __init__(self):
        self._q = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="commsched-ddp", daemon=True)
        self._thread.start()

    def add(self, op, fut):
        self._q.put((op, fut))

    def _run(self):
        while True:
            op, fut = self._q.get()
            try:
                fut.set_result(op.wait())
            except Exception as e:  # noqa: BLE001 - the error travels to DDP's wait() on the Future
                fut.set_exception(e)


class CommschedHookState:
    """What the hook needs: the forward position of every parameter and the waiter thread."""

    def __init__(self, model, name_prefix):
        self.position = {p: i for i, p in enumerate(model.parameters())}
        self.prefix = name_prefix
        self.waiter = _Waiter()
        self.priorities = {}  # bucket index -> the priority its task got (the last time)


def _bucket_priority(state, bucket):
    params = bucket.parameters()
    positions = [state.position[p] for p in params if p in state.position]
    return min(positions) if positions else bucket.index()


def commsched_hook(state, bucket):
    """DDP comm hook: averages the bucket over every commsched worker; returns a Future of the averaged buffer."""
    ctx = runtime.context()
    buf = bucket.buffer()
    name = f"{state.prefix}.bucket{bucket.index()}.{buf.numel()}"  # DDP rebuilds its buckets after step 1
    priority = _bucket_priority(state, bucket)
    state.priorities[bucket.index()] = priority
    op = ops._reduce_op(buf, name, ops.Average, priority=priority)
    if bucket.is_last():
        # Every bucket of this backward is queued: the engine's iteration ends here (BSP and MG-WFBP release what
        # they held, knob changes take effect), and the step time feeds the auto-tuner, as with DistributedOptimizer.
        ctx.backward_done()
        ctx.iteration_end()
    fut = torch.futures.Future()
    state.waiter.add(op, fut)
    return fut


def register(model, name_prefix="ddp"):
    """Registers the commsched hook on a DistributedDataParallel model (initializes commsched if needed).

    torch.distributed must be initialized (DDP needs it for its own parameter broadcast at construction); commsched
    uses its own cluster contract (torchrun's variables, or commsched launch's), so the same workers meet in both.
    """
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise ValueError(f"ddp.register: expected a torch.nn.parallel.DistributedDataParallel, got "
                         f"{type(model).__name__}")
    if not runtime.is_initialized():
        runtime.init()
    if dist.is_initialized() and dist.get_world_size() != runtime.size():
        raise ValueError(f"ddp.register: torch.distributed has {dist.get_world_size()} ranks but commsched has "
                         f"{runtime.size()}: start both from the same launcher (torchrun or commsched launch)")
    state = CommschedHookState(model.module, name_prefix)
    runtime.context().set_model([p.numel() * p.element_size() for p in model.module.parameters()])
    model.register_comm_hook(state, commsched_hook)
    return state

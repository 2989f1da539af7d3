"""Horovod-compatible collective operations: allreduce / push_pull / broadcast (+ _async and in-place variants),
poll and synchronize. Async calls return an integer handle, as in Horovod."""
import itertools
import threading

import torch

from commsched.torch import runtime
from commsched.torch.compression import Compression

# Reduction operations (Horovod names).
Average = "average"
Sum = "sum"
Adasum = "adasum"

_handles = {}
_handle_ids = itertools.count(1)
_noname_ids = itertools.count()
_lock = threading.Lock()


class _Pending:
    """One async operation: the C++ handle, the tensors it writes, and how to produce the output afterwards."""

    def __init__(self, handle, name, work, output, finish):
        self.handle, self.name, self.work, self.output, self.finish = handle, name, work, output, finish


def _register(pending):
    with _lock:
        hid = next(_handle_ids)
        _handles[hid] = pending
    return hid


def _auto_name(kind, name):
    return name if name is not None else f"{kind}.noname.{next(_noname_ids)}"


def _resolve_op(average, op):
    if op is None:
        op = Average if average is None or average else Sum
    elif average is not None:
        raise ValueError("give either op= or average=, not both")
    if op == Adasum:
        raise ValueError("op=Adasum is not supported by commsched (use Average or Sum)")
    if op not in (Average, Sum):
        raise ValueError(f"op={op!r}: expected commsched.torch.Average or commsched.torch.Sum")
    return op


def _start(output, name, op, priority=0, root=0, post=None, compression=None):
    """Runs `op` over `output`'s memory (a contiguous copy when it is not contiguous), then `post(work)` in place;
    the handle's result is `output`."""
    work = output if output.is_contiguous() else output.contiguous()

    def finish():
        if post is not None:
            post(work)
        if work is not output:
            output.copy_(work)
        return output

    handle = runtime.submit(work, name, op, priority=priority, root=root, compression=compression) \
        if work.numel() else None
    if handle is not None:
        runtime.release_outside_backward()
    return _register(_Pending(handle, name, work, output, finish))


def _reduce_async(output, name, op, prescale_factor=1.0, postscale_factor=1.0, priority=0, compression=None):
    """Sums `output` (in place) over every worker; Average divides by the number of workers afterwards."""
    if prescale_factor != 1.0:
        output.mul_(prescale_factor)
    scale = postscale_factor / runtime.size() if op == Average else postscale_factor

    def post(work):
        if scale == 1.0:
            return
        if work.dtype.is_floating_point:
            work.mul_(scale)
        else:  # integers: scale in float64, round down (as Horovod's integer average)
            work.copy_(torch.floor(work.double() * scale).to(work.dtype))

    return _start(output, name, "reduce", priority=priority, post=post, compression=compression)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    """In-place sum (or average) of `tensor` over every worker; returns a handle for synchronize()."""
    del process_set
    op = _resolve_op(average, op)
    return _reduce_async(tensor.detach(), _auto_name("allreduce", name), op, prescale_factor, postscale_factor)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None):
    """Sum (or average) of `tensor` over every worker into a new tensor; returns a handle for synchronize()."""
    del process_set
    op = _resolve_op(average, op)
    return _reduce_async(tensor.detach().clone(), _auto_name("allreduce", name), op, prescale_factor,
                         postscale_factor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Horovod's allreduce: returns a new tensor (averaged by default). Gradients do not flow through it."""
    del process_set
    compressed, cctx = compression.compress(tensor.detach())
    out = synchronize(_reduce_async(compressed.clone(), _auto_name("allreduce", name), _resolve_op(average, op),
                                    prescale_factor, postscale_factor, compression=compression.engine_spec))
    return compression.decompress(out, cctx)


# BytePS names: push_pull is the parameter server's sum (average by default).
def push_pull_async(tensor, average=True, name=None, version=0, priority=0):
    del version
    op = Average if average else Sum
    return _reduce_async(tensor.detach().clone(), _auto_name("push_pull", name), op, priority=priority)


def push_pull_async_inplace(tensor, average=True, name=None, version=0, priority=0):
    del version
    op = Average if average else Sum
    return _reduce_async(tensor.detach(), _auto_name("push_pull", name), op, priority=priority)


def push_pull_inplace(tensor, average=True, name=None, version=0, priority=0):
    return synchronize(push_pull_async_inplace(tensor, average, name, version, priority))


def push_pull(tensor, average=True, name=None, version=0, priority=0, compression=Compression.none):
    del version
    compressed, cctx = compression.compress(tensor.detach())
    out = synchronize(_reduce_async(compressed.clone(), _auto_name("push_pull", name), Average if average else Sum,
                                    priority=priority, compression=compression.engine_spec))
    return compression.decompress(out, cctx)


def _broadcast_async(output, root_rank, name):
    if not 0 <= root_rank < runtime.size():
        raise ValueError(f"broadcast '{name}': root_rank={root_rank} is not a rank (size {runtime.size()})")
    return _start(output, name, "broadcast", root=root_rank)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """In place: every worker's `tensor` becomes root_rank's."""
    del process_set
    return _broadcast_async(tensor.detach(), root_rank, _auto_name("broadcast", name))


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    del process_set
    return _broadcast_async(tensor.detach().clone(), root_rank, _auto_name("broadcast", name))


def broadcast_(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def _pending(handle):
    with _lock:
        p = _handles.get(handle)
    if p is None:
        raise ValueError(f"handle {handle!r} is unknown (already synchronized, or not a commsched handle)")
    return p


def poll(handle):
    """True when the operation behind `handle` has finished (synchronize() will not block)."""
    p = _pending(handle)
    return p.handle is None or p.handle.poll()


def synchronize(handle):
    """Waits for the operation behind `handle` and returns its output tensor; raises RuntimeError if it failed."""
    p = _pending(handle)
    try:
        if p.handle is not None:
            runtime.wait(p.handle, p.name)
        return p.finish()
    finally:
        with _lock:
            _handles.pop(handle, None)

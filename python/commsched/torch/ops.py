"""Horovod-compatible collective operations: allreduce / push_pull / broadcast (+ _async and in-place variants),
poll and synchronize. Async calls return an integer handle, as in Horovod."""
import itertools
import threading

import torch

from commsched import _runtime_core as core
from commsched.torch import runtime
from commsched.torch.compression import Compression

# Reduction operations (Horovod names). Sum and Average go through the backend's sum; Min, Max and Product are
# not sums, so they gather every rank's tensor (allgather) and reduce locally in rank order: the same result on
# every rank, at size() times the data of a sum.
Average = "average"
Sum = "sum"
Adasum = "adasum"
Min = "min"
Max = "max"
Product = "product"
_GATHER_REDUCE = {Min: lambda s: torch.amin(s, dim=0), Max: lambda s: torch.amax(s, dim=0),
                  Product: lambda s: torch.prod(s, dim=0)}

_handles = {}
_handle_ids = itertools.count(1)
_lock = threading.Lock()

# Dtypes the backends carry. Others travel as bytes (broadcast, allgather: padded into int32 words) or, for sums,
# widened to int64 (small integers and bool) and narrowed back.
_SUM_WIDEN = (torch.uint8, torch.int8, torch.int16, torch.bool)


class _Op:
    """One operation in flight: C++ handles (with the task names, for error messages) and `finish`, which runs once
    every handle has completed and returns the operation's result."""

    def __init__(self, handles, finish):
        self.handles, self.finish = handles, finish

    def done(self):
        return all(h.poll() for h, _ in self.handles)

    def wait(self):
        for h, name in self.handles:
            runtime.wait(h, name)
        return self.finish()


def _register(op):
    with _lock:
        hid = next(_handle_ids)
        _handles[hid] = op
    return hid


def _auto_name(kind, name, process_set=None):
    """Unnamed operations are numbered per process set (ranks outside a set do not count its operations, so the
    global set's names still agree across ranks after some ranks worked in a subset), from 0 in each Context."""
    if name is not None:
        return name
    set_id = _pset(process_set).process_set_id
    return f"{kind}.noname.{core.noname_index(('torch', set_id))}" + (f".set{set_id}" if set_id else "")


def _resolve_op(average, op, gather_ok=False):
    """Horovod's op/average arguments -> one op name. gather_ok: Min, Max and Product are allowed (eager
    collectives; the optimizer's gradient reduction is a sum)."""
    if op is None:
        op = Average if average is None or average else Sum
    elif average is not None:
        raise ValueError("give either op= or average=, not both")
    if op == Adasum:
        raise ValueError("op=Adasum is not supported by commsched: use op=Average (or Sum); the scheduler's "
                         "priority and credit keep the averaged all-reduce overlapped with backward")
    if op in _GATHER_REDUCE and not gather_ok:
        raise ValueError(f"op={op!r} is not supported here: use commsched.torch.Average or Sum")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"op={op!r}: expected commsched.torch.Average, Sum, Min, Max or Product")
    return op


def _pset(process_set):
    from commsched.torch import process_sets
    return process_sets.resolve(process_set)


def _wire(output, op):
    """The tensor the backend moves for `output` (contiguous, a carried dtype) and how to copy the result back."""
    work = output if output.is_contiguous() else output.contiguous()
    if work.dtype in runtime._DTYPES:
        return work, (None if work is output else (lambda: output.copy_(work)))
    if op == "reduce" and work.dtype in _SUM_WIDEN:
        wide = work.to(torch.int64)
        return wide, lambda: output.copy_(wide.to(output.dtype) if output.dtype != torch.bool else wide != 0)
    if op == "broadcast" and not work.is_cuda:
        raw = work.reshape(-1).view(torch.uint8)
        words = torch.zeros((raw.numel() + 3) // 4, dtype=torch.int32)
        words.view(torch.uint8)[:raw.numel()] = raw

        def back():
            raw.copy_(words.view(torch.uint8)[:raw.numel()])
            if work is not output:
                output.copy_(work)
        return words, back
    raise ValueError(f"dtype {output.dtype} is not supported for this operation (supported: "
                     f"{', '.join(str(d) for d in runtime._DTYPES)}, and for sums and broadcasts also "
                     f"{', '.join(str(d) for d in _SUM_WIDEN)})")


def _launch(output, name, op, ctx, priority=0, root=0, post=None, compression=None):
    """Starts `op` ('reduce' or 'broadcast') over `output`'s memory on `ctx`; `post(wire_tensor)` runs in place
    afterwards. The _Op's result is `output`."""
    work, back = _wire(output, op)

    def finish():
        if post is not None:
            post(work)
        if back is not None:
            back()
        return output

    if not work.numel():
        return _Op([], finish)
    handle = runtime.submit(work, name, op, priority=priority, root=root, ctx=ctx, compression=compression)
    runtime.release_outside_backward(ctx)
    return _Op([(handle, name)], finish)


def _reduce_op(output, name, op, prescale_factor=1.0, postscale_factor=1.0, priority=0, process_set=None,
               compression=None):
    """Reduces `output` in place over the process set's workers: Sum/Average through the backend's sum (Average
    divides by the set's size afterwards), Min/Max/Product by gathering."""
    ps = _pset(process_set)
    ctx = ps.context()
    if prescale_factor != 1.0:
        output.mul_(prescale_factor)
    if op in _GATHER_REDUCE:
        from commsched.torch import collectives
        gathered = collectives.allgather_op(output.unsqueeze(0), name, ps)

        def finish():
            output.copy_(_GATHER_REDUCE[op](gathered.finish()))
            if postscale_factor != 1.0:
                output.mul_(postscale_factor)
            return output
        return _Op(gathered.handles, finish)
    scale = postscale_factor / ctx.size if op == Average else postscale_factor

    def post(work):
        if scale == 1.0:
            return
        if work.dtype.is_floating_point:
            work.mul_(scale)
        else:  # integers: scale in float64, round down (as Horovod's integer average)
            work.copy_(torch.floor(work.double() * scale).to(work.dtype))

    return _launch(output, name, "reduce", ctx, priority=priority, post=post, compression=compression)


def _reduce_async(output, name, op, prescale_factor=1.0, postscale_factor=1.0, priority=0, process_set=None,
                  compression=None):
    return _register(_reduce_op(output, name, op, prescale_factor, postscale_factor, priority, process_set,
                                compression))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    """In-place sum (or average, min, max, product) of `tensor` over the process set; returns a handle."""
    op = _resolve_op(average, op, gather_ok=True)
    return _reduce_async(tensor.detach(), _auto_name("allreduce", name, process_set), op, prescale_factor,
                         postscale_factor, process_set=process_set)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None):
    """Sum (or average, min, max, product) of `tensor` over the process set into a new tensor; returns a handle."""
    op = _resolve_op(average, op, gather_ok=True)
    return _reduce_async(tensor.detach().clone(), _auto_name("allreduce", name, process_set), op, prescale_factor,
                         postscale_factor, process_set=process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


class _WithGrad(torch.autograd.Function):
    """A collective with a gradient: forward returns run(*tensors) (a tensor or a tuple of them), backward
    grad(*output_gradients) (a tuple: one gradient per input tensor)."""

    @staticmethod
    def forward(fctx, run, grad, *tensors):
        fctx.grad = grad
        return run(*tensors)

    @staticmethod
    def backward(fctx, *grads):
        return (None, None, *fctx.grad(*grads))


def _with_grad(tensors, run, grad):
    """run(*tensors), through autograd (gradients from grad) when one of `tensors` needs a gradient, as Horovod's
    collectives are. Names are resolved before, so both paths number unnamed operations alike on every rank."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _WithGrad.apply(run, grad, *tensors)
    return run(*tensors)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Horovod's allreduce: returns a new tensor (averaged by default); differentiable for Sum and Average (the
    gradient of a reduction over ranks is the same reduction of the output gradients)."""
    op = _resolve_op(average, op, gather_ok=True)
    compressed, cctx = compression.compress(tensor)
    name = _auto_name("allreduce", name, process_set)

    def run(t):
        return synchronize(_reduce_async(t.detach().clone(), name, op, prescale_factor, postscale_factor,
                                         process_set=process_set, compression=compression.engine_spec))

    def grad(g):
        if op not in (Average, Sum):
            raise RuntimeError(f"allreduce: no gradient for op={op!r} (only Sum and Average)")
        return (synchronize(allreduce_async(g, None, None, op, prescale_factor, postscale_factor, process_set)),)
    return compression.decompress(_with_grad([compressed], run, grad), cctx)


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


def _broadcast_op(output, root_rank, name, process_set=None):
    """Every member's `output` becomes root_rank's; root_rank is a global rank and must be in the process set."""
    ps = _pset(process_set)
    ctx = ps.context()
    members = ps.ranks
    if root_rank not in members:
        raise ValueError(f"broadcast '{name}': root_rank={root_rank} is not a rank of the process set {members}")
    return _launch(output, name, "broadcast", ctx, root=members.index(root_rank))


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """In place: every worker's `tensor` becomes root_rank's."""
    return _register(_broadcast_op(tensor.detach(), root_rank, _auto_name("broadcast", name, process_set),
                                          process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    return _register(_broadcast_op(tensor.detach().clone(), root_rank,
                                          _auto_name("broadcast", name, process_set), process_set))


def broadcast_(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Differentiable as Horovod's: root_rank's input gets the members' output gradients averaged, the others'
    inputs zeros (they reach no output)."""
    name = _auto_name("broadcast", name, process_set)

    def grad(g):
        out = synchronize(allreduce_async(g, op=Average, process_set=process_set))
        return (out if runtime.rank() == root_rank else torch.zeros_like(out),)
    return _with_grad([tensor], lambda t: synchronize(broadcast_async(t, root_rank, name, process_set)), grad)


def _pending(handle):
    with _lock:
        p = _handles.get(handle)
    if p is None:
        raise ValueError(f"handle {handle!r} is unknown (already synchronized, or not a commsched handle)")
    return p


def poll(handle):
    """True when the operation behind `handle` has finished (synchronize() will not block)."""
    return _pending(handle).done()


def synchronize(handle):
    """Waits for the operation behind `handle` and returns its output (a tensor, or what the operation returns:
    a list for grouped operations, (output, received_splits) for alltoall with splits); raises HorovodInternalError
    if it failed."""
    p = _pending(handle)
    try:
        return p.wait()
    finally:
        with _lock:
            _handles.pop(handle, None)

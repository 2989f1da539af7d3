"""Horovod's other collectives (allgather, alltoall, reducescatter, grouped forms, barrier, join), built from the two
operations every commsched backend carries: the sum (push_pull on the PS, allreduce on Gloo/NCCL) and broadcast.

Why this design: the PS backend and Gloo backend both carry sum and broadcast, and everything goes through the engine,
so these operations are partitioned, credit-limited and ordered like gradients. No backend needs a new operation.

  allgather      one size exchange (a sum over an n x (1+ndim) int64 table, each rank filling its row), then one
                 broadcast per rank of its rows straight into the output (rank r is the root of piece r). On the PS
                 each rank pushes its own rows once and pulls the others: the data an all-gather must move.
  alltoall       the n x n split table by one sum, then each rank broadcasts its whole input and every receiver keeps
                 its slice. Every rank receives every input: n times the data of a point-to-point all-to-all (the
                 backends have no point-to-point); fine for the routing tables and small exchanges it is used for.
  reducescatter  a sum (or average) of the whole tensor, then each rank keeps its block of rows (Horovod's split:
                 the first rows % n ranks get one extra row). Twice the data of a ring reduce-scatter.
  Min/Max/Product (ops.py) gather and reduce locally in rank order; barrier is a one-element sum; join is a barrier.
"""
import time

import torch

from commsched._host_collectives import alltoall_splits
from commsched.torch import ops, runtime
from commsched.torch.compression import Compression


def _exchange(values, name, ps):
    """Every member's list of `values` ints, as an (n, len(values)) int64 tensor (one synchronous sum)."""
    ctx = ps.context()
    table = torch.zeros(ctx.size, len(values), dtype=torch.int64)
    table[ctx.rank] = torch.tensor(values, dtype=torch.int64)
    ops._reduce_op(table, name, ops.Sum, process_set=ps).wait()
    return table


def allgather_op(tensor, name, ps):
    """The _Op of an allgather of `tensor` along dimension 0 over process set `ps` (its result: the output)."""
    ctx = ps.context()
    t = tensor.detach()
    if t.dim() == 0:
        t = t.reshape(1)
    t = t.contiguous()
    shapes = _exchange([t.shape[0], *t.shape[1:]], f"{name}.shapes", ps)
    rest = list(t.shape[1:])
    for r in range(ctx.size):
        if shapes[r, 1:].tolist() != rest:
            raise ValueError(f"allgather '{name}': rank {ps.global_rank(r)} has shape [*, "
                             f"{', '.join(map(str, shapes[r, 1:].tolist()))}] but rank {runtime.rank()} has "
                             f"[*, {', '.join(map(str, rest))}]: only the first dimension may differ")
    rows = shapes[:, 0].tolist()
    out = t.new_empty([sum(rows), *rest])
    parts, offset = [], 0
    for r, n in enumerate(rows):
        piece = out.narrow(0, offset, n)
        offset += n
        if r == ctx.rank:
            piece.copy_(t)
        if n and piece.numel():
            parts.append(ops._launch(piece, f"{name}.from{r}", "broadcast", ctx, root=r))
    def finish():
        for p in parts:
            p.finish()
        return out
    return ops._Op([h for p in parts for h in p.handles], finish)


def allgather_async(tensor, name=None, process_set=None):
    """Concatenation along dimension 0 of every member's `tensor` (other dimensions equal); returns a handle."""
    return ops._register(allgather_op(tensor, ops._auto_name("allgather", name, process_set),
                                     ops._pset(process_set)))


def _allgather_grad(grad, rows, process_set):
    """The gradient of an allgather input of `rows` rows: its slice of the members' output gradients averaged (as
    Horovod's)."""
    ps = ops._pset(process_set)
    summed = ops.synchronize(ops.allreduce_async(grad, op=ops.Average, process_set=process_set))
    every = _exchange([rows], ops._auto_name("allgather.grad_rows", None, ps), ps)[:, 0].tolist()
    me = ps.context().rank
    return summed.narrow(0, sum(every[:me]), rows)


def _rows(tensor):
    return tensor.shape[0] if tensor.dim() else 1


def allgather(tensor, name=None, process_set=None):
    name = ops._auto_name("allgather", name, process_set)
    return ops._with_grad([tensor], lambda t: ops.synchronize(allgather_async(t, name, process_set)),
                          lambda g: (_allgather_grad(g, _rows(tensor), process_set),))


def _group(kind, tensors, name, make, process_set):
    """One handle over several operations; `make(tensor, name_i)` returns each _Op. Result: the list of results."""
    base = ops._auto_name(kind, name, process_set)
    parts = [make(t, f"{base}.{i}") for i, t in enumerate(tensors)]
    return ops._register(ops._Op([h for p in parts for h in p.handles], lambda: [p.finish() for p in parts]))


def grouped_allgather_async(tensors, name=None, process_set=None):
    ps = ops._pset(process_set)
    return _group("grouped_allgather", tensors, name, lambda t, n: allgather_op(t, n, ps), ps)


def grouped_allgather(tensors, name=None, process_set=None):
    name = ops._auto_name("grouped_allgather", name, process_set)

    def run(*ts):
        return tuple(ops.synchronize(grouped_allgather_async(ts, name, process_set)))

    def grad(*gs):
        return tuple(_allgather_grad(g, _rows(t), process_set) for g, t in zip(gs, tensors))
    return list(ops._with_grad(tensors, run, grad))


def _grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor, process_set, inplace):
    op = ops._resolve_op(average, op, gather_ok=True)
    return _group("grouped_allreduce", tensors, name, lambda t, n: ops._reduce_op(
        t.detach() if inplace else t.detach().clone(), n, op, prescale_factor, postscale_factor,
        process_set=process_set), process_set)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=None):
    return _grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor, process_set, False)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=None):
    return _grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor, process_set, True)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None):
    op = ops._resolve_op(average, op, gather_ok=True)
    name = ops._auto_name("grouped_allreduce", name, process_set)
    pairs = [compression.compress(t) for t in tensors]

    def run(*ts):
        return tuple(ops.synchronize(grouped_allreduce_async(list(ts), None, name, op, prescale_factor,
                                                             postscale_factor, process_set)))

    def grad(*gs):
        if op not in (ops.Average, ops.Sum):
            raise RuntimeError(f"grouped_allreduce: no gradient for op={op!r} (only Sum and Average)")
        return tuple(ops.synchronize(grouped_allreduce_async(list(gs), None, None, op, prescale_factor,
                                                             postscale_factor, process_set)))
    outs = ops._with_grad([c for c, _ in pairs], run, grad)
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None):
    return ops.synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                    process_set))


def _block(rows, n, r):
    """Horovod's reducescatter split of `rows` over n ranks: (offset, count) of rank r's block."""
    base, extra = divmod(rows, n)
    return r * base + min(r, extra), base + (1 if r < extra else 0)


def _reducescatter_op(tensor, name, op, ps, prescale_factor, postscale_factor):
    if op not in (ops.Average, ops.Sum):
        raise ValueError(f"reducescatter '{name}': op={op!r} is not supported (Average or Sum, as in Horovod)")
    if tensor.dim() == 0:
        raise ValueError(f"reducescatter '{name}': a 0-dimensional tensor cannot be scattered")
    ctx = ps.context()
    full = ops._reduce_op(tensor.detach().clone(), name, op, prescale_factor, postscale_factor, process_set=ps)
    offset, count = _block(tensor.shape[0], ctx.size, ctx.rank)
    return ops._Op(full.handles, lambda: full.finish().narrow(0, offset, count).clone())


def reducescatter_async(tensor, name=None, op=ops.Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Sum (or average) over the process set, of which this rank keeps its block of rows; returns a handle."""
    return ops._register(_reducescatter_op(tensor, ops._auto_name("reducescatter", name, process_set), op,
                                           ops._pset(process_set),
                                           prescale_factor, postscale_factor))


def _reducescatter_grad(grad, op, process_set, prescale_factor, postscale_factor):
    """Each input row reaches one member's block, scaled by both factors (and 1/size for Average): its gradient is
    that member's output gradient, scaled alike; the members' blocks gathered in rank order."""
    size = ops._pset(process_set).context().size
    scale = prescale_factor * postscale_factor / (size if op == ops.Average else 1)
    return ops.synchronize(allgather_async(grad, None, process_set)) * scale


def reducescatter(tensor, name=None, compression=Compression.none, op=ops.Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    name = ops._auto_name("reducescatter", name, process_set)
    compressed, cctx = compression.compress(tensor)

    def run(t):
        return ops.synchronize(reducescatter_async(t, name, op, process_set, prescale_factor, postscale_factor))

    def grad(g):
        return (_reducescatter_grad(g, op, process_set, prescale_factor, postscale_factor),)
    return compression.decompress(ops._with_grad([compressed], run, grad), cctx)


def grouped_reducescatter_async(tensors, name=None, op=ops.Average, process_set=None, prescale_factor=1.0,
                                postscale_factor=1.0):
    ps = ops._pset(process_set)
    return _group("grouped_reducescatter", tensors, name,
                  lambda t, n: _reducescatter_op(t, n, op, ps, prescale_factor, postscale_factor), ps)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=ops.Average, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0):
    name = ops._auto_name("grouped_reducescatter", name, process_set)
    pairs = [compression.compress(t) for t in tensors]

    def run(*ts):
        return tuple(ops.synchronize(grouped_reducescatter_async(list(ts), name, op, process_set, prescale_factor,
                                                                 postscale_factor)))

    def grad(*gs):
        return tuple(_reducescatter_grad(g, op, process_set, prescale_factor, postscale_factor) for g in gs)
    outs = ops._with_grad([c for c, _ in pairs], run, grad)
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def _alltoall_op(tensor, splits, name, ps):
    ctx = ps.context()
    n, me = ctx.size, ctx.rank
    t = tensor.detach().contiguous()
    if t.dim() == 0:
        raise ValueError(f"alltoall '{name}': a 0-dimensional tensor cannot be split")
    mine = alltoall_splits(name, t.shape[0], n,
                           None if splits is None else (splits.tolist() if torch.is_tensor(splits) else splits))
    shapes = _exchange(mine + list(t.shape[1:]), f"{name}.splits", ps)
    rest = list(t.shape[1:])
    for r in range(n):
        if shapes[r, n:].tolist() != rest:
            raise ValueError(f"alltoall '{name}': rank {ps.global_rank(r)} sends rows of shape "
                             f"{shapes[r, n:].tolist()}, rank {runtime.rank()} {rest}")
    table = shapes[:, :n]
    inputs, parts = [], []
    for r in range(n):
        sent = table[r].tolist()
        buf = t if r == me else t.new_empty([sum(sent), *rest])
        inputs.append(buf)
        needed_by_others = sum(sent) - sent[r]
        if needed_by_others and buf.numel():
            parts.append(ops._launch(buf, f"{name}.from{r}", "broadcast", ctx, root=r))
    received = table[:, me].clone()

    def finish():
        for p in parts:
            p.finish()
        blocks = [inputs[r].narrow(0, int(table[r, :me].sum()), int(table[r, me])) for r in range(n)]
        return torch.cat(blocks, dim=0), received
    return ops._Op([h for p in parts for h in p.handles], finish)


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Scatters `tensor`'s rows (splits[j] rows to rank j; equal blocks by default) and gathers what every rank sent
    here. synchronize() returns (output, received_splits)."""
    return ops._register(_alltoall_op(tensor, splits, ops._auto_name("alltoall", name, process_set),
                                      ops._pset(process_set)))


def alltoall(tensor, splits=None, name=None, process_set=None):
    """The output; with splits= also received_splits (rows received from each rank), as Horovod returns them.
    Differentiable: each block of the output's gradient goes back to the rank it came from."""
    name = ops._auto_name("alltoall", name, process_set)
    received = []

    def run(t):
        output, got = ops.synchronize(alltoall_async(t, splits, name, process_set))
        received.append(got)
        return output

    def grad(g):
        return (ops.synchronize(alltoall_async(g, received[0], None, process_set))[0],)
    output = ops._with_grad([tensor], run, grad)
    return output if splits is None else (output, received[0])


def barrier(process_set=None):
    """Returns once every member of the process set has called barrier()."""
    ops._reduce_op(torch.zeros(1, dtype=torch.int32), ops._auto_name("barrier", None, process_set), ops.Sum,
                   process_set=process_set).wait()


def join(device=-1):
    """Waits until every rank has called join(); returns the rank that called it last.

    Horovod's join on the parameter server and on Gloo: until every rank has joined, a joined rank stands in with
    zeros for the sums the others still compute (the average still divides by the full size, as in Horovod), so
    ranks may run different numbers of batches; afterwards tensors of any name line up on every rank again.
    On NCCL a joined rank cannot stand in yet (its zeros would have to live on the GPU): there every rank must issue
    the same collectives before joining (even out the number of batches first), and join() is a barrier naming the
    last.
    """
    del device
    ctx = runtime.context()
    if ctx.joins:  # waits for this rank's outstanding operations first (their handles stay valid)
        return int(ctx.join())
    stamp = torch.tensor([time.time()], dtype=torch.float64)
    stamps = ops.synchronize(allgather_async(stamp, ops._auto_name("join", None)))
    return int(torch.argmax(stamps).item())


def sparse_allreduce_async(tensor, name, op, process_set=None):
    """Horovod's sparse all-reduce: every rank's (indices, values) gathered; returns a function that waits and
    returns the combined sparse tensor (duplicates summed when coalesced; Average divides by the set's size)."""
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    idx = allgather_async(t.indices().transpose(0, 1).contiguous(), f"{name}.indices", process_set)
    val = allgather_async(t.values(), f"{name}.values", process_set)
    size = ops._pset(process_set).context().size

    def handle():
        values = ops.synchronize(val)
        indices = ops.synchronize(idx)
        if op == ops.Average:
            values = values / size
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size())
    return handle

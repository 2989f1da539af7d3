"""Collectives over host (numpy) arrays, built from the two operations every backend carries: the sum (push_pull on
the PS, allreduce on Gloo) and broadcast, each a scheduler task (partitioned, credit-limited, ordered by priority).

The same constructions as commsched.torch.collectives (which works on torch tensors): allgather is one size exchange
(a sum over a table each rank fills one row of) and one broadcast per rank into the output; alltoall broadcasts each
rank's input and keeps the slices sent here; Min and Max gather every rank's array and reduce locally in rank order.
Every function returns a Pending: wait() waits for its tasks and returns the result.
"""
import time

import numpy as np

from commsched import _runtime_core as core

AVERAGE, SUM, MIN, MAX, PRODUCT = "average", "sum", "min", "max", "product"
_GATHER_REDUCE = {MIN: np.min, MAX: np.max, PRODUCT: np.prod}
# Sums of small integers and bools travel widened to int64; other dtypes the engine lacks are broadcast as bytes.
_WIDEN_FOR_SUM = ("int8", "uint8", "int16", "uint16", "bool")


class Pending:
    """Tasks in flight ((handle, name) pairs) and `finish`, which runs once all have completed and returns the
    result. The arrays the tasks write into stay alive through `finish`'s closure."""

    def __init__(self, parts, finish):
        self.parts, self.finish = parts, finish

    def wait(self):
        for handle, name in self.parts:
            core.wait(handle, name)
        return self.finish()


def _launch(ctx, work, name, op, priority=0, root=0, compression=None, finish=None):
    """Submits `op` over `work` (already a host copy the engine may write) and releases it outside a backward."""
    finish = finish or (lambda: work)
    if work.size == 0:
        return Pending([], finish)
    handle = core.submit(ctx, work, name, op, priority=priority, root=root, compression=compression)
    core.release_outside_backward(ctx)
    return Pending([(handle, name)], finish)


def reduce(ctx, array, name, op=AVERAGE, priority=0, compression=None, prescale=1.0, postscale=1.0,
           hold=False):
    """Sum, average, min, max or product of `array` over every worker. hold=True leaves the task to the policy (a
    gradient of a backward; the caller ends the backward with ctx.backward_done())."""
    work = core.host_copy(array)
    if prescale != 1.0:
        work = (work * prescale).astype(work.dtype)
    if op in _GATHER_REDUCE:
        gathered = allgather(ctx, work[np.newaxis], name)
        return Pending(gathered.parts, lambda: _scaled(_GATHER_REDUCE[op](gathered.finish(), axis=0)
                                                       .astype(work.dtype), postscale))
    if op not in (AVERAGE, SUM):
        raise ValueError(f"allreduce '{name}': op={op!r} (expected Average, Sum, Min, Max or Product)")
    scale = postscale / ctx.size if op == AVERAGE else postscale
    wide = work.astype(np.int64) if work.dtype.name in _WIDEN_FOR_SUM else work
    core.engine_dtype(wide, name)  # a clear error before anything is submitted

    def finish():
        out = _scaled(wide, scale)
        return out if wide is work else out.astype(work.dtype) if work.dtype != np.bool_ else out != 0
    if hold:
        if wide.size == 0:
            return Pending([], finish)
        handle = core.submit(ctx, wide, name, "reduce", priority=priority, compression=compression)
        return Pending([(handle, name)], finish)
    return _launch(ctx, wide, name, "reduce", priority=priority, compression=compression, finish=finish)


def _scaled(array, scale):
    if scale == 1.0:
        return array
    if np.issubdtype(array.dtype, np.integer):  # integers: scale in float64 and round down (Horovod's average)
        return np.floor(array.astype(np.float64) * scale).astype(array.dtype)
    return (array * np.asarray(scale, dtype=array.dtype)).astype(array.dtype)


def broadcast(ctx, array, root, name):
    """Every worker's array becomes rank `root`'s (a new array)."""
    if not 0 <= root < ctx.size:
        raise ValueError(f"broadcast '{name}': root_rank={root} is not a rank (size {ctx.size})")
    work = core.host_copy(array)
    if work.dtype.name in core._DTYPES:
        return _launch(ctx, work, name, "broadcast", root=root)
    raw = work.reshape(-1).view(np.uint8)  # other dtypes travel as bytes padded into int32 words
    words = np.zeros((raw.size + 3) // 4, dtype=np.int32)
    words.view(np.uint8)[:raw.size] = raw

    def finish():
        raw[:] = words.view(np.uint8)[:raw.size]
        return work
    return _launch(ctx, words, name, "broadcast", root=root, finish=finish)


def exchange(ctx, values, name):
    """Every rank's list of `values` ints, as an (n, len(values)) int64 array (one synchronous sum)."""
    table = np.zeros((ctx.size, len(values)), dtype=np.int64)
    table[ctx.rank] = values
    return reduce(ctx, table, name, op=SUM).wait()


def allgather(ctx, array, name):
    """Concatenation along dimension 0 of every rank's array (the other dimensions must agree)."""
    mine = np.atleast_1d(core.host_copy(array))
    rest = list(mine.shape[1:])
    shapes = exchange(ctx, [mine.shape[0], *rest], f"{name}.shapes")
    for r in range(ctx.size):
        if shapes[r, 1:].tolist() != rest:
            raise ValueError(f"allgather '{name}': rank {r} has shape [*, {', '.join(map(str, shapes[r, 1:]))}] but "
                             f"rank {ctx.rank} has [*, {', '.join(map(str, rest))}]: only the first dimension may "
                             "differ")
    pieces = []
    parts = []
    for r, rows in enumerate(shapes[:, 0].tolist()):
        piece = mine if r == ctx.rank else np.zeros([rows, *rest], dtype=mine.dtype)
        op = broadcast(ctx, piece, r, f"{name}.from{r}")
        parts.extend(op.parts)
        pieces.append(op)
    return Pending(parts, lambda: np.concatenate([p.finish() for p in pieces], axis=0))


def alltoall_splits(name, rows, n, splits):
    """The rows each of n ranks gets: `splits` (a sequence of n counts summing to rows), or equal blocks when None;
    a split that does not add up raises ValueError naming the collective (both frameworks' alltoall)."""
    if splits is None:
        if rows % n:
            raise ValueError(f"alltoall '{name}': {rows} rows do not split equally over {n} ranks; pass splits=")
        return [rows // n] * n
    sent = [int(s) for s in splits]
    if len(sent) != n or any(s < 0 for s in sent) or sum(sent) != rows:
        raise ValueError(f"alltoall '{name}': splits={sent} must be {n} non-negative counts summing to the "
                         f"{rows} rows of the tensor")
    return sent


def alltoall(ctx, array, splits, name):
    """Rows splits[j] of `array` go to rank j (equal blocks when splits is None); returns (output, received_splits).
    Every rank's input is broadcast and each receiver keeps its slice (the backends have no point-to-point)."""
    n, me = ctx.size, ctx.rank
    mine = core.host_copy(array)
    if mine.ndim == 0:
        raise ValueError(f"alltoall '{name}': a 0-dimensional tensor cannot be split")
    sent = alltoall_splits(name, mine.shape[0], n, None if splits is None else np.asarray(splits).reshape(-1))
    rest = list(mine.shape[1:])
    table = exchange(ctx, sent + rest, f"{name}.splits")
    for r in range(n):
        if table[r, n:].tolist() != rest:
            raise ValueError(f"alltoall '{name}': rank {r} sends rows of shape {table[r, n:].tolist()}, rank {me} "
                             f"{rest}")
    inputs = [mine if r == me else np.zeros([int(table[r, :n].sum()), *rest], dtype=mine.dtype) for r in range(n)]
    ops = [broadcast(ctx, inputs[r], r, f"{name}.from{r}") for r in range(n)]

    def finish():
        full = [op.finish() for op in ops]
        blocks = [full[r][int(table[r, :me].sum()):int(table[r, :me + 1].sum())] for r in range(n)]
        return np.concatenate(blocks, axis=0), table[:, me].astype(np.int32)
    return Pending([p for op in ops for p in op.parts], finish)


def join(ctx, name):
    """Horovod's join: on a backend that stands in with zeros for joined ranks (the PS, Gloo), ctx.join(); elsewhere
    a barrier. Returns the rank that joined last."""
    if ctx.joins:
        return int(ctx.join())
    stamps = allgather(ctx, np.array([time.time()]), name).wait()
    return int(np.argmax(stamps))

"""TensorFlow operations over the engine: allreduce, grouped_allreduce, allgather, broadcast, alltoall, join;
broadcast_object and allgather_object (pickled Python values, eager only).

Sums and broadcasts of the engine's dtypes are two native ops (native.py): CommschedSubmit copies the tensor into a
buffer of its own and queues the task, CommschedWait (an asynchronous kernel) completes with that buffer once the
task has. Everything else (allgather, alltoall, Min/Max/Product, other dtypes, and every operation where the native
ops could not be built) is a host callback (tf.numpy_function) around commsched._host_collectives. Both run the
same in eager mode and inside tf.function. Gradients keep submit and wait apart so that every gradient is on the
wire before anything waits (see gradients.py).

Inside tf.function, stateful callbacks run in program order (TensorFlow's automatic control dependencies), and a
callback's Python code is fixed when the function is traced: unnamed operations get their names then, after the
function's graph and their order in it (auto_name), the same on every rank as long as every rank traces the same code.
"""
import collections
import itertools
import pickle
import threading
import weakref

import numpy as np
import tensorflow as tf

from commsched import _host_collectives as hc
from commsched import _runtime_core as core
from commsched.tensorflow import native

Average, Sum, Adasum, Min, Max, Product = hc.AVERAGE, hc.SUM, "adasum", hc.MIN, hc.MAX, hc.PRODUCT
CALLER = "commsched.tensorflow"

_graph_noname_ids = weakref.WeakKeyDictionary()  # a traced graph -> its own counts of unnamed operations
_pending = {}                   # handle id -> Pending (two-phase operations: gradients)
_pending_ids = itertools.count(1)
_lock = threading.Lock()


def context():
    return core.context(CALLER)


def auto_name(kind, name):
    """An unnamed operation's name. Eager: counted per kind from 0 in each Context. Inside a tf.function being traced:
    after the function's graph, counted per kind from 0 in that graph, so the name depends on the function's code
    alone: an elastic survivor's function traced in an earlier generation and a joiner's traced now agree, and no
    eager name of a later generation collides with it."""
    if name is not None:
        return name
    if tf.executing_eagerly():
        return f"{kind}.noname.{core.noname_index(('tensorflow', kind))}"
    graph = tf.compat.v1.get_default_graph()
    counts = _graph_noname_ids.setdefault(graph, collections.defaultdict(itertools.count))
    return f"{kind}.noname.{graph.name}.{next(counts[kind])}"


def resolve_op(average, op):
    """Horovod's op/average arguments -> one op name."""
    if op is None:
        op = Average if average is None or average else Sum
    elif average is not None:
        raise ValueError("give either op= or average=, not both")
    if op == Adasum:
        raise ValueError("op=Adasum is not supported by commsched: use op=Average (or Sum)")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"op={op!r}: expected commsched.tensorflow.Average, Sum, Min, Max or Product")
    return op


def check_process_set(process_set):
    if process_set is not None and process_set is not global_process_set:
        raise ValueError("commsched.tensorflow runs on the global process set only (process sets are in "
                         "commsched.torch)")


class _GlobalProcessSet:
    """Horovod's global_process_set: every worker."""
    process_set_id = 0

    @property
    def ranks(self):
        return list(range(context().size))

    def __repr__(self):
        return "ProcessSet(global)"


global_process_set = _GlobalProcessSet()


def _host(fn, inputs, tout, name):
    """Runs fn(*numpy_inputs) as a host callback; `name` labels it in TensorFlow's graph."""
    label = "commsched_" + "".join(c if c.isalnum() else "_" for c in name)[:60]
    return tf.numpy_function(fn, inputs, tout, stateful=True, name=label)


def _run(pending_fn):
    """A host-callback body: start the operation, wait, return its result."""
    return pending_fn().wait()


# ---- native ops ----

_NATIVE_DTYPES = (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64)


def _native_ok(dtype):
    return dtype in _NATIVE_DTYPES and native.load() is not None


def _holding():
    """Whether the policy holds tasks until a backward ends: operations outside a backward then release theirs."""
    return context().policy in core._HOLDING_POLICIES


def _scaled(t, scale):
    if scale == 1.0:
        return t
    if t.dtype.is_integer:  # integers: scale in float64 and round down (Horovod's average)
        return tf.cast(tf.floor(tf.cast(t, tf.float64) * scale), t.dtype)
    return t * tf.cast(scale, t.dtype)


def _native_submit(tensor, name, op="reduce", priority=0, root=0, compression=None, flush=False):
    return native.load().commsched_submit(tensor, task_name=name, priority=int(priority), op=op, root=int(root),
                                          compression=compression or "", flush=flush)


def _native_wait(ticket, dtype, shape):
    out = native.load().commsched_wait(ticket, T=dtype)
    out.set_shape(shape)
    return out


_group = {}  # tf.Variables: this worker's rank, size, local_rank and local_size, read when an operation runs


def set_group(**values):
    """This worker's place in the group from now on (rank, size, local_rank, local_size): variables read when an
    operation runs, so a tf.function traced before an elastic job re-formed uses the new group (a Python number
    would be fixed at tracing)."""
    for name, value in values.items():
        if name in _group:
            _group[name].assign(float(value))
        else:
            with tf.init_scope():
                _group[name] = tf.Variable(float(value), dtype=tf.float64, trainable=False, name="commsched_" + name)


def group_value(name, dtype):
    """The current `name` of set_group, as a tensor of `dtype`."""
    return tf.cast(_group[name], dtype)


def _postscaled(t, op, postscale):
    """The sum `t` times postscale, and divided by the size for Average."""
    if op != Average:
        return _scaled(t, postscale)
    scale = tf.constant(postscale, tf.float64) / group_value("size", tf.float64)
    if t.dtype.is_integer:  # integers: scale in float64 and round down (Horovod's average)
        return tf.cast(tf.floor(tf.cast(t, tf.float64) * scale), t.dtype)
    return t * tf.cast(scale, t.dtype)


def forget_pending():
    """The Context went: host-callback results that nobody waited for are dropped."""
    with _lock:
        _pending.clear()


def _allreduce_raw(tensor, name, op, prescale, postscale, compression):
    tensor = tf.convert_to_tensor(tensor)
    if op in (Average, Sum) and _native_ok(tensor.dtype):
        ticket = _native_submit(_scaled(tensor, prescale), name, compression=compression, flush=_holding())
        return _postscaled(_native_wait(ticket, tensor.dtype, tensor.shape), op, postscale)

    def body(x):
        ctx = context()
        return _run(lambda: hc.reduce(ctx, x, name, op, compression=compression, prescale=prescale,
                                      postscale=postscale))
    out = _host(body, [tensor], tensor.dtype, name)
    out.set_shape(tensor.shape)
    return out


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=None, ignore_name_scope=False):
    """Horovod's allreduce: a new tensor, the average (default), sum, min, max or product over every worker.
    Differentiable for Sum and Average (the gradient is the same reduction of the output gradients)."""
    del device_dense, device_sparse, ignore_name_scope
    check_process_set(process_set)
    op = resolve_op(average, op)
    name = auto_name("allreduce", name)
    # A tensor before custom_gradient, which refuses variables read inside it (a Keras 3 Variable is no tf.Tensor);
    # IndexedSlices are densified.
    tensor = tf.convert_to_tensor(tensor)
    spec = getattr(compression, "engine_spec", None)

    @tf.custom_gradient
    def reduced(x):
        out = _allreduce_raw(x, name, op, prescale_factor, postscale_factor, spec)

        def grad(dy):
            if op not in (Average, Sum):
                raise ValueError(f"allreduce '{name}': no gradient for op={op!r} (only Sum and Average)")
            return _allreduce_raw(dy, f"{name}.grad", op, prescale_factor, postscale_factor, None)
        return out, grad
    return reduced(tensor)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=None):
    """Reduces every tensor of the list at once (all on the wire before any wait); returns the list."""
    del device_dense, device_sparse
    check_process_set(process_set)
    op = resolve_op(average, op)
    base = auto_name("grouped_allreduce", name)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    spec = getattr(compression, "engine_spec", None)
    if op in (Average, Sum) and all(_native_ok(t.dtype) for t in tensors):
        tickets = [_native_submit(_scaled(t, prescale_factor), f"{base}.{i}", compression=spec, flush=_holding())
                   for i, t in enumerate(tensors)]
        return [_postscaled(_native_wait(k, t.dtype, t.shape), op, postscale_factor)
                for k, t in zip(tickets, tensors)]

    def body(*xs):
        ctx = context()
        ops = [hc.reduce(ctx, x, f"{base}.{i}", op, compression=spec, prescale=prescale_factor,
                         postscale=postscale_factor) for i, x in enumerate(xs)]
        return [p.wait() for p in ops]
    outs = _host(body, tensors, [t.dtype for t in tensors], base)
    for o, t in zip(outs, tensors):
        o.set_shape(t.shape)
    return list(outs)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenation along dimension 0 of every worker's tensor (the other dimensions must agree)."""
    del ignore_name_scope
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    name = auto_name("allgather", name)
    out = _host(lambda x: _run(lambda: hc.allgather(context(), x, name)), [tensor], tensor.dtype, name)
    out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else [None])
    return out


def _my_rows(rows):
    """(start, count) of this rank's rows of `rows` split over the workers as Horovod's reducescatter does: equal
    blocks, the first rows % size ranks one row more."""
    me, size = group_value("rank", rows.dtype), group_value("size", rows.dtype)
    base, extra = rows // size, rows % size
    return me * base + tf.minimum(me, extra), base + tf.cast(me < extra, rows.dtype)


def grouped_reducescatter(tensors, device_dense="", compression=None, op=Average, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0, name=None):
    """Horovod's grouped_reducescatter: each tensor reduced (Average or Sum) over every worker, of which this rank
    keeps its block of rows (dimension 0 split as Horovod does). The backends have no reduce-scatter: it is an
    all-reduce of each tensor and a slice, so it moves size() times the bytes of a true one. Differentiable (the
    gradient is every rank's rows' gradients, gathered back by the all-reduce's gradient)."""
    if op not in (Average, Sum):
        raise ValueError(f"reducescatter: op={op!r}: expected commsched.tensorflow.Average or Sum")
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for i, t in enumerate(tensors):
        if t.shape.rank == 0:
            raise ValueError(f"reducescatter: tensor {i} is a scalar; it needs a dimension 0 to split")
    del device_dense
    base = auto_name("reducescatter", name)
    outs = []
    for i, t in enumerate(tensors):
        reduced = allreduce(t, compression=compression, op=op, prescale_factor=prescale_factor,
                            postscale_factor=postscale_factor, name=f"{base}.{i}", process_set=process_set)
        start, count = _my_rows(tf.shape(reduced, out_type=tf.int64)[0])
        outs.append(reduced[start:start + count])
    return outs


def reducescatter(tensor, device_dense="", compression=None, op=Average, name=None, process_set=None,
                  ignore_name_scope=False, prescale_factor=1.0, postscale_factor=1.0):
    """Horovod's reducescatter: see grouped_reducescatter."""
    del ignore_name_scope
    return grouped_reducescatter([tensor], device_dense, compression, op, process_set, prescale_factor,
                                 postscale_factor, name)[0]


def grouped_allgather(tensors, name=None, process_set=None):
    """Horovod's grouped_allgather: allgather of each tensor; returns the list."""
    base = auto_name("grouped_allgather", name)
    return [allgather(t, name=f"{base}.{i}", process_set=process_set) for i, t in enumerate(tensors)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """Every worker gets rank root_rank's tensor (a new tensor)."""
    del ignore_name_scope
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    name = auto_name("broadcast", name)
    if not 0 <= int(root_rank) < context().size:
        raise ValueError(f"broadcast '{name}': root_rank={root_rank} is not a rank (size {context().size})")
    if _native_ok(tensor.dtype):
        ticket = _native_submit(tensor, name, "broadcast", root=root_rank, flush=_holding())
        return _native_wait(ticket, tensor.dtype, tensor.shape)
    out = _host(lambda x: _run(lambda: hc.broadcast(context(), x, int(root_rank), name)), [tensor], tensor.dtype,
                name)
    out.set_shape(tensor.shape)
    return out


def broadcast_variables(variables, root_rank, process_set=None, name=None):
    """Assigns rank root_rank's values to `variables` on every worker (all broadcasts in flight at once). name: the
    tasks' prefix (default: numbered by call, the same on every rank while every rank makes the same calls)."""
    check_process_set(process_set)
    variables = list(variables)
    if not variables:
        return None
    base = auto_name("broadcast_variables", name)
    values = [tf.convert_to_tensor(v) for v in variables]
    if all(_native_ok(v.dtype) for v in values):
        tickets = [_native_submit(v, f"{base}.{i}", "broadcast", root=root_rank, flush=_holding())
                   for i, v in enumerate(values)]
        outs = [_native_wait(k, v.dtype, v.shape) for k, v in zip(tickets, values)]
        return tf.group(*[v.assign(o) for v, o in zip(variables, outs)])

    def body(*xs):
        ctx = context()
        ops = [hc.broadcast(ctx, x, int(root_rank), f"{base}.{i}") for i, x in enumerate(xs)]
        return [p.wait() for p in ops]
    outs = _host(body, values, [v.dtype for v in values], base)
    assigns = [v.assign(tf.reshape(o, v.shape)) for v, o in zip(variables, outs)]
    return tf.group(*assigns)


def broadcast_(variables, root_rank, name=None, process_set=None):
    """Horovod's in-place broadcast: assigns rank root_rank's values to `variables`; returns them."""
    del name
    variables = list(variables)
    broadcast_variables(variables, root_rank, process_set=process_set)
    return variables


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Rank root_rank's `obj` (any picklable object) on every worker; eager (a Python value, not a tensor)."""
    del session
    check_process_set(process_set)
    ctx = context()
    name = auto_name("broadcast_object", name)
    mine = ctx.rank == int(root_rank)
    payload = _pickled(obj) if mine else np.zeros(0, np.uint8)
    length = int(hc.broadcast(ctx, np.array([payload.size], np.int64), int(root_rank), f"{name}.length").wait()[0])
    data = hc.broadcast(ctx, payload if mine else np.zeros(length, np.uint8), int(root_rank), f"{name}.data").wait()
    return obj if mine else _unpickled(data, name, int(root_rank))


def allgather_object(obj, session=None, name=None, process_set=None):
    """Every worker's `obj` (any picklable object), as a list in rank order; eager."""
    del session
    check_process_set(process_set)
    ctx = context()
    name = auto_name("allgather_object", name)
    payload = _pickled(obj)
    sizes = hc.exchange(ctx, [payload.size], f"{name}.sizes")[:, 0].tolist()
    data = hc.allgather(ctx, payload, f"{name}.data").wait()
    offsets = np.cumsum([0] + sizes)
    return [_unpickled(data[offsets[r]:offsets[r + 1]], name, r) for r in range(ctx.size)]


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=None):
    """Horovod's: a function that returns rank root_rank's value of its argument (broadcast_object)."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def _pickled(obj):
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)


def _unpickled(data, name, rank):
    try:
        return pickle.loads(data.tobytes())
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
        raise RuntimeError(f"'{name}': could not decode rank {rank}'s object: {e}") from e


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Rows splits[j] of `tensor` go to rank j (equal blocks by default); returns (output, received_splits), as
    Horovod's TensorFlow alltoall does. Every rank's input is broadcast to all (no point-to-point in the backends)."""
    del ignore_name_scope
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    name = auto_name("alltoall", name)
    inputs = [tensor] if splits is None else [tensor, tf.cast(splits, tf.int32)]

    def body(x, s=None):
        return _run(lambda: hc.alltoall(context(), x, s, name))
    out, received = _host(body, inputs, [tensor.dtype, tf.int32], name)
    out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else None)
    received.set_shape([None])
    return out, received


def join():
    """Waits until every worker has called join(); returns the rank that joined last. On the PS and Gloo a joined
    rank stands in with zeros for the sums the others still compute."""
    out = _host(lambda: np.int32(hc.join(context(), auto_name("join", None))), [], tf.int32, "join")
    return out


# ---- two-phase operations: submit now, wait later (gradients) ----

def submit_reduce(tensor, name, priority, op, compression, prescale, postscale):
    """Submits one gradient's sum as a task left to the policy (it may hold it until backward_done); returns an
    int64 ticket for wait_ticket (given the same op and postscale)."""
    if _native_ok(tensor.dtype):
        return _native_submit(_scaled(tensor, prescale), name, priority=priority, compression=compression)

    def body(x):
        pending = hc.reduce(context(), x, name, op, priority=priority, compression=compression, prescale=prescale,
                            postscale=postscale, hold=True)
        with _lock:
            ticket = next(_pending_ids)
            _pending[ticket] = pending
        return np.int64(ticket)
    return _host(body, [tensor], tf.int64, name + ".submit")


def wait_ticket(ticket, dtype, shape, name, op, postscale):
    if _native_ok(dtype):
        return _postscaled(_native_wait(ticket, dtype, shape), op, postscale)

    def body(t):
        with _lock:
            pending = _pending.pop(int(t))
        return pending.wait()
    out = _host(body, [ticket], dtype, name + ".wait")
    out.set_shape(shape)
    return out


def engine_call(method, name):
    """Calls a no-argument Context method (backward_done, iteration_end) as a host callback; returns its output."""
    def body():
        getattr(context(), method)()
        return np.int64(0)
    return _host(body, [], tf.int64, name)

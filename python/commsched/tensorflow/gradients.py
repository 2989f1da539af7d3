"""Gradient averaging through the scheduler: DistributedGradientTape and the reduction Keras's optimizer shares.

Each variable's gradient becomes one scheduler task whose priority is the variable's position in the list asked for
(model.trainable_variables: forward order, so the first layers are the most urgent). The tasks are submitted in
reverse order, the order backprop produces the gradients: inside tf.function each submission runs as soon as its
gradient is computed (stateful ops run in program order, and TensorFlow computes the other gradients meanwhile),
so the last layers communicate while the first ones are still being differentiated. In eager mode the tape computes
every gradient before returning, so communication starts after backward. Every gradient is submitted before the
engine is told the backward is over (backward_done: BSP and MG-WFBP release their held tasks then), and only then
does anything wait; the step ends with iteration_end (the auto-tuner's clock).
"""
import numpy as np
import tensorflow as tf

from commsched.tensorflow import ops

_registered_model = []  # the gradient sizes given to Context.set_model (the tuner's key), once per process


def _variable_name(variable, index):
    return getattr(variable, "path", None) or getattr(variable, "name", None) or f"var{index}"


def _register_model(variables):
    if not _registered_model:
        # Keras 3 variables give shape as a tuple and dtype as a string; tf.Variable as TensorShape and DType.
        sizes = [int(np.prod(tuple(v.shape))) * tf.as_dtype(v.dtype).size for v in variables]
        _registered_model.append(sizes)
        ops.context().set_model(sizes)


def tell_model(ctx):
    """A new Context (an elastic job re-formed) learns the sizes the first step told the first one."""
    if _registered_model:
        ctx.set_model(_registered_model[0])


def _check_reduce_args(grads, variables, op, gradient_predivide_factor):
    if op not in (ops.Average, ops.Sum):
        raise ValueError(f"gradients are reduced with Average or Sum, not op={op!r}")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor}: must be > 0")
    if len(grads) != len(variables):
        raise ValueError(f"{len(grads)} gradients for {len(variables)} variables")


class Submitted:
    """The gradients of one step on the wire: tickets[i] is None where grads[i] was None. wait() (or a later step,
    with the tickets kept in variables) turns each ticket back into the averaged gradient."""

    def __init__(self, tickets, names, dtypes, shapes, op, predivide):
        self.tickets, self.names, self.dtypes, self.shapes = tickets, names, dtypes, shapes
        self.op, self.predivide = op, predivide

    def wait_one(self, i, ticket=None):
        """The averaged gradient of variable i from its ticket (default: the one submitted)."""
        ticket = self.tickets[i] if ticket is None else ticket
        return ops.wait_ticket(ticket, self.dtypes[i], self.shapes[i], self.names[i], self.op, self.predivide)


def submit_gradients(grads, variables, op=ops.Average, compression=None, gradient_predivide_factor=1.0,
                     prefix="grad"):
    """Puts every gradient on the wire (last variable first, the order backprop produces them) and tells the engine
    the backward is over; waits for nothing. Returns Submitted and the op that ends the submission."""
    _check_reduce_args(grads, variables, op, gradient_predivide_factor)
    ops.context()  # a clear error before init()
    _register_model(variables)
    predivide = gradient_predivide_factor if op == ops.Average else 1.0
    spec = getattr(compression, "engine_spec", None)
    n = len(grads)
    tickets, names, dtypes, shapes = [None] * n, [None] * n, [None] * n, [None] * n
    for i in reversed([i for i, g in enumerate(grads) if g is not None]):
        dense = tf.convert_to_tensor(grads[i])  # IndexedSlices (embeddings) travel dense
        names[i] = f"{prefix}.{i}.{_variable_name(variables[i], i)}"
        dtypes[i], shapes[i] = dense.dtype, dense.shape
        tickets[i] = ops.submit_reduce(dense, names[i], i, op, spec, 1.0 / predivide, predivide)
    with tf.control_dependencies([t for t in tickets if t is not None]):
        backward_over = ops.engine_call("backward_done", "backward_done")
    return Submitted(tickets, names, dtypes, shapes, op, predivide), backward_over


def wait_ticket_for(ticket, variable, name, settings):
    """The averaged gradient of `variable` from a ticket kept since an earlier step (deferred updates)."""
    op = settings["op"]
    predivide = settings["gradient_predivide_factor"] if op == ops.Average else 1.0
    return ops.wait_ticket(ticket, tf.as_dtype(variable.dtype), tuple(variable.shape), name, op, predivide)


def end_iteration():
    """Ends the engine's iteration (the auto-tuner's clock)."""
    return ops.engine_call("iteration_end", "iteration_end")


def reduce_gradients(grads, variables, op=ops.Average, compression=None, gradient_predivide_factor=1.0,
                     prefix="grad"):
    """Averages (or sums) `grads` over every worker; None gradients stay None. Returns the list."""
    submitted, backward_over = submit_gradients(grads, variables, op, compression, gradient_predivide_factor,
                                                prefix)
    present = [i for i, t in enumerate(submitted.tickets) if t is not None]
    with tf.control_dependencies([backward_over]):
        outs = {i: submitted.wait_one(i) for i in present}
    with tf.control_dependencies(list(outs.values())):
        step_over = end_iteration()
    with tf.control_dependencies([step_over]):
        return [tf.identity(outs[i]) if i in outs else None for i in range(len(grads))]


def variable_key(variable):
    """What identifies a variable in a set (tf.Variable is not hashable by value; a Keras 3 Variable has no ref())."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


def reduce_shared_gradients(grads, variables, local, scale_local, op=ops.Average, compression=None,
                            gradient_predivide_factor=1.0, prefix="grad"):
    """reduce_gradients over the variables whose variable_key is not in `local`; the local ones keep this worker's
    gradient, divided by size() when scale_local (Horovod's scale_local_gradients)."""
    shared = [i for i, v in enumerate(variables) if variable_key(v) not in local]
    reduced = reduce_gradients([grads[i] for i in shared], [variables[i] for i in shared], op, compression,
                               gradient_predivide_factor, prefix)
    out = list(grads)
    for i, g in zip(shared, reduced):
        out[i] = g
    for i in sorted(set(range(len(grads))) - set(shared)):  # only the local ones: no division for the rest
        out[i] = _local_gradient(grads[i], scale_local)
    return out


def _local_gradient(grad, scale):
    if grad is None or not scale:
        return grad
    n = ops.group_value("size", grad.dtype)  # read when it runs: an elastic job's size may change
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / n, grad.indices, grad.dense_shape)
    return grad / n


class _DistributedGradientTape:
    """Delegates to the wrapped tf.GradientTape; gradient() returns the averaged gradients (those of registered local
    sources stay this worker's own)."""

    def __init__(self, tape, compression, op, gradient_predivide_factor, scale_local_gradients):
        self._tape = tape
        self._compression = compression
        self._op = ops.resolve_op(None, op)
        self._predivide = gradient_predivide_factor
        self._scale_local = scale_local_gradients
        self._local = set()

    def register_local_source(self, source):
        """Horovod's: `source`'s gradient is not reduced (model parallelism: a worker-local layer); with
        scale_local_gradients (the default) it is divided by size(), as Horovod does."""
        self._local.add(variable_key(source))

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        reduced = reduce_shared_gradients(tf.nest.flatten(grads), tf.nest.flatten(sources), self._local,
                                          self._scale_local, self._op, self._compression, self._predivide)
        return tf.nest.pack_sequence_as(grads, reduced)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def __getattr__(self, name):  # watch(), stop_recording(), reset(), ... of the wrapped tape
        return getattr(self._tape, name)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=None, sparse_as_dense=False,
                            op=ops.Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=None, scale_local_gradients=True):
    """Horovod's DistributedGradientTape: wraps a tf.GradientTape (before or after recording) so gradient() returns
    the gradients averaged over every worker, each variable's gradient a scheduler task. Sparse gradients travel
    dense; num_groups/groups are accepted for compatibility (commsched schedules per tensor, and partitions and
    fuses by its own knobs). register_local_source(v) keeps v's gradient local (scale_local_gradients: divided by
    size())."""
    del device_dense, device_sparse, sparse_as_dense, num_groups, groups
    ops.check_process_set(process_set)
    return _DistributedGradientTape(gradtape, compression, op, gradient_predivide_factor, scale_local_gradients)


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=None,
                                   sparse_as_dense=False, op=ops.Average, gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None, process_set=None, local_layers=None,
                                   scale_local_gradients=True):
    """Horovod's: DistributedGradientTape whose local_layers' (a Keras layer or a list of them) trainable weights
    keep their local gradients (register_local_source)."""
    layers = keras_layers(local_layers, "PartialDistributedGradientTape")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    for variable in (v for layer in layers for v in layer.trainable_weights):
        tape.register_local_source(variable)
    return tape


def keras_layers(local_layers, caller):
    """local_layers (None, a Keras layer or an iterable of them) as a list; anything else is named in the error."""
    import keras
    if local_layers is None:
        return []
    layers = [local_layers] if isinstance(local_layers, keras.layers.Layer) else list(local_layers)
    for layer in layers:
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError(f"{caller}: local_layers holds {layer!r}, not a Keras layer")
    return layers

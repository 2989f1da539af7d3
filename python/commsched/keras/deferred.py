"""Cross-iteration overlap for Keras 3 (the twin of commsched.torch's): a step's averaged gradients are applied at
the start of the next forward, so the first layers compute while the last layers' gradients are still on the wire.

Where it stays exact: the update of each variable must happen before anything reads it again. Inside one compiled
train function TensorFlow orders operations on a variable in program order (automatic control dependencies, per
variable), so the pending updates are written, one conditional per variable in the model's variable order (the
first layers first), at the start of the outermost Layer call: the forward's read of the first layer's kernel waits
for that variable's update only, while later variables' gradients are still arriving. Each update is the wrapped
optimizer's own apply() over that one variable with the step counter held back, so the math is Keras's (Adam's bias
correction and learning-rate schedules see the same step number as a single apply over all variables).

Where it is not used (synchronous apply, as without this module, with one warning saying why): an optimizer whose
update couples variables (global_clipnorm, EMA, gradient accumulation, LossScaleOptimizer), an optimizer not built
before the train function was traced (model.fit builds it first; a custom loop calls
optimizer.build(model.trainable_variables) before its first step), an apply() over other variables than it was built
with, and COMMSCHED_CROSS_ITERATION=0 or DistributedOptimizer(cross_iteration=False).

Reading weights outside a Layer call sees the previous step's: Model.fit (at its end), evaluate, predict, get_weights,
save and save_weights apply what is pending first (patched here); a custom loop calls optimizer.flush() after its last
step, as with torch.
"""
import threading
import warnings
import weakref

import keras
import tensorflow as tf

from commsched import _runtime_core as core
from commsched.tensorflow import gradients

_states = weakref.WeakSet()       # every DeferredUpdates alive (one per wrapped, built optimizer)
_local = threading.local()        # depth of nested Layer calls on this thread
_patched = []


def coupling_reason(optimizer):
    """Why this optimizer's update cannot be split per variable, or None."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return "it is a LossScaleOptimizer (one finite check over every gradient)"
    for attr, what in (("global_clipnorm", "global_clipnorm clips by the norm of every gradient"),
                       ("use_ema", "use_ema averages every variable at each update"),
                       ("gradient_accumulation_steps", "gradient_accumulation_steps accumulates across steps")):
        if getattr(optimizer, attr, None):
            return what
    return None


class DeferredUpdates:
    """The pending step of one optimizer: a ticket per variable (0: nothing pending), kept in variables so that one
    compiled function submits and a later one waits."""

    def __init__(self, optimizer, base, variables, settings):
        self.optimizer, self.base, self.variables, self.settings = optimizer, base, list(variables), settings
        with tf.init_scope():
            self.tickets = [tf.Variable(0, dtype=tf.int64, trainable=False, name=f"commsched_ticket_{i}")
                            for i in range(len(self.variables))]
        ids = [id(v) for v in self.variables]
        self._ids = ids
        self.names = [f"keras.grad.{i}.{gradients._variable_name(v, i)}" for i, v in enumerate(self.variables)]
        self.hooked_eagerly = False
        self.hooked_graphs = weakref.WeakSet()  # graphs whose traced forward applies this state's updates first
        self.deferring = False  # whether the last apply() traced (or run eagerly) deferred its update
        _states.add(self)
        _install_patches()

    def covers(self, variables):
        return [id(v) for v in variables] == self._ids

    def hook_is_before(self):
        """Whether this step's forward applied the pending updates before reading any weight."""
        if tf.inside_function():
            return tf.compat.v1.get_default_graph() in self.hooked_graphs
        return self.hooked_eagerly

    def apply_pending(self):
        """Applies every pending update (eagerly, or as operations of the function being traced). Returns an op
        that completes after them."""
        reads = [t.read_value() for t in self.tickets]
        applied = [tf.cond(tf.not_equal(reads[i], 0), lambda i=i: self._apply_one(i, reads[i]),
                           lambda: tf.constant(False))
                   for i in range(len(self.variables))]
        if not applied:
            return tf.no_op()
        one_step = tf.cast(tf.reduce_any(tf.stack(applied)), self.optimizer.iterations.dtype)
        return self.optimizer.iterations.assign_add(one_step)

    def _apply_one(self, i, ticket):
        variable = self.variables[i]
        grad = gradients.wait_ticket_for(ticket, variable, self.names[i], self.settings)
        self.base.apply(self.optimizer, [grad], [variable])
        self.optimizer.iterations.assign_sub(1)  # apply() counted a step; the step counts once, after every variable
        self.tickets[i].assign(0)
        return tf.constant(True)

    def forget(self):
        """The group broke: the pending update's gradients will never be averaged, so it is dropped, not applied
        (an elastic state rolls the weights back to its last commit)."""
        for ticket in self.tickets:
            ticket.assign(0)
        self.deferring = self.hooked_eagerly = False

    def defer(self, grads):
        """Puts this step's gradients on the wire and keeps their tickets for the next forward."""
        settings = self.settings
        self.deferring = True
        if not tf.inside_function():
            self.hooked_eagerly = False  # the next eager step defers again only after its forward applied these
        submitted, backward_over = gradients.submit_gradients(
            list(grads), self.variables, settings["op"], settings["compression"],
            settings["gradient_predivide_factor"], prefix="keras.grad")
        kept = [self.tickets[i].assign(t) for i, t in enumerate(submitted.tickets) if t is not None]
        with tf.control_dependencies(kept + [backward_over]):
            return gradients.end_iteration()


def flush_all():
    """Applies what every optimizer has pending (eager): before weights are read outside a Layer call."""
    for state in list(_states):
        state.apply_pending()


def _before_forward(args):
    if any(isinstance(a, keras.KerasTensor) for a in args):
        return  # Keras's symbolic build: no data flows
    for state in list(_states):
        state.apply_pending()
        if tf.inside_function():
            state.hooked_graphs.add(tf.compat.v1.get_default_graph())
        else:
            state.hooked_eagerly = True


def _install_patches():
    """Layer.__call__ applies pending updates at the outermost call; fit, evaluate, predict, get_weights and save
    flush."""
    if _patched:
        return
    layer_call = keras.layers.Layer.__call__

    def call(self, *args, **kwargs):
        depth = getattr(_local, "depth", 0)
        if depth == 0 and _states:
            _before_forward(args)
        _local.depth = depth + 1
        try:
            return layer_call(self, *args, **kwargs)
        finally:
            _local.depth = depth
    keras.layers.Layer.__call__ = call
    # evaluate/predict too: fit's validation calls evaluate, whose function may have been traced before any update
    # was deferred (an evaluate before fit), so its forward would not apply them.
    for cls, name, after in ((keras.Model, "fit", True), (keras.Model, "evaluate", False),
                             (keras.Model, "predict", False), (keras.layers.Layer, "get_weights", False),
                             (keras.Model, "save", False), (keras.Model, "save_weights", False)):
        setattr(cls, name, _flushing(getattr(cls, name), after))
    _patched.append(True)


def _flushing(method, after):
    def wrapper(self, *args, **kwargs):
        if not after:
            flush_all()
        result = method(self, *args, **kwargs)
        if after:
            flush_all()
        return result
    wrapper.__wrapped__ = method
    wrapper.__doc__ = method.__doc__
    return wrapper


def enabled(optimizer, requested):
    """Whether `optimizer` runs with cross-iteration overlap: requested (None: COMMSCHED_CROSS_ITERATION, default
    on) and its update splits per variable; says once why not when it was asked for and cannot."""
    if requested is None:
        requested = core.cross_iteration_default()
    if not requested:
        return False
    reason = coupling_reason(optimizer)
    if reason:
        warnings.warn(f"commsched.keras: no cross-iteration overlap for {type(optimizer).__name__}: {reason}; "
                      "its update waits for every gradient in the step")
        return False
    return True

"""Horovod's elastic API for TensorFlow 2 (horovod.tensorflow.elastic): training that survives the loss of workers
and lets new ones join. A custom loop:

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)   # or TensorFlowState(variables)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, EPOCHS):
            for state.batch in range(state.batch, BATCHES):
                train_step(...)            # a tf.function with hvd.DistributedGradientTape
                state.commit()
            state.batch = 0

    train(state)

Keras's model.fit: commsched.keras.elastic (KerasState and the commit/update callbacks). Run it with `commsched launch
-w 4 -s 0 --min-workers 2 -- python3 train.py` (README, "Elastic training").

It is commsched.torch.elastic's mechanism (commsched._elastic_state: the states' base, the run() loop;
commsched._elastic: the membership). What is TensorFlow's here: a failed collective surfaces as a TensorFlow error
(the native ops' "commsched: communication of ... failed", or a host callback's HorovodInternalError) and run()
treats it as Horovod's HorovodInternalError; re-forming makes a new Context and points the native ops at it
(commsched.tensorflow.init), and averages read the number of workers when they run, so a tf.function (model.fit's
train function) traced before the re-forming needs no retracing; hvd.rank() and hvd.size() give the new
generation's values. Eager mode only (no TF1 sessions).
"""
import tensorflow as tf

from commsched import _elastic_state
from commsched._elastic_state import ElasticError, HostsUpdatedInterrupt, ObjectState, State  # noqa: F401
from commsched._runtime_core import HorovodInternalError
from commsched.tensorflow import ops

# How a failed collective reads inside a TensorFlow error: the native CommschedWait kernel's message, and a host
# callback's exception (its type name and message are in the error TensorFlow raises).
_COLLECTIVE_FAILED = ("commsched: communication of", "HorovodInternalError")


class _TensorFlowRuntime(_elastic_state.Runtime):
    caller = ops.CALLER

    def broadcast_object(self, obj, root_rank, name):
        return ops.broadcast_object(obj, root_rank, name=name)

    def restart(self):
        from commsched import tensorflow as hvd  # the package imports this module
        hvd.restart_for_membership()

    def internal_error(self, error):
        if isinstance(error, HorovodInternalError):
            return error
        if isinstance(error, tf.errors.OpError) and any(m in error.message for m in _COLLECTIVE_FAILED):
            return HorovodInternalError(error.message)
        return None


_RUNTIME = _TensorFlowRuntime()
_elastic_state.register(ops.CALLER, _RUNTIME)


def run(func):
    """Horovod's @hvd.elastic.run: calls func(state, ...) and, when a worker is lost (a failed collective) or workers
    wait to join (HostsUpdatedInterrupt), rolls back to the last commit, re-forms the group, syncs the state from
    rank 0 and calls func again. Raises ElasticError on every process when fewer than COMMSCHED_MIN_WORKERS remain.
    Without an elastic store (COMMSCHED_ELASTIC_STORE) it calls func once."""
    return _elastic_state.run(func, _RUNTIME)


def _values(variables):
    """Copies of the variables' values (tf.Variable and Keras 3 variables alike)."""
    return [tf.convert_to_tensor(v).numpy() for v in variables]


def _assign(variables, values):
    for variable, value in zip(variables, values):
        variable.assign(value)


def _no_session(session):
    if session is not None:
        raise ValueError("commsched.tensorflow.elastic runs eagerly (TensorFlow 2): session= is TensorFlow 1's")


class TensorFlowState(ObjectState):
    """A list of tf.Variable (copied at each commit, broadcast from rank 0 at each sync) and any picklable
    attributes. variables=None: none (Horovod's default, TensorFlow 1's global variables, is empty in TensorFlow 2)."""

    def __init__(self, variables=None, session=None, **kwargs):
        _no_session(session)
        self.variables = list(variables or [])
        self._saved_values = _values(self.variables)
        super().__init__(**kwargs)

    def save(self):
        self._saved_values = _values(self.variables)
        super().save()

    def restore(self):
        _assign(self.variables, self._saved_values)
        super().restore()

    def sync(self):
        ops.broadcast_variables(self.variables, 0, name="elastic.variables")
        self._saved_values = _values(self.variables)  # a joiner's rollback point is the state it received
        super().sync()


class TensorFlowKerasState(ObjectState):
    """A Keras 3 model's weights and its optimizer's variables (copied at each commit, broadcast from rank 0 at each
    sync) and any picklable attributes. optimizer: default, the compiled model's; it is built here when it is not
    yet (as model.fit would build it), so every worker, a joiner too, has the same variables to sync."""

    def __init__(self, model, optimizer=None, backend=None, session=None, **kwargs):
        del backend  # Horovod's, for TensorFlow 1's Keras session
        _no_session(session)
        if not model.built:
            raise ValueError("TensorFlowKerasState: the model must be built first (give it a keras.Input, call "
                             "model.build(input_shape) or call it once on data)")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        self._saved_values = self._save_variables()
        super().__init__(**kwargs)

    def _variables(self):
        # weights, not variables: those include the metrics' state, which a joiner builds only in its first step.
        optimizer = list(self.optimizer.variables) if self.optimizer is not None else []
        return list(self.model.weights) + optimizer

    def _save_variables(self):
        flush = getattr(self.optimizer, "flush", None)
        if flush is not None:
            flush()  # a deferred update (cross-iteration overlap) belongs to the step being committed
        return _values(self._variables())

    def save(self):
        self._saved_values = self._save_variables()
        super().save()

    def restore(self):
        forget = getattr(self.optimizer, "forget_inflight", None)
        if forget is not None:
            forget()  # the failed step's update was never averaged: dropped, not applied
        _assign(self._variables(), self._saved_values)
        super().restore()

    def sync(self):
        ops.broadcast_variables(self._variables(), 0, name="elastic.keras")
        self._saved_values = self._save_variables()
        super().sync()

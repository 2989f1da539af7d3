"""Horovod's Keras callbacks for Keras 3: initial broadcast, metric averaging, learning-rate schedules, best model."""
import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_conversion_registry

from commsched import _host_collectives as hc
from commsched.keras import deferred
from commsched.tensorflow import gradients, ops


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Sets every worker's model (and optimizer) variables to rank root_rank's when training begins, so all ranks
    start from the same weights. Optimizer variables that do not exist yet then (an optimizer built lazily by its
    first update) are broadcast after the first batch. local_variables (Horovod's, model parallelism): variables
    each rank keeps its own."""

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        del device
        self.root_rank = root_rank
        self._local = {gradients.variable_key(v) for v in (local_variables or [])}
        self._optimizer_done = False

    def _shared(self, variables):
        return [v for v in variables if gradients.variable_key(v) not in self._local]

    def _optimizer_variables(self):
        optimizer = getattr(self.model, "optimizer", None)
        return self._shared(optimizer.variables) if optimizer is not None and optimizer.built else []

    def on_train_begin(self, logs=None):
        ops.broadcast_variables(self._shared(self.model.variables), self.root_rank)
        variables = self._optimizer_variables()
        if variables:
            ops.broadcast_variables(variables, self.root_rank)
            self._optimizer_done = True

    def on_train_batch_end(self, batch, logs=None):
        if not self._optimizer_done:
            self._optimizer_done = True
            ops.broadcast_variables(self._optimizer_variables(), self.root_rank)


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replaces each metric in the logs with its average over every worker (in the
    metrics' sorted name order, the same on every rank), so rank 0's log and checkpoints see the global values."""

    def __init__(self, device=""):
        super().__init__()
        del device

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        values = np.array([float(logs[k]) for k in names], dtype=np.float64)
        averaged = hc.reduce(ops.context(), values, f"metric_average.epoch{epoch}", hc.AVERAGE).wait()
        logs.update({k: float(v) for k, v in zip(names, averaged)})


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's: from start_epoch until end_epoch (None: to the end) the learning rate is initial_lr *
    multiplier(epoch). A constant multiplier is applied at each epoch's first batch (staircase); a callable one there
    too, or with staircase=False before every batch at the fractional epoch (epoch + batch / steps_per_epoch).
    steps_per_epoch defaults to what fit() reports.

    momentum_correction (Goyal et al., 2017): when the rate changes from lr_old to lr_new, the batch that follows runs
    with the optimizer's momentum scaled by lr_new / lr_old, restored after it; a no-op for an optimizer without a
    momentum (Adam), as in Horovod. The momentum is then read from a variable (_Momentum), so the compiled update
    sees each batch's value. Under cross-iteration overlap a step's update runs in the next step's forward, after
    this callback has moved on: the update pending is applied first (eagerly) whenever the rate or the momentum
    changes, so each step's update uses its own rate and momentum (that step loses the overlap)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        if initial_lr is None:
            raise ValueError(f"{type(self).__name__}: initial_lr is required")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.staircase = staircase or not callable(multiplier)  # a constant changes nothing within an epoch
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.momentum_correction = momentum_correction
        self._momentum = None  # the optimizer's _Momentum while this callback corrects it
        self._corrected = False  # whether the current batch runs with a corrected momentum
        self._epoch = 0

    def on_train_begin(self, logs=None):
        if not hasattr(self.model.optimizer.learning_rate, "assign"):
            raise ValueError(f"{type(self).__name__}: the optimizer's learning rate is a schedule; this callback "
                             "needs a plain rate")
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__}: pass steps_per_epoch= (fit() did not report the number "
                                 "of steps)")
        if self.momentum_correction:
            self._momentum = _Momentum.install(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch < self.start_epoch or (self.end_epoch is not None and self._epoch >= self.end_epoch):
            return
        if not self.staircase:
            self._set_rate(self._epoch + batch / self.steps_per_epoch)
        elif batch == 0:
            self._set_rate(self._epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self._corrected:
            deferred.flush_all()  # this batch's update, if deferred, runs with the corrected momentum
            self._momentum.variable.assign(float(self._momentum))
            self._corrected = False

    def _set_rate(self, epoch):
        rate = self.model.optimizer.learning_rate
        old, new = float(rate.numpy()), self.initial_lr * self.multiplier(epoch)
        if new == old:  # nothing changes: the deferred update keeps its overlap
            return
        deferred.flush_all()  # the previous step's update, if deferred, runs with the rate it was computed for
        rate.assign(new)
        if self._momentum is not None and old != 0:
            self._momentum.variable.assign(float(self._momentum) * new / old)
            self._corrected = True


class _Momentum(float):
    """An optimizer's momentum that its compiled update reads from a variable: Keras 3 bakes a plain float into the
    traced train step, so a change for one batch would never reach the update. As a float it keeps the value the
    optimizer was built with, so Keras's choices made from it (whether momentum slots exist) and saved configs stay
    as they were; converted to a tensor (ops.cast in the update) it reads the variable."""

    @classmethod
    def install(cls, model):
        """The model's optimizer's momentum as a _Momentum (made once), or None where it has no momentum."""
        optimizer = model.optimizer
        momentum = getattr(optimizer, "momentum", None)
        if isinstance(momentum, cls):
            return momentum
        if not isinstance(momentum, float) or momentum == 0:
            return None
        held = cls(momentum)
        with tf.init_scope():
            held.variable = tf.Variable(momentum, trainable=False, dtype=tf.float32, name="commsched_momentum")
        optimizer.momentum = held
        model.make_train_function(force=True)  # a train step traced before has the plain float in it
        return held


def _read_momentum(value, dtype=None, name=None, as_ref=False):
    del name, as_ref
    read = value.variable.read_value()
    return read if dtype is None else tf.cast(read, dtype)


# Ahead of float's own conversion (a constant), which a subclass of float would otherwise get.
tensor_conversion_registry.register_tensor_conversion_function_internal(_Momentum, _read_momentum, priority=-1)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warm-up (Goyal et al., 2017): over the first warmup_epochs epochs the learning rate rises batch by
    batch from initial_lr / size() to initial_lr (pass the rate already scaled by size(), as Horovod's examples do).
    momentum_correction: as LearningRateScheduleCallback (every batch of the warm-up changes the rate).
    steps_per_epoch defaults to what fit() reports."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        if warmup_epochs <= 0:
            raise ValueError(f"LearningRateWarmupCallback: warmup_epochs={warmup_epochs} must be > 0")
        # Each batch's rate is the one at its end (epoch + (batch + 1) / steps_per_epoch), as in Horovod, so the last
        # batch of the warm-up runs at initial_lr.
        super().__init__(initial_lr, lambda epoch: self.warmup_multiplier(epoch + 1 / self.steps_per_epoch),
                         start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch, verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def warmup_multiplier(self, epoch):
        """The rate's factor at a fractional epoch: 1/size at 0, rising linearly to 1 at warmup_epochs."""
        n = ops.context().size
        return 1.0 / n * (min(epoch, self.warmup_epochs) * (n - 1) / self.warmup_epochs + 1)

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate.assign(self.initial_lr)
            if self.verbose and ops.context().rank == 0:
                print(f"Epoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's: a ModelCheckpoint with save_best_only=True that saves on rank 0 only (the other ranks hold the same
    weights). monitor, verbose, mode, save_freq as Horovod's (its first argument is monitor); filepath names the
    file (Horovod's Spark estimator sets it for the user; here it is required): a .keras file, or .weights.h5 with
    save_weights_only=True. Put MetricAverageCallback before it to judge by the metrics averaged over the ranks."""

    def __init__(self, monitor="val_loss", verbose=0, mode="auto", save_freq="epoch", filepath=None,
                 save_weights_only=False, initial_value_threshold=None):
        if filepath is None:
            raise ValueError("BestModelCheckpoint: pass filepath= (a .keras file, or a .weights.h5 file with "
                             "save_weights_only=True)")
        super().__init__(filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq,
                         initial_value_threshold=initial_value_threshold)

    def _save_model(self, epoch, batch, logs):
        if ops.context().rank == 0:
            super()._save_model(epoch, batch, logs)

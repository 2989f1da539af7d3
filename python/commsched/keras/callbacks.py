"""Horovod's Keras callbacks for Keras 3: broadcast the initial state, average the metrics, warm the learning rate up."""
import keras
import numpy as np

from commsched import _host_collectives as hc
from commsched.tensorflow import ops


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Sets every worker's model (and optimizer) variables to rank root_rank's when training begins, so all ranks
    start from the same weights. Optimizer variables that do not exist yet then (an optimizer built lazily by its
    first update) are broadcast after the first batch."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        del device
        self.root_rank = root_rank
        self._optimizer_done = False

    def _optimizer_variables(self):
        optimizer = getattr(self.model, "optimizer", None)
        return list(optimizer.variables) if optimizer is not None and optimizer.built else []

    def on_train_begin(self, logs=None):
        ops.broadcast_variables(self.model.variables, self.root_rank)
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
    momentum_correction is accepted for compatibility and not applied (a Keras 3 optimizer's momentum is a constant of
    its traced update step, so changing it for one batch would not reach the update). steps_per_epoch defaults to what
    fit() reports."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        del momentum_correction
        if initial_lr is None:
            raise ValueError(f"{type(self).__name__}: initial_lr is required")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.staircase = staircase or not callable(multiplier)  # a constant changes nothing within an epoch
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
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

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch < self.start_epoch or (self.end_epoch is not None and self._epoch >= self.end_epoch):
            return
        if not self.staircase:
            self._set_rate(self._epoch + batch / self.steps_per_epoch)
        elif batch == 0:
            self._set_rate(self._epoch)

    def _set_rate(self, epoch):
        self.model.optimizer.learning_rate.assign(self.initial_lr * self.multiplier(epoch))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warm-up (Goyal et al., 2017): over the first warmup_epochs epochs the learning rate rises batch by
    batch from initial_lr / size() to initial_lr (pass the rate already scaled by size(), as Horovod's examples do).
    momentum_correction: as LearningRateScheduleCallback. steps_per_epoch defaults to what fit() reports."""

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

"""Horovod's elastic API for Keras 3's model.fit (horovod.keras.elastic, horovod.tensorflow.keras.elastic):

    state = hvd.elastic.KerasState(model, epoch=0, batch=0)   # the compiled model's weights and optimizer
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=1)]

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=1 if hvd.rank() == 0 else 0)

    train(state)

When a worker is lost, the survivors' fit() fails; run() rolls the model back to the last commit, re-forms the group,
broadcasts rank 0's state and calls train(state) again, which fits the epochs left (commsched.tensorflow.elastic says
how). As in Horovod, the epoch that was interrupted starts again from its first batch: state.batch says how far it
had come (Keras 3 runs every step of an epoch; a script that wants to skip the batches already trained feeds fit()
the data from there itself).
"""
import keras

from commsched.tensorflow.elastic import (ElasticError, HorovodInternalError, HostsUpdatedInterrupt,  # noqa: F401
                                          ObjectState, State, TensorFlowKerasState, TensorFlowState, run)


class KerasState(TensorFlowKerasState):
    """Horovod's KerasState: TensorFlowKerasState (the model's weights, its optimizer's variables, attributes)."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits `state` every batches_per_commit batches (at a batch's end) and at every epoch's end."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"CommitStateCallback: batches_per_commit={batches_per_commit} must be >= 1")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # counted afresh after every reset, alike on every rank

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps state.batch at the index of the last batch finished (0 again at each epoch's end). As in Horovod, an
    epoch that resumes reports steps - state.batch steps to the other callbacks (params['steps']; Keras 3 runs the
    steps fit() was given)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params["steps"]
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps state.epoch at the number of epochs finished over every call of fit() (Keras counts from 0 in each):
    the epoch fit() began with plus the epochs it finished."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        # + 1: a reset after state.batch went back to 0 must not train this epoch again.
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["CommitStateCallback", "ElasticError", "HorovodInternalError", "HostsUpdatedInterrupt", "KerasState",
           "ObjectState", "State", "TensorFlowKerasState", "TensorFlowState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]

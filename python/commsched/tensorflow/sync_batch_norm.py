"""SyncBatchNormalization (Horovod's): a Keras 3 BatchNormalization whose training-mode statistics are those of
every worker's batch together.

Each call in training mode sums, per channel, the rows, their squares and their count on this worker, and reduces
the three with one all-reduce (Sum): mean = sum / count and variance = E[x^2] - mean^2 over every worker's rows, so
workers with unequal batch sizes weigh each row alike. The all-reduce is differentiable (its gradient is the same
sum of the output gradients), so the gradient that reaches a worker's inputs is that of the sum of every worker's
loss, as with torch's SyncBatchNorm; averaging the parameter gradients (DistributedOptimizer) then gives the
gradient of the mean loss of the whole batch. The moving statistics are updated from the global mean and variance,
so they stay the same on every worker. Inference mode (training=False) uses the moving statistics and
communicates nothing.

Every worker must call the layer the same number of times in training mode, in the same order: each call is one
collective, named after the layer's path and the call's ordinal (fixed when a tf.function is traced, as for the
other unnamed operations of commsched.tensorflow).
"""
import itertools

import keras
import tensorflow as tf

from commsched.tensorflow import ops


@keras.saving.register_keras_serializable(package="commsched")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization with its batch statistics computed over every worker."""

    def __init__(self, fused=False, **kwargs):
        if fused:
            raise ValueError("SyncBatchNormalization: fused=True is not supported (the statistics are computed "
                             "unfused, then reduced over the workers); leave fused=False")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization: synchronized=True is Keras's tf.distribute synchronization; "
                             "this layer synchronizes over the commsched workers itself, leave it False")
        super().__init__(**kwargs)
        self._commsched_calls = itertools.count()

    def _moments(self, inputs, mask):
        axes = self._reduction_axes
        if mask is None:
            weights = tf.ones_like(inputs)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(inputs)), inputs.dtype)
        local = tf.stack([tf.reduce_sum(inputs * weights, axes), tf.reduce_sum(tf.square(inputs) * weights, axes),
                          tf.reduce_sum(weights, axes)])
        name = f"sync_batch_norm.{self.path or self.name}.{next(self._commsched_calls)}"
        total_sum, total_squares, count = tf.unstack(ops.allreduce(local, op=ops.Sum, name=name))
        mean = tf.math.divide_no_nan(total_sum, count)
        variance = tf.maximum(tf.math.divide_no_nan(total_squares, count) - tf.square(mean), 0.0)
        return mean, variance

#!/usr/bin/env python3
"""A Keras 3 model.fit() on MNIST-shaped data, in the shape of Horovod's TensorFlow 2 Keras MNIST example: only the
import differs (commsched.tensorflow.keras for horovod.tensorflow.keras), plus what Keras 3 itself changed
(compile(jit_compile=False) instead of experimental_run_tf_function=False, a .keras checkpoint). The images are made
here (no download): noise plus a per-class pattern, so the loss really falls.

    commsched launch -w 2 -s 1 -- python3 examples/tensorflow/tensorflow2_keras_mnist.py
"""
import argparse

import numpy as np
import tensorflow as tf

import commsched.tensorflow.keras as hvd

parser = argparse.ArgumentParser(description="Keras MNIST-shaped example",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--epochs", type=int, default=24)
parser.add_argument("--steps-per-epoch", type=int, default=500, help="over every worker together")
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--checkpoint-dir", default=None, help="rank 0 saves a checkpoint per epoch here")
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")


def mnist_like(count, seed):
    """Images of 10 classes: a fixed random pattern per class plus noise (the same patterns on every rank)."""
    patterns = np.random.RandomState(0).rand(10, 28, 28).astype(np.float32)
    rs = np.random.RandomState(seed)
    labels = rs.randint(0, 10, count)
    images = 0.5 * patterns[labels] + 0.5 * rs.rand(count, 28, 28).astype(np.float32)
    return images, labels


mnist_images, mnist_labels = mnist_like(6000, seed=1 + hvd.rank())  # each rank its own shard
dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis], tf.float32), tf.cast(mnist_labels, tf.int64))
)
dataset = dataset.repeat().shuffle(10000).batch(args.batch_size)

mnist_model = tf.keras.Sequential([
    tf.keras.Input(shape=(28, 28, 1)),
    tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
    tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation="softmax"),
])

# Horovod: adjust learning rate based on number of workers.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

# Host callbacks cannot be compiled by XLA (Keras 3 turns it on by default where a GPU is present).
mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
                    jit_compile=False)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final accuracy; warm up instead.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0 and args.checkpoint_dir:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(args.checkpoint_dir + "/checkpoint-{epoch}.keras"))

# Horovod: write logs on worker 0.
verbose = 2 if hvd.rank() == 0 else 0

# Train the model. Horovod: adjust number of steps based on number of workers.
history = mnist_model.fit(dataset, steps_per_epoch=args.steps_per_epoch // hvd.size(), callbacks=callbacks,
                          epochs=args.epochs, verbose=verbose)
if hvd.rank() == 0:
    losses = history.history["loss"]
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} epochs on {hvd.size()} workers", flush=True)

#!/usr/bin/env python3
"""Synthetic-data throughput of a Keras application model trained with a TensorFlow 2 GradientTape, in the shape of
Horovod's TensorFlow 2 benchmark: only the import differs (commsched.tensorflow for horovod.tensorflow).

    commsched launch -w 2 -s 1 -- python3 examples/tensorflow/tensorflow2_synthetic_benchmark.py
    COMMSCHED_POLICY=wfbp commsched launch -w 2 -s 1 -- python3 examples/tensorflow/tensorflow2_synthetic_benchmark.py

--image-size (not in Horovod's script) shrinks the images for a quick run on a CPU.
"""
import argparse
import timeit

import numpy as np
import tensorflow as tf
from tensorflow.keras import applications

import commsched.tensorflow as hvd

parser = argparse.ArgumentParser(description="TensorFlow 2 synthetic benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="fp16 compression on the wire")
parser.add_argument("--model", type=str, default="ResNet50", help="model to benchmark (tf.keras.applications)")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--image-size", type=int, default=224, help="image height and width")
parser.add_argument("--num-warmup-batches", type=int, default=10, help="number of warm-up batches")
parser.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
args = parser.parse_args()
args.cuda = not args.no_cuda

hvd.init()

# One GPU per process, where there are GPUs.
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus and args.cuda:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

shape = (args.image_size, args.image_size, 3)
model = getattr(applications, args.model)(weights=None, input_shape=shape)
opt = tf.optimizers.SGD(0.01)

data = tf.random.uniform([args.batch_size, *shape])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)


@tf.function
def benchmark_step(first_batch):
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, probs)
    # Every rank's gradients are averaged; each variable's gradient is a scheduler task.
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))
    # Rank 0's initial weights and optimizer state go to every rank after the first step (the optimizer's variables
    # exist only once it has run).
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
device = "GPU" if gpus and args.cuda else "CPU"
log(f"Number of {device}s: {hvd.size()}")

log("Running warmup...")
benchmark_step(first_batch=True)
timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)

log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
    img_secs.append(img_sec)

img_sec_mean = np.mean(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} +-{hvd.size() * img_sec_conf:.1f}")

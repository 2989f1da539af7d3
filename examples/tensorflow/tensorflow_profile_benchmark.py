#!/usr/bin/env python3
"""Step time of a model profile's tensors with emulated compute, trained by a TensorFlow 2 script in Horovod's shape
(DistributedGradientTape inside tf.function), or with --api keras a Keras model trained by commsched.keras's
DistributedOptimizer (cross-iteration overlap unless --no-cross-iteration): the TensorFlow twin of
examples/pytorch_profile_benchmark.py.

    commsched launch -w 4 -s 2 --emulate-rate 2gbit -- python3 examples/tensorflow/tensorflow_profile_benchmark.py \\
        --profile resnet50 --policy wfbp
    commsched launch -w 4 -s 2 --emulate-rate 2gbit -- python3 examples/tensorflow/tensorflow_profile_benchmark.py \\
        --profile resnet50 --policy bytescheduler

The model has the profile's real gradient tensors (workload/profiles/*.json), one block per profiled layer in forward
order; each block sleeps for its layer's profiled forward time, and in backward for its backward time, then gives each
of its variables a constant gradient. Prints ms/step (mean and 95% interval over --steps steps after --warmup) and
writes it with the configuration to --result (rank 0).
"""
import argparse
import json
import os
import pathlib
import time

import numpy as np
import tensorflow as tf

import commsched.tensorflow as hvd
from commsched._C import mean_ci95

PROFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "workload", "profiles")
DTYPES = {"f32": tf.float32, "f16": tf.float16, "bf16": tf.bfloat16, "f64": tf.float64}


def sleeper(seconds):
    """An op that waits `seconds` (the GIL released) and passes its input through. Not stateful, so TensorFlow does
    not chain it behind the communication ops in program order: it runs when its input is ready, as compute does."""
    def wait(x):
        time.sleep(seconds)
        return x
    return lambda x: tf.numpy_function(wait, [x], x.dtype, stateful=False)


class ProfiledLayer:
    def __init__(self, index, tensors, compute_scale):
        self.forward = sleeper(compute_scale * sum(t["forward_ms"] for t in tensors) / 1e3)
        self.backward = sleeper(compute_scale * sum(t["backward_ms"] for t in tensors) / 1e3)
        self.variables = [tf.Variable(tf.zeros([t["elements"]], DTYPES[t.get("dtype", "f32")]),
                                      name=f"layer{index}.{t['name']}") for t in tensors]

    def __call__(self, x):
        return self.run(x, [v.read_value() for v in self.variables])

    def run(self, x, values):
        @tf.custom_gradient
        def block(x, *weights):
            def grad(dy):
                dy = self.backward(dy)
                g = tf.reduce_mean(dy)
                return [dy] + [tf.fill(tf.shape(w), tf.cast(g, w.dtype)) for w in weights]
            return tf.identity(self.forward(x)), grad
        return block(x, *values)


def keras_model(layers):
    """The same blocks as a Keras model (Keras variables, forward order), for commsched.keras's optimizer."""
    import keras

    class Block(keras.layers.Layer):
        def __init__(self, index, layer):
            super().__init__(name=f"block{index}")  # names the tasks: the same on every rank
            self.layer = layer
            self.weights_ = [self.add_weight(shape=tuple(v.shape), initializer="zeros", dtype=v.dtype.name,
                                             name=v.name.split(":")[0].replace("/", ".")) for v in layer.variables]

        def call(self, x):
            return self.layer.run(x, [tf.convert_to_tensor(w) for w in self.weights_])

    class Profiled(keras.Model):
        def __init__(self):
            super().__init__()
            self.blocks = [Block(i, layer) for i, layer in enumerate(layers)]

        def call(self, x):
            for block in self.blocks:
                x = block(x)
            return tf.reduce_sum(x)
    return Profiled()


def load_layers(name, compute_scale):
    path = name if name.endswith(".json") else os.path.join(PROFILES, name + ".json")
    with open(path) as f:
        profile = json.load(f)
    by_layer = {}
    for t in profile["tensors"]:
        by_layer.setdefault(t["layer"], []).append(t)
    compute_ms = compute_scale * sum(t["forward_ms"] + t["backward_ms"] for t in profile["tensors"])
    return profile["name"], [ProfiledLayer(k, by_layer[k], compute_scale) for k in sorted(by_layer)], compute_ms


def run_until_tuned(step, ctx):
    """Steps while the live tuner runs its trials (so only what follows is timed); returns how many."""
    count = 0
    while not ctx.tuner_state()["finished"]:
        step()
        count += 1
    return count


def timed(step, warmup, steps):
    """Milliseconds of each of `steps` steps after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    stamps = [time.perf_counter()]
    for _ in range(steps):
        step()
        stamps.append(time.perf_counter())
    return [1e3 * (b - a) for a, b in zip(stamps, stamps[1:])]


def ci95(values):
    """Half-width of the 95% interval of the mean (Student t, the engine's one table); 0 below two values."""
    return mean_ci95([float(v) for v in values])[1]


def report(summary, path):
    line = "{profile} (tensorflow, {api}{xi}): {policy}, {workers} workers: {step_ms:.1f} +- {step_ms_ci95:.1f} " \
           "ms/step (compute {compute_ms:.1f} ms, {gradient_mib:.1f} MiB of gradients)"
    print(line.format(xi=" + cross-iteration" if summary["cross_iteration"] else "", **summary), flush=True)
    if path:
        pathlib.Path(path).write_text(json.dumps(summary))


def tape_step(layers, x, a):
    """Horovod's TensorFlow 2 shape: DistributedGradientTape, then a plain optimizer, in one tf.function."""
    del a
    variables = [v for layer in layers for v in layer.variables]
    opt = tf.keras.optimizers.SGD(1e-3, momentum=0.9)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = x
            for layer in layers:
                y = layer(y)
            loss = tf.reduce_sum(y)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
    return step, variables, None


def keras_step(layers, x, a):
    """A Keras model and commsched.keras's DistributedOptimizer, built before the step is traced (so the update can
    be deferred to the next forward)."""
    import keras

    import commsched.keras as khvd
    model = keras_model(layers)
    model(x)
    opt = khvd.DistributedOptimizer(keras.optimizers.SGD(1e-3, momentum=0.9), cross_iteration=a.cross_iteration)
    opt.build(model.trainable_variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = model(x)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
    return step, model.trainable_variables, opt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="resnet50", help="a name in workload/profiles or a .json path")
    ap.add_argument("--compute-scale", type=float, default=1.0, help="multiplies the profiled compute times")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--policy", help="wfbp, bytescheduler, ... (default: COMMSCHED_POLICY)")
    ap.add_argument("--tune", action="store_true", help="auto-tune partition size and credit while training")
    ap.add_argument("--result")
    ap.add_argument("--api", choices=["tape", "keras"], default="tape",
                    help="tape: DistributedGradientTape; keras: commsched.keras.DistributedOptimizer")
    ap.add_argument("--cross-iteration", action=argparse.BooleanOptionalAction, default=None,
                    help="--api keras: the library default (on) unless given; --no-cross-iteration waits in apply()")
    a = ap.parse_args()

    hvd.init(policy=a.policy, tune=a.tune or None)
    name, layers, compute_ms = load_layers(a.profile, a.compute_scale)
    x = tf.fill([4], 1.0 + hvd.rank())
    step, variables, opt = (keras_step if a.api == "keras" else tape_step)(layers, x, a)
    ctx = hvd.context()
    tuning_steps = run_until_tuned(step, ctx) if a.tune else 0
    ms = timed(step, a.warmup, a.steps)
    gradient_bytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)
    if opt is not None:
        opt.flush()
    deferred = bool(opt is not None and opt.cross_iteration_active())
    summary = dict(profile=name, framework="tensorflow", api=a.api, cross_iteration=deferred, policy=ctx.policy,
                   workers=hvd.size(),
                   gradient_mib=gradient_bytes / 2**20, compute_ms=compute_ms, steps=a.steps, tuned=bool(a.tune),
                   tuning_steps=tuning_steps, knobs=dict(ctx.knobs()))
    summary.update(step_ms=float(np.mean(ms)), step_ms_ci95=ci95(ms))  # the fields profile_vs_torch.sh reads
    if hvd.rank() == 0:
        report(summary, a.result)
    hvd.shutdown()


if __name__ == "__main__":
    main()

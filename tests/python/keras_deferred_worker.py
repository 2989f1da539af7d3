"""Single-process checks of commsched.keras's cross-iteration mode (one rank: the average is the gradient itself, so
every run must match plain Keras training within float rounding):
  - a custom loop in tf.function, optimizer built before the first step: deferred, exact after flush();
  - the same loop run eagerly: deferred, exact;
  - an optimizer built inside the traced step: exact (deferred only if TensorFlow traces the step again after the
    variables are made, as it does today);
  - global_clipnorm (couples every variable): one warning, not deferred, exact.
Prints one line per case and 'keras deferred ok' at the end; exits 1 on the first failure."""
import sys
import warnings

import keras
import numpy as np
import tensorflow as tf

import commsched.keras as khvd

TOLERANCE = 1e-6
STEPS = 6


def model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input([5]), keras.layers.Dense(7, activation="tanh"), keras.layers.Dense(1)])


def data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(16, 5)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")


def train(opt, eager, build_first, distributed):
    m = model()
    x, y = data()
    if build_first:
        opt.build(m.trainable_variables)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((m(x) - y) ** 2)
        grads = tape.gradient(loss, m.trainable_variables)
        opt.apply(grads, m.trainable_variables)
    step = step if eager else tf.function(step)
    for _ in range(STEPS):
        step()
    if distributed:
        opt.flush()
    return m, opt


def check(name, make_opt, eager=False, build_first=True, expect_deferred=True):
    reference, _ = train(make_opt(), eager, build_first=True, distributed=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist, opt = train(khvd.DistributedOptimizer(make_opt()), eager, build_first, distributed=True)
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(dist.get_weights(), reference.get_weights()))
    deferred = opt.cross_iteration_active()
    said = [str(w.message) for w in caught if "cross-iteration" in str(w.message)]
    print(f"{name}: deferred={deferred} max difference {worst:.2e} warnings={said}", flush=True)
    if worst > TOLERANCE or expect_deferred not in (None, deferred) or int(opt.iterations.numpy()) != STEPS:
        sys.exit(f"{name}: FAILED (iterations {int(opt.iterations.numpy())})")
    return said


def main():
    khvd.init()
    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    check("tf.function loop", adam)
    check("eager loop", adam, eager=True)
    check("built inside the traced step", adam, build_first=False, expect_deferred=None)
    said = check("global_clipnorm", lambda: keras.optimizers.SGD(0.1, momentum=0.5, global_clipnorm=0.5),
                 expect_deferred=False)
    if not any("global_clipnorm" in s for s in said):
        sys.exit("global_clipnorm: no warning said why the update is not deferred")
    print("keras deferred ok", flush=True)
    khvd.shutdown()


if __name__ == "__main__":
    main()

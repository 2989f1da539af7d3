"""Momentum correction of commsched.keras's learning-rate callbacks in model.fit, one process (run by
test_keras_api.py, with COMMSCHED_CROSS_ITERATION=1 and =0): the rate changes before every batch; the momentum the
optimizer holds during each batch must be 0.9 * lr_new / lr_old and 0.9 after it, and the weights must be those of
SGD computed by hand with each batch's rate and corrected momentum (so the compiled update saw both)."""
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402

import commsched.keras as hvd  # noqa: E402

MOMENTUM, BATCH, STEPS, EPOCHS = 0.9, 4, 3, 2


def multiplier(epoch):
    return 1.0 / (1.0 + 3.0 * epoch)


def reference(x, y, rates, momenta):
    """Keras's SGD (velocity = momentum * velocity - lr * g; w += velocity) on the mean squared error."""
    w, velocity = np.ones((2, 1)), np.zeros((2, 1))
    for k, (rate, momentum) in enumerate(zip(rates, momenta)):
        rows = slice((k % STEPS) * BATCH, (k % STEPS + 1) * BATCH)
        grad = 2.0 / BATCH * x[rows].T @ (x[rows] @ w - y[rows])
        velocity = momentum * velocity - rate * grad
        w = w + velocity
    return w


def main():
    hvd.init()
    rs = np.random.RandomState(0)
    x = rs.randn(BATCH * STEPS, 2).astype(np.float32)
    y = rs.randn(BATCH * STEPS, 1).astype(np.float32)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=MOMENTUM))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    seen = {"rate": [], "during": [], "after": []}
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: (seen["rate"].append(float(opt.learning_rate.numpy())),
                                              seen["during"].append(float(opt.momentum.variable.numpy()))),
        on_train_batch_end=lambda b, logs: seen["after"].append(float(opt.momentum.variable.numpy())))
    schedule = hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier, staircase=False)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[schedule, record])
    rates = [0.1 * multiplier(e + b / STEPS) for e in range(EPOCHS) for b in range(STEPS)]
    momenta = [MOMENTUM * new / old for new, old in zip(rates, [0.1] + rates[:-1])]
    assert np.allclose(seen["rate"], rates, rtol=1e-6), seen["rate"]
    assert np.allclose(seen["during"], momenta, rtol=1e-6), (seen["during"], momenta)
    assert np.allclose(seen["after"], MOMENTUM, rtol=1e-6), seen["after"]
    got, want = model.get_weights()[0], reference(x, y, rates, momenta)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)
    assert opt.get_config()["momentum"] == MOMENTUM  # saved configs keep the momentum the optimizer was built with
    adam = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    adam.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse", jit_compile=False)
    adam.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier, staircase=False)])  # no momentum: nothing to do
    print(f"momentum correction ok (cross-iteration={opt.cross_iteration_active()})", flush=True)


if __name__ == "__main__":
    main()

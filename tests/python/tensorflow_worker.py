"""One rank of the TensorFlow tests (run by test_tensorflow.py under `commsched launch`).

    tensorflow_worker.py api   --out DIR   every collective of commsched.tensorflow, eager and in tf.function
    tensorflow_worker.py tape  --out DIR   DistributedGradientTape training beside single-process training
    tensorflow_worker.py keras --out DIR   model.fit with commsched.keras beside single-process model.fit
    tensorflow_worker.py loss_scale --out DIR   mixed_float16 model.fit where one rank alone overflows

Each rank checks its results against values computed locally and writes its final weights to DIR/<mode>.<rank>.npz
(the test compares the ranks). Training data is generated here; every rank starts from different weights (seeded by
its rank), so equal results also show that the broadcast of rank 0's weights worked.
"""
import argparse
import os
import pathlib

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import commsched.tensorflow as hvd  # noqa: E402
from commsched.tensorflow import native  # noqa: E402

TOLERANCE = 1e-6
ROWS, FEATURES, HIDDEN, BATCH = 64, 8, 16, 8  # BATCH rows per rank per step


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {hvd.rank()}: {what}")


def data():
    """The combined data set (every rank makes the same) and this rank's shard: rank r gets rows r, r + n, ..., so
    step k's combined batch is the shards' batches k side by side."""
    rs = np.random.RandomState(7)
    x = rs.randn(ROWS * hvd.size(), FEATURES).astype(np.float32)
    y = (x @ rs.randn(FEATURES, 1) + 0.1 * rs.randn(ROWS * hvd.size(), 1)).astype(np.float32)
    return x, y, x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]


def combined_batches(x, y):
    """Batch k of the single-process run: every rank's batch k, in rank order."""
    n = hvd.size()
    for k in range(ROWS // BATCH):
        rows = np.concatenate([np.arange(r, ROWS * n, n)[k * BATCH:(k + 1) * BATCH] for r in range(n)])
        yield x[rows], y[rows]


# ---- collectives ----

def check_collectives(run):
    """`run(fn, *args)` calls fn eagerly or through tf.function."""
    n, me = hvd.size(), hvd.rank()
    base = np.arange(6, dtype=np.float64).reshape(2, 3)
    for dtype in (tf.float32, tf.float16, tf.bfloat16, tf.float64, tf.int32, tf.int64):
        t = tf.cast(base + me, dtype)
        got = run(lambda v: hvd.allreduce(v, op=hvd.Sum), t).numpy().astype(np.float64)
        check(np.allclose(got, n * base + sum(range(n))), f"allreduce Sum {dtype.name}: {got}")
    small = run(lambda v: hvd.allreduce(v, op=hvd.Sum), tf.constant([me + 1, -2], tf.int8)).numpy().tolist()
    check(small == [sum(range(1, n + 1)), -2 * n], f"allreduce Sum int8 (widened on the wire): {small}")
    flags = run(lambda v: hvd.broadcast(v, 1), tf.constant([me == 1, me == 0])).numpy().tolist()
    check(flags == [True, False], f"broadcast of bools (as bytes): {flags}")
    t = tf.constant(base + me, tf.float32)
    check(np.allclose(run(hvd.allreduce, t).numpy(), base + (n - 1) / 2), "allreduce Average")
    check(np.allclose(run(lambda v: hvd.allreduce(v, op=hvd.Min), t).numpy(), base), "allreduce Min")
    check(np.allclose(run(lambda v: hvd.allreduce(v, op=hvd.Max), t).numpy(), base + n - 1), "allreduce Max")
    outs = run(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum), t, tf.constant([me], tf.int64))
    check(np.allclose(outs[0].numpy(), n * base + sum(range(n))) and outs[1].numpy()[0] == sum(range(n)),
          "grouped_allreduce")
    mine = tf.fill([me + 1, 2], float(me))  # ranks send different numbers of rows
    gathered = run(hvd.allgather, mine).numpy()
    expect = np.concatenate([np.full([r + 1, 2], float(r)) for r in range(n)])
    check(gathered.shape == expect.shape and np.array_equal(gathered, expect), f"allgather: {gathered}")
    check(np.array_equal(run(lambda v: hvd.broadcast(v, 1), t).numpy(), base + 1), "broadcast from rank 1")
    rows = tf.constant([[100 * me + j] for j in range(n)], tf.int32)  # row j goes to rank j
    out, received = run(hvd.alltoall, rows)
    check(out.numpy().ravel().tolist() == [100 * r + me for r in range(n)] and received.numpy().tolist() == [1] * n,
          f"alltoall: {out.numpy().ravel()}")
    compressed = run(lambda v: hvd.allreduce(v, op=hvd.Sum, compression=hvd.Compression.fp16), t).numpy()
    check(np.allclose(compressed, n * base + sum(range(n)), atol=1e-2), "allreduce with fp16 compression")
    x = tf.Variable(base + me)
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(hvd.allreduce(x * x, op=hvd.Sum))
    grad = tape.gradient(y, x).numpy()
    check(np.allclose(grad, 2 * (base + me) * n), f"gradient of allreduce: {grad}")


def api(args):
    hvd.init()
    check(hvd.size() == 2 and hvd.rank() in (0, 1) and hvd.local_size() == 2, "init/size/rank/local_size")
    check(hvd.local_rank() == hvd.rank(), "local_rank")
    check_collectives(lambda fn, *a: fn(*a))
    check_collectives(lambda fn, *a: tf.function(fn)(*a))
    variables = [tf.Variable(np.full([3], float(hvd.rank()))), tf.Variable(hvd.rank() * 10, dtype=tf.int64)]
    hvd.broadcast_variables(variables, root_rank=1)
    check(variables[0].numpy().tolist() == [1.0] * 3 and variables[1].numpy() == 10, "broadcast_variables")
    import keras
    kept = hvd.allreduce(keras.Variable([float(hvd.rank())]), op=hvd.Sum).numpy().tolist()
    check(kept == [sum(range(hvd.size()))], f"allreduce of a Keras Variable: {kept}")
    gathered = hvd.allgather_object({"rank": hvd.rank(), "tag": "x" * (hvd.rank() + 1)})
    check(gathered == [{"rank": r, "tag": "x" * (r + 1)} for r in range(hvd.size())], f"allgather_object: {gathered}")
    check(hvd.broadcast_object({"from": hvd.rank()}, root_rank=1) == {"from": 1}, "broadcast_object")
    # Without an elastic store (`commsched launch --min-workers`) the function runs once, on rank 0's state.
    elastic_var = tf.Variable([float(hvd.rank())])
    elastic_state = hvd.elastic.TensorFlowState([elastic_var], epoch=10 + hvd.rank())
    result = hvd.elastic.run(lambda state, k: state.epoch + k)(elastic_state, 1)
    check(result == 11 and elastic_var.numpy().tolist() == [0.0], f"elastic.run: {result}, {elastic_var.numpy()}")
    last = hvd.join()
    check(int(last) in (0, 1), f"join returned {last}")
    backend = "gloo" if hvd.gloo_enabled() else "ps"
    kind = "native ops" if native.load() is not None else "host callbacks"
    print(f"rank {hvd.rank()}: tensorflow api ok on {backend} with {kind}", flush=True)


# ---- DistributedGradientTape ----

def mlp_variables(seed):
    rs = np.random.RandomState(seed)
    return [tf.Variable(rs.randn(FEATURES, HIDDEN).astype(np.float32) * 0.3, name="w1"),
            tf.Variable(np.zeros(HIDDEN, np.float32), name="b1"),
            tf.Variable(rs.randn(HIDDEN, 1).astype(np.float32) * 0.3, name="w2"),
            tf.Variable(np.zeros(1, np.float32), name="b2")]


def mlp_loss(v, x, y):
    h = tf.nn.relu(x @ v[0] + v[1])
    return tf.reduce_mean(tf.square(h @ v[2] + v[3] - y))


def sgd_step(variables, x, y, distributed, lr=0.05):
    with tf.GradientTape() as tape:
        loss = mlp_loss(variables, x, y)
    if distributed:
        tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, variables)
    for v, g in zip(variables, grads):
        v.assign_sub(lr * g)
    return loss


def tape(args):
    hvd.init()
    x, y, xs, ys = data()
    mine = mlp_variables(seed=hvd.rank())
    hvd.broadcast_variables(mine, root_rank=0)
    reference = mlp_variables(seed=0)
    compiled = tf.function(lambda a, b: sgd_step(mine, a, b, True))
    losses = []
    for k, (xb, yb) in enumerate(combined_batches(x, y)):
        rows = slice(k * BATCH, (k + 1) * BATCH)
        step = compiled if k % 2 == 0 else (lambda a, b: sgd_step(mine, a, b, True))  # tf.function and eager
        losses.append(float(step(xs[rows], ys[rows])))
        sgd_step(reference, xb, yb, False)
    worst = max(float(np.max(np.abs(a.numpy() - b.numpy()))) for a, b in zip(mine, reference))
    check(worst <= TOLERANCE, f"tape: weights differ from single-process training by {worst}")
    np.savez(pathlib.Path(args.out) / f"tape.{hvd.rank()}.npz", *[v.numpy() for v in mine])
    print(f"rank {hvd.rank()}: tape ok (max difference {worst:.2e}, loss {losses[0]:.4f} -> {losses[-1]:.4f})",
          flush=True)


# ---- Keras model.fit ----

def keras_model(seed):
    import keras
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input([FEATURES]), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(1)])
    return model


def keras_optimizer(kind):
    """The optimizer of a Keras run: SGD with momentum, or AdamW on a decaying schedule (its update reads the step
    counter: bias correction, schedule, weight decay)."""
    import keras
    if kind == "sgd":
        return keras.optimizers.SGD(0.05, momentum=0.9)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=3, decay_rate=0.7)
    return keras.optimizers.AdamW(schedule, weight_decay=0.01)


def keras_fit(args):
    import commsched.keras as khvd
    khvd.init()
    x, y, xs, ys = data()
    epochs = 2
    model = keras_model(seed=hvd.rank())
    opt = khvd.DistributedOptimizer(keras_optimizer(args.optimizer))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    model.evaluate(xs, ys, batch_size=BATCH, verbose=0)  # a test function traced before any update is deferred
    # validation_data: the evaluation between epochs runs a forward, which must see every update applied.
    history = model.fit(xs, ys, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                        validation_data=(xs, ys),
                        callbacks=[khvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   khvd.callbacks.MetricAverageCallback()])
    reference = keras_model(seed=0)
    reference.compile(optimizer=keras_optimizer(args.optimizer), loss="mse", jit_compile=False)
    xb, yb = (np.concatenate(parts) for parts in zip(*combined_batches(x, y)))
    reference.fit(xb, yb, batch_size=BATCH * hvd.size(), epochs=epochs, shuffle=False, verbose=0)
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights()))
    check(worst <= TOLERANCE, f"keras: weights differ from single-process training by {worst}")
    check(int(opt.iterations.numpy()) == int(reference.optimizer.iterations.numpy()),
          f"keras: {int(opt.iterations.numpy())} updates counted, single-process training counted "
          f"{int(reference.optimizer.iterations.numpy())}")
    losses = history.history["loss"]
    check(losses[-1] < losses[0], f"keras: loss did not fall: {losses}")
    np.savez(pathlib.Path(args.out) / f"keras.{hvd.rank()}.npz", *model.get_weights())
    print(f"rank {hvd.rank()}: keras ok (max difference {worst:.2e}, averaged loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}, cross-iteration={opt.cross_iteration_active()})", flush=True)


def keras_loss_scale(args):
    """mixed_float16: the DistributedOptimizer inside a LossScaleOptimizer (compile wraps it so); rank 1's first
    batch overflows in float16 and rank 0's does not: both ranks must skip that step together and stay equal."""
    import keras
    import commsched.keras as khvd
    khvd.init()
    keras.mixed_precision.set_global_policy("mixed_float16")
    x, y, xs, ys = data()
    if hvd.rank() == 1:
        xs = xs.copy()
        xs[:BATCH] *= 3e4
    model = keras_model(seed=hvd.rank())
    # What compile wraps a plain optimizer in under mixed_float16, with a scale that overflows on rank 1 only.
    opt = keras.optimizers.LossScaleOptimizer(khvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), initial_scale=1)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    steps = 3
    model.fit(xs[:BATCH * steps], ys[:BATCH * steps], batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[khvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    updates = int(model.optimizer.iterations.numpy())
    check(updates == steps - 1, f"loss scale: {updates} updates of {steps} steps (the overflowed step counts none)")
    np.savez(pathlib.Path(args.out) / f"loss_scale.{hvd.rank()}.npz", *model.get_weights())
    print(f"rank {hvd.rank()}: loss_scale ok (scale {float(model.optimizer.dynamic_scale.numpy()):g})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["api", "tape", "keras", "loss_scale"])
    ap.add_argument("--out", default=".")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd", help="keras mode's optimizer")
    args = ap.parse_args()
    {"api": api, "tape": tape, "keras": keras_fit, "loss_scale": keras_loss_scale}[args.mode](args)
    hvd.shutdown()


if __name__ == "__main__":
    main()

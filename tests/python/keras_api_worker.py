"""One rank of the tests of Horovod's Keras pieces (run by test_keras_api.py under `commsched launch`, 2 ranks).

    keras_api_worker.py sync_bn          SyncBatchNormalization beside BatchNormalization on the whole batch
    keras_api_worker.py loss_scale_pair  two LossScaleOptimizers whose overflow checks run in another order per rank
    keras_api_worker.py best_checkpoint  BestModelCheckpoint saves the best model on rank 0 only
    keras_api_worker.py tf_names         reducescatter, grouped_allgather, broadcast_, ... of commsched.tensorflow

Each rank checks its results against values computed locally and prints '<mode> ok'.
"""
import argparse
import concurrent.futures
import os
import pathlib
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import commsched.keras as hvd  # noqa: E402

FEATURES = 4
ROWS = (3, 5)  # rank 0's and rank 1's rows of the whole batch: unequal on purpose


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {hvd.rank()}: {what}")


def close(a, b):
    return np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


# ---- SyncBatchNormalization ----

def bn_layers():
    """A SyncBatchNormalization and a BatchNormalization with the same (non-trivial) gamma and beta."""
    rs = np.random.RandomState(3)
    gamma, beta = rs.rand(FEATURES).astype(np.float32) + 0.5, rs.randn(FEATURES).astype(np.float32)
    made = []
    for cls in (hvd.SyncBatchNormalization, keras.layers.BatchNormalization):
        layer = cls(momentum=0.8)
        layer.build((None, FEATURES))
        layer.gamma.assign(gamma)
        layer.beta.assign(beta)
        made.append(layer)
    return made


def bn_step(layer, x, w):
    """Outputs and the gradients of sum(outputs * w) for the input, gamma and beta (training mode)."""
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        loss = tf.reduce_sum(y * w)
    return [y] + tape.gradient(loss, [x, layer.gamma, layer.beta])


def sync_bn(args):
    """Each rank holds its rows of one batch (3 and 5 rows). The loss of the whole batch is the sum of the ranks'
    losses, so each rank's outputs and input gradient must be its rows of those of one BatchNormalization over the
    whole batch, and the sum over the ranks of the gamma and beta gradients theirs; the moving statistics follow."""
    hvd.init()
    rs = np.random.RandomState(5)
    x_all = (rs.randn(sum(ROWS), FEATURES) * 2 + 1).astype(np.float32)
    w_all = rs.randn(sum(ROWS), FEATURES).astype(np.float32)
    mine = slice(sum(ROWS[:hvd.rank()]), sum(ROWS[:hvd.rank() + 1]))
    sync, reference = bn_layers()
    for step, run in enumerate([lambda f, *a: f(*a), lambda f, *a: tf.function(f)(*a)]):  # eager, then traced
        x_step, w_step = x_all + step, w_all * (step + 1)
        y, dx, dgamma, dbeta = run(bn_step, sync, x_step[mine], w_step[mine])
        y_ref, dx_ref, dgamma_ref, dbeta_ref = bn_step(reference, x_step, w_step)
        check(close(y, y_ref.numpy()[mine]), f"step {step}: outputs differ from the whole batch's")
        check(close(dx, dx_ref.numpy()[mine]), f"step {step}: input gradient differs: {dx} vs {dx_ref[mine]}")
        for what, got, want in (("gamma", dgamma, dgamma_ref), ("beta", dbeta, dbeta_ref)):
            summed = hvd.allreduce(got, average=False, name=f"check.{what}.{step}")
            check(close(summed, want), f"step {step}: {what} gradient summed over the ranks {summed} != {want}")
        for stat in ("moving_mean", "moving_variance"):
            got, want = getattr(sync, stat).numpy(), getattr(reference, stat).numpy()
            check(close(got, want), f"step {step}: {stat} {got} != {want}")
    calls = next(sync._commsched_calls)
    inferred = sync(x_all[mine], training=False)
    check(next(sync._commsched_calls) == calls + 1, "inference mode communicated")
    check(close(inferred, reference(x_all, training=False).numpy()[mine]), "inference outputs differ")
    sync_bn_fit()
    print(f"rank {hvd.rank()}: sync_bn ok", flush=True)


def bn_model(cls):
    keras.utils.set_random_seed(11)
    return keras.Sequential([keras.Input([FEATURES]), keras.layers.Dense(3), cls(), keras.layers.Dense(1)])


def sync_bn_fit():
    """model.fit with a SyncBatchNormalization and DistributedOptimizer, 4 rows per rank per step, ends where
    single-process fit with BatchNormalization does on the combined batches of 8 (weights and moving statistics)."""
    rs = np.random.RandomState(9)
    x = rs.randn(16, FEATURES).astype(np.float32)
    y = rs.randn(16, 1).astype(np.float32)
    model = bn_model(hvd.SyncBatchNormalization)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5)), loss="mse",
                  jit_compile=False)
    model.fit(x[hvd.rank()::2], y[hvd.rank()::2], batch_size=4, epochs=2, shuffle=False, verbose=0)
    reference = bn_model(keras.layers.BatchNormalization)
    reference.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5), loss="mse", jit_compile=False)
    rows = np.concatenate([np.arange(r, 16, 2)[k * 4:(k + 1) * 4] for k in range(2) for r in range(2)])
    reference.fit(x[rows], y[rows], batch_size=8, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        check(close(got, want), f"model.fit with SyncBatchNormalization: {got} != {want}")


# ---- two LossScaleOptimizers ----

def loss_scale_pair(args):
    """A GAN under mixed_float16 has two LossScaleOptimizers whose overflow checks TensorFlow may start in either
    order. Here both run at once (two threads), rank 0 starting A's first and rank 1 B's; A's gradient overflowed on
    rank 1 only. Each check must pair with its own optimizer's check on the other rank: A overflowed on both, B on
    neither (one name for both paired rank 0's A with rank 1's B)."""
    hvd.init()
    a = keras.optimizers.LossScaleOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    b = keras.optimizers.LossScaleOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    grads = {"A": [tf.constant([np.inf if hvd.rank() == 1 else 1.0])], "B": [tf.constant([1.0])]}
    order = [("A", a), ("B", b)] if hvd.rank() == 0 else [("B", b), ("A", a)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        started = {}
        for name, opt in order:
            started[name] = pool.submit(lambda o=opt, g=grads[name]: bool(o.check_finite(g)))
            time.sleep(0.5)  # the first check is submitted before the second starts (not an assertion on time)
        finite = {name: f.result() for name, f in started.items()}
    check(finite == {"A": False, "B": True}, f"overflow checks paired with the wrong optimizer: {finite}")
    print(f"rank {hvd.rank()}: loss_scale_pair ok", flush=True)


# ---- BestModelCheckpoint ----

def best_checkpoint(args):
    """A score that goes 3, 1, 2 over three epochs (mode='min'): the model is saved after epochs 1 and 2, not 3, and
    by rank 0 only (each rank is given its own path); what is saved is the model after epoch 2."""
    hvd.init()
    out = pathlib.Path(args.out)
    scores, weights = [3.0, 1.0, 2.0], []

    def score(epoch, logs):
        logs["score"] = scores[epoch]
        weights.append([w.copy() for w in model.get_weights()])
    keras.utils.set_random_seed(hvd.rank())
    model = keras.Sequential([keras.Input([FEATURES]), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=False)
    for weights_only, suffix in ((False, "keras"), (True, "weights.h5")):
        weights.clear()
        path = out / f"best.{hvd.rank()}.{suffix}"
        best = hvd.callbacks.BestModelCheckpoint(monitor="score", mode="min", verbose=1, filepath=str(path),
                                                 save_weights_only=weights_only)
        model.fit(np.ones((8, FEATURES)), np.ones((8, 1)), batch_size=4, epochs=3, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             keras.callbacks.LambdaCallback(on_epoch_end=score), best])
        check(path.exists() == (hvd.rank() == 0), f"{path} exists: {path.exists()}")
        if hvd.rank() == 0:
            saved = keras.Sequential([keras.Input([FEATURES]), keras.layers.Dense(1)])
            if weights_only:
                saved.load_weights(path)
            else:
                saved = keras.models.load_model(path)
            check(all(np.array_equal(s, w) for s, w in zip(saved.get_weights(), weights[1])),
                  "the saved model is not the one after the best epoch (2)")
    print(f"rank {hvd.rank()}: best_checkpoint ok", flush=True)


# ---- the rest of horovod.tensorflow's names ----

def tf_names(args):
    """reducescatter (5 rows: rank 0 keeps 3, rank 1 2, as Horovod splits them) with its gradient, grouped_allgather,
    broadcast_, broadcast_object_fn, the *_op constants, PartialDistributedGradientTape and
    PartialDistributedOptimizer (a local layer's gradient stays the rank's own, divided by size() with
    scale_local_gradients), BroadcastGlobalVariablesCallback's local_variables, and process sets refused by name."""
    import commsched.tensorflow as htf
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    base = np.arange(10, dtype=np.float32).reshape(5, 2)
    mine = slice(0, 3) if me == 0 else slice(3, 5)
    x = tf.Variable(base * (me + 1))
    with tf.GradientTape() as tape:
        summed = htf.reducescatter(x, op=htf.Sum)
        loss = tf.reduce_sum(summed * (me + 1))
    check(close(summed, (base * 3)[mine]), f"reducescatter Sum: {summed}")
    want = np.concatenate([np.full((3, 2), 1.0), np.full((2, 2), 2.0)])  # each rank's rows: its weight (r + 1)
    check(close(tape.gradient(loss, x), want), "reducescatter gradient: every rank's rows' gradients gathered")
    averaged = tf.function(lambda v: hvd.reducescatter(v))(x)  # commsched.keras's, Average, traced
    check(close(averaged, (base * 1.5)[mine]), f"reducescatter Average: {averaged}")
    gathered = htf.grouped_allgather([tf.fill([me + 1], float(me)), tf.constant([[me]])])
    check(gathered[0].numpy().tolist() == [0.0, 1.0, 1.0] and gathered[1].numpy().tolist() == [[0], [1]],
          f"grouped_allgather: {gathered}")
    variables = [tf.Variable([float(me)]), tf.Variable([me * 10])]
    check(htf.broadcast_(variables, root_rank=1) == variables and variables[0].numpy()[0] == 1.0
          and variables[1].numpy()[0] == 10, "broadcast_")
    check(htf.broadcast_object_fn(root_rank=1)({"from": me}) == {"from": 1}, "broadcast_object_fn")
    check([int(htf.rank_op()), int(htf.size_op()), int(htf.local_rank_op()), int(htf.local_size_op()),
           int(htf.process_set_included_op())] == [me, n, me, n, 1], "the *_op constants")
    dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    dense.build((None, 1))
    shared = tf.Variable([1.0])
    for scale in (True, False):
        with tf.GradientTape() as tape:
            loss = (me + 1) * (tf.reduce_sum(shared) + tf.reduce_sum(dense(tf.ones([1, 1]))))
        partial = htf.PartialDistributedGradientTape(tape, local_layers=dense, scale_local_gradients=scale)
        g_shared, g_local = partial.gradient(loss, [shared, dense.kernel])
        want = (me + 1) / n if scale else me + 1
        check(close(g_shared, [1.5]) and close(g_local, [[want]]), f"partial tape: {g_shared}, {g_local}")
    model = keras.Sequential([keras.Input([1]), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=model.layers[1])
    opt.build(model.trainable_variables)
    opt.apply([tf.fill([1, 1], me + 1.0)] * 2, model.trainable_variables)
    kernels = [k.numpy().item() for k in model.trainable_variables]
    check(close(kernels, [1 - 1.5, 1 - (me + 1) / n]), f"PartialDistributedOptimizer: {kernels}")
    model.layers[0].kernel.assign([[me + 10.0]])
    model.layers[1].kernel.assign([[me + 20.0]])
    broadcast = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[model.layers[1].kernel])
    broadcast.set_model(model)
    broadcast.on_train_begin()
    kernels = [k.numpy().item() for k in model.trainable_variables]
    check(kernels == [10.0, me + 20.0], f"BroadcastGlobalVariablesCallback with local_variables: {kernels}")
    for refused in (lambda: htf.ProcessSet([0]), lambda: htf.add_process_set([0]), lambda: htf.size_op(1)):
        try:
            refused()
            check(False, "a process set other than the global one was accepted")
        except (ValueError, NotImplementedError) as e:
            check("global process set only" in str(e), f"message: {e}")
    print(f"rank {hvd.rank()}: tf_names ok", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["sync_bn", "loss_scale_pair", "best_checkpoint", "tf_names"])
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    globals()[args.mode](args)
    hvd.shutdown()


if __name__ == "__main__":
    main()

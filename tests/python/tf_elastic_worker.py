"""An elastic TensorFlow training script (Horovod's API) for tests/python/test_tf_elastic.py, run under `commsched
launch --min-workers`. --mode keras: model.fit with KerasState and the elastic callbacks (a commit after every batch);
--mode loop: a custom loop, a tf.function step with DistributedGradientTape and a TensorFlowState. Every step trains
on a fixed global batch, each rank on its slice for the current size. The victim (the worker whose launcher id is
ELASTIC_VICTIM) SIGKILLs itself at the start of global step ELASTIC_FAULT_STEP (epoch * STEPS + batch), in the first
generation only, while the others wait for its gradients. ELASTIC_WAIT_FOR_SIZE=n (loop): the last step waits,
committing, until a joiner has made the job n workers.

Each worker prints (prefixed with its launcher id) "commit ..." after every commit and "start ..." each time the
training function begins, with the generation, rank, size, state and a digest of the weights (after the sync);
a finished worker writes OUT/final.<id>.npz, one stopped by ElasticError OUT/stopped.<id>.txt.
"""
import argparse
import os
import signal
import sys

import numpy as np
import tensorflow as tf
import keras

import commsched.keras as hvd
from commsched.tensorflow import DistributedGradientTape, allreduce, size_op
from elastic_common import wait_for_joiners

EPOCHS, STEPS, GLOBAL_BATCH = 2, 6, 24
IDENT = os.environ.get("COMMSCHED_ELASTIC_ID", "?")


def say(text):
    sys.stdout.write(f"[{IDENT}] {text}\n")  # one write: the workers share the output pipe
    sys.stdout.flush()


def global_batch(epoch, batch):
    rng = np.random.default_rng(1000 * epoch + batch)
    x = rng.standard_normal((GLOBAL_BATCH, 4)).astype(np.float32)
    return x, x.sum(1, keepdims=True)


def my_slice():
    n, r = hvd.size(), hvd.rank()
    per = GLOBAL_BATCH // n
    return slice(per * r, per * (r + 1) if r < n - 1 else GLOBAL_BATCH), per


def fault_here(epoch, batch):
    if (IDENT == os.environ.get("ELASTIC_VICTIM") and os.environ.get("COMMSCHED_GENERATION", "0") == "0"
            and epoch * STEPS + batch == int(os.environ.get("ELASTIC_FAULT_STEP", "-1"))):
        say(f"killing myself at epoch {epoch} batch {batch}")
        os.kill(os.getpid(), signal.SIGKILL)


def digest(variables):
    return repr(float(sum(np.abs(tf.convert_to_tensor(v).numpy().astype(np.float64)).sum() for v in variables)))


def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


class Record(keras.callbacks.Callback):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_begin(self, batch, logs=None):
        fault_here(self.state.epoch, batch)

    def on_train_batch_end(self, batch, logs=None):  # after CommitStateCallback's commit
        say(f"commit epoch={self.state.epoch} batch={self.state.batch} digest={digest(self.model.weights)}")


def train_keras(out):
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse",
                  jit_compile=False)
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state), Record(state)]

    @hvd.elastic.run
    def train(state):
        say(f"start generation={os.environ.get('COMMSCHED_GENERATION', '0')} rank={hvd.rank()} size={hvd.size()} "
            f"epoch={state.epoch} batch={state.batch} digest={digest(model.weights)}")
        mine, per = my_slice()
        data = [global_batch(0, b) for b in range(STEPS)]  # every epoch the same STEPS batches
        x = np.concatenate([d[0][mine] for d in data])
        y = np.concatenate([d[1][mine] for d in data])
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(per).repeat(), epochs=EPOCHS - state.epoch,
                  steps_per_epoch=STEPS, callbacks=callbacks, shuffle=False, verbose=0)

    train(state)
    return state, model.weights


def train_loop(out):
    model = make_model()
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
    traces = []
    is_root = tf.Variable(0.0)  # 1 on rank 0: its average over the workers is 1 / size, read when the step runs

    # One trace for every size (a slice's rows change with it): the step traced in the first generation runs on.
    @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 1]), tf.TensorSpec([])])
    def step(x, y, scale):
        traces.append(1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(x) - y)) * scale
        tape = DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return allreduce(is_root, name="root_share"), size_op()

    state = hvd.elastic.TensorFlowState(model.weights + optimizer.variables, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        say(f"start generation={os.environ.get('COMMSCHED_GENERATION', '0')} rank={hvd.rank()} size={hvd.size()} "
            f"epoch={state.epoch} batch={state.batch} digest={digest(model.weights)}")
        is_root.assign(1.0 if hvd.rank() == 0 else 0.0)
        while state.epoch < EPOCHS:
            while state.batch < STEPS:
                if (state.epoch, state.batch) == (EPOCHS - 1, STEPS - 1):
                    wait_for_joiners(state, hvd.size)
                fault_here(state.epoch, state.batch)
                x, y = global_batch(state.epoch, state.batch)
                mine, _ = my_slice()
                share, traced_size = step(x[mine], y[mine], np.float32(hvd.size() / GLOBAL_BATCH))
                state.batch += 1
                state.commit()
                say(f"commit epoch={state.epoch} batch={state.batch} digest={digest(model.weights)} "
                    f"root_share={float(share):.4f} traced_size={int(traced_size)} traces={len(traces)}")
            state.epoch, state.batch = state.epoch + 1, 0

    train(state)
    return state, model.weights


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["keras", "loop"], required=True)
    args = ap.parse_args()
    hvd.init()
    try:
        state, weights = (train_keras if args.mode == "keras" else train_loop)(args.out)
    except hvd.elastic.ElasticError as e:
        with open(os.path.join(args.out, f"stopped.{IDENT}.txt"), "w") as f:
            f.write(str(e))
        raise
    np.savez(os.path.join(args.out, f"final.{IDENT}.npz"), size=hvd.size(), rank=hvd.rank(), epoch=state.epoch,
             *[tf.convert_to_tensor(w).numpy() for w in weights])
    say(f"finished as rank {hvd.rank()} of {hvd.size()} at epoch {state.epoch}")
    hvd.shutdown()


if __name__ == "__main__":
    main()

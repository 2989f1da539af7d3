"""Elastic training with TensorFlow and Keras (Horovod's hvd.elastic API) under `commsched launch --min-workers`:
a worker that kills itself mid-epoch is left behind and the two others finish with equal weights, having resumed
from their last commit (Keras's model.fit with the elastic callbacks; a custom loop whose tf.function, traced once,
averages over the new size; on Gloo and on the parameter server); a joiner is let in at a commit and receives the
state; below the minimum every survivor stops with ElasticError. tf_elastic_worker.py is the training script.
"""
import importlib.util
import pathlib
import re

import numpy as np
import pytest

# Only asked, never imported here (test_tensorflow.py says why).
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow not installed (the test venv has tensorflow-cpu)", allow_module_level=True)

from torch_cluster import HERE, PYTHON, child_env, commsched_bin, run_process, run_single  # noqa: E402

WORKER = HERE / "tf_elastic_worker.py"
FAULT_STEP = 9  # epoch 1, batch 3 of 6: mid-epoch


def elastic_launch(out, mode, workers=3, min_workers=2, servers=0, victim="1", extra=(), env=None, timeout=240):
    cmd = [commsched_bin(), "launch", "-w", str(workers), "-s", str(servers), "--min-workers", str(min_workers),
           *extra, "--", PYTHON, str(WORKER), "--out", str(out), "--mode", mode]
    # A worker killed inside a collective is noticed by the ranks waiting on it within COMMSCHED_TIMEOUT.
    env = {"COMMSCHED_TIMEOUT": "5", "TF_CPP_MIN_LOG_LEVEL": "2", "ELASTIC_VICTIM": victim,
           "ELASTIC_FAULT_STEP": str(FAULT_STEP), **(env or {})}
    if servers == 0:
        env["COMMSCHED_BACKEND"] = "gloo"
    return run_process(cmd, child_env(env), timeout)


# The workers share one output pipe, so a line may run on into another worker's: values stop at a '['.
_EVENT = re.compile(r"\[(\w+)\] (commit|start)((?: \w+=[^\s\[]+)+)")


def events(log, ident):
    """(kind, {field: value}) of one worker's commit and start lines, in order."""
    return [(kind, dict(f.split("=", 1) for f in fields.split()))
            for who, kind, fields in _EVENT.findall(log) if who == ident]


def assert_resumed_from_last_commit(log, ident, epoch, batch, size=2):
    """The worker's second start (generation 1, `size` workers) has the state and weights of its last commit
    before."""
    seen = events(log, ident)
    starts = [i for i, (kind, f) in enumerate(seen) if kind == "start" and f["generation"] == "1"]
    assert len(starts) == 1, (ident, log)
    start = seen[starts[0]][1]
    last_commit = [f for kind, f in seen[:starts[0]] if kind == "commit"][-1]
    assert start["size"] == str(size), (ident, log)
    assert (start["epoch"], start["batch"], start["digest"]) == (
        last_commit["epoch"], last_commit["batch"], last_commit["digest"]), (ident, start, last_commit, log)
    assert (start["epoch"], start["batch"]) == (str(epoch), str(batch)), (ident, start, log)


def assert_survivors_agree(out, ids, log, size=2):
    finals = {ident: np.load(pathlib.Path(out) / f"final.{ident}.npz") for ident in ids}
    assert sorted(p.name for p in pathlib.Path(out).glob("final.*.npz")) == [f"final.{i}.npz" for i in ids], log
    first = finals[ids[0]]
    for ident, final in finals.items():
        assert int(final["size"]) == size and int(final["epoch"]) == 2, (ident, log)
        weights = sorted(k for k in final.files if k.startswith("arr_"))
        assert weights and all(np.array_equal(final[k], first[k]) for k in weights), (ident, log)


def test_keras_fit_survives_a_worker_killed_mid_epoch(tmp_path):
    rc, log = elastic_launch(tmp_path, "keras", victim="2")
    assert rc == 0, log
    assert "worker 2 exited with status 137; elastic: 2 worker(s) remain" in log, log
    assert "generation 1 formed with 2 worker(s) (was 3; " in log, log
    for ident in ("0", "1"):
        # Killed at the start of batch 3: the last commit was at the end of batch 2 (UpdateBatchStateCallback
        # records the index of the batch finished).
        assert_resumed_from_last_commit(log, ident, epoch=1, batch=2)
    assert_survivors_agree(tmp_path, ["0", "1"], log)


@pytest.mark.parametrize("servers", [0, 1], ids=["gloo", "ps"])
def test_a_custom_loop_with_tensorflow_state_survives_and_its_traced_step_averages_over_the_new_size(tmp_path,
                                                                                                    servers):
    rc, log = elastic_launch(tmp_path, "loop", servers=servers)
    assert rc == 0, log
    assert "worker 1 exited with status 137; elastic: 2 worker(s) remain" in log, log
    for ident in ("0", "2"):
        assert_resumed_from_last_commit(log, ident, epoch=1, batch=3)  # state.batch: the next batch to train
        commits = [f for kind, f in events(log, ident) if kind == "commit"]
        # Rank 0's 1 averaged over the workers, by the step traced once in generation 0: 1/3, then 1/2.
        assert {f["root_share"] for f in commits[:FAULT_STEP]} == {"0.3333"}, (ident, log)
        assert {f["root_share"] for f in commits[FAULT_STEP:]} == {"0.5000"}, (ident, log)
        # hvd.size_op() in that step reads the group when it runs, as the average does.
        assert [f["traced_size"] for f in commits] == ["3"] * FAULT_STEP + ["2"] * (len(commits) - FAULT_STEP), log
        assert {f["traces"] for f in commits} == {"1"}, (ident, log)
    if servers:
        assert "elastic: generation 1 of 2 worker(s): started its 1 server(s)" in log, log
    assert_survivors_agree(tmp_path, ["0", "2"], log)


def test_below_the_minimum_every_survivor_stops_with_elastic_error(tmp_path):
    rc, log = elastic_launch(tmp_path, "loop", min_workers=3)
    assert rc != 0, log
    stopped = sorted(pathlib.Path(tmp_path).glob("stopped.*.txt"))
    assert [p.name for p in stopped] == ["stopped.0.txt", "stopped.2.txt"], log
    for p in stopped:
        assert "fewer workers than the minimum remain (2 < 3, --min-workers)" in p.read_text(), log
    assert not list(pathlib.Path(tmp_path).glob("final.*.npz")), log


def test_a_joiner_is_let_in_at_a_commit_and_receives_the_state(tmp_path):
    """--join-workers 1: a third worker waits in init() and is let in at a commit (the first one when it is waiting
    by then); it starts from the state the two others committed, trained weights included, and the three finish
    alike."""
    rc, log = elastic_launch(tmp_path, "loop", workers=2, victim="none", extra=["--join-workers", "1"],
                             env={"ELASTIC_WAIT_FOR_SIZE": "3"})
    assert rc == 0, log
    assert "generation 1 formed with 3 worker(s) (was 2; workers joined)" in log, log
    joined = [f for kind, f in events(log, "2") if kind == "start"]
    first = {f["generation"]: f for kind, f in events(log, "0") if kind == "start"}
    assert len(joined) == 1 and joined[0]["generation"] == "1" and sorted(first) == ["0", "1"], log
    assert [joined[0][k] for k in ("size", "epoch", "batch", "digest")] == [
        first["1"][k] for k in ("size", "epoch", "batch", "digest")], log
    assert joined[0]["batch"] != "0" and joined[0]["digest"] != first["0"]["digest"], log  # after training
    assert_survivors_agree(tmp_path, ["0", "1", "2"], log, size=3)


def test_states_commit_restore_and_the_callbacks_in_one_process(tmp_path):
    script = tmp_path / "states.py"
    script.write_text(STATES_SCRIPT)
    rc, out = run_single([script], env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=120)
    assert rc == 0 and "states ok" in out, out


STATES_SCRIPT = r'''
import numpy as np, keras, tensorflow as tf
import commsched.keras as hvd
import commsched.tensorflow as htf

hvd.init()
v = tf.Variable([1.0, 2.0])
state = htf.elastic.TensorFlowState([v], epoch=1)
v.assign([5.0, 6.0])
state.epoch = 2
state.restore()
assert v.numpy().tolist() == [1.0, 2.0] and state.epoch == 1
v.assign([7.0, 8.0])
state.commit()
v.assign([0.0, 0.0])
state.restore()
assert v.numpy().tolist() == [7.0, 8.0]

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss="mse",
              jit_compile=False)
state = hvd.elastic.KerasState(model, epoch=0, batch=0)
assert model.optimizer.built  # built here, so that every worker syncs the same variables
commits = []
callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
             keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: commits.append(
                 (state.epoch, state.batch, int(model.optimizer.iterations.numpy()))))]

@hvd.elastic.run
def train(state):
    model.fit(np.ones((12, 2)), np.ones((12, 1)), batch_size=4, epochs=2 - state.epoch, verbose=0,
              callbacks=callbacks)
    return state.epoch

assert train(state) == 2 and state.batch == 0, (state.epoch, state.batch)  # without an elastic store: called once
assert [c[:2] for c in commits] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)], commits
trained = [w.copy() for w in model.get_weights()]
model.fit(np.ones((8, 2)), np.zeros((8, 1)), batch_size=4, epochs=1, verbose=0)
state.restore()  # back to the commit at the end of the last epoch: weights and optimizer (its step counter too)
assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), trained))
assert int(model.optimizer.iterations.numpy()) == 6

# Unnamed operations are numbered from 0 in every Context: a generation's survivors (a new Context each) and its
# joiners (new processes) then name them alike.
htf.allreduce(tf.ones(1))
assert htf.ops.auto_name("allreduce", None) != "allreduce.noname.0"
hvd.shutdown()
hvd.init()
assert htf.ops.auto_name("allreduce", None) == "allreduce.noname.0"
# Inside a traced function the name follows the function and the order in it, whatever ran before in the process.
traced = []
@tf.function
def step(x):
    traced.append(htf.ops.auto_name("allreduce", None))
    traced.append(htf.ops.auto_name("allreduce", None))
    return x
step(tf.ones(1))
step(tf.ones(2))  # traced again for the new shape: the same names
assert traced == ["allreduce.noname.step.0", "allreduce.noname.step.1"] * 2, traced
print("states ok")
hvd.shutdown()
'''

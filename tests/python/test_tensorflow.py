"""commsched.tensorflow and commsched.keras on 2 workers, on the parameter server (1 server) and on Gloo, under
`commsched launch` as the torch tests run: every collective in eager mode and in tf.function, and training through
DistributedGradientTape and through model.fit() ending with equal weights on both ranks, within 1e-6 of
single-process training on the combined batch (tensorflow_worker.py checks each rank against its local reference)."""
import importlib.util
import shutil

import numpy as np
import pytest

# Only asked, never imported here: TensorFlow loaded into the pytest process makes a later in-process import of
# torch._dynamo (triton) abort the whole run; the workers import it in their own processes.
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow not installed (the test venv has tensorflow-cpu)", allow_module_level=True)

from torch_cluster import HERE, launch, run_single  # noqa: E402

BACKENDS = pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
SMALL_PARTITIONS = {"COMMSCHED_PARTITION_BYTES": "64", "COMMSCHED_CREDIT_BYTES": "256"}


def test_every_horovod_tensorflow_name_exists():
    import commsched.keras
    import commsched.tensorflow as hvd
    import commsched.tensorflow.keras as tfk
    names = """init shutdown is_initialized size rank local_rank local_size cross_rank cross_size allreduce
               grouped_allreduce allgather broadcast broadcast_variables alltoall join DistributedGradientTape
               DistributedOptimizer Compression elastic Average Sum Min Max Adasum Product HorovodInternalError
               start_timeline stop_timeline gloo_built mpi_built nccl_built allgather_object broadcast_object""".split()
    assert not [n for n in names if not hasattr(hvd, n)]
    keras_names = ["DistributedOptimizer", "callbacks", "init", "rank", "size", "allreduce", "broadcast",
                   "load_model"]
    for module in (commsched.keras, tfk):
        assert not [n for n in keras_names if not hasattr(module, n)], module
    for cb in ("BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
               "LearningRateScheduleCallback"):
        assert hasattr(tfk.callbacks, cb) and hasattr(commsched.keras.callbacks, cb)


def test_calls_before_init_name_the_fix():
    import commsched.tensorflow as hvd
    with pytest.raises(ValueError, match=r"call commsched.tensorflow.init\(\) first"):
        hvd.rank()


def test_learning_rate_callbacks_follow_horovods_schedule(tmp_path):
    """Horovod's Keras ImageNet example's shape: a warm-up, then a constant multiplier over a range of epochs (set at
    each epoch's first batch), then a callable one batch by batch (staircase=False). One process: the warm-up holds
    the rate (its factor is 1 / size() at the start)."""
    script = tmp_path / "schedule.py"
    script.write_text("import numpy as np, keras\n"
                      "import commsched.keras as hvd\n"
                      "hvd.init()\n"
                      "seen = []\n"
                      "record = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda b, logs: seen.append(\n"
                      "    round(float(model.optimizer.learning_rate.numpy()), 6)))\n"
                      "model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
                      "model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss='mse',\n"
                      "              jit_compile=False)\n"
                      "cbs = [hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1),\n"
                      "       hvd.callbacks.LearningRateScheduleCallback(0.1, 0.5, start_epoch=1, end_epoch=3),\n"
                      "       hvd.callbacks.LearningRateScheduleCallback(0.1, lambda e: 0.01 * e, start_epoch=3,\n"
                      "                                                  staircase=False), record]\n"
                      "model.fit(np.ones((12, 2)), np.ones((12, 1)), batch_size=4, epochs=4, verbose=0,\n"
                      "          callbacks=cbs)\n"
                      "print('rates', seen)\n")
    rc, log = run_single([script], env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=120)
    assert rc == 0, log
    assert "rates [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.003, 0.003333, 0.003667]" in log, log


def test_keras_backward_passes_per_step_points_to_kerass_own_accumulation():
    import keras
    import commsched.keras as hvd
    with pytest.raises(ValueError, match=r"backward_passes_per_step=3: .* gradient_accumulation_steps=3"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=3)


@BACKENDS
def test_collectives_on_two_ranks(tmp_path, servers):
    rc, log = launch(2, [HERE / "tensorflow_worker.py", "api", "--out", tmp_path], servers=servers, timeout=240,
                     env=SMALL_PARTITIONS)
    assert rc == 0, log
    assert log.count("tensorflow api ok") == 2, log
    if shutil.which("c++") or shutil.which("g++"):  # the ops were compiled against this TensorFlow and used
        assert log.count("with native ops") == 2, log


def test_without_a_compiler_the_ops_fall_back_to_host_callbacks_saying_why(tmp_path):
    script = tmp_path / "fallback.py"
    script.write_text("import tensorflow as tf\n"
                      "import commsched.tensorflow as hvd\n"
                      "hvd.init()\n"
                      "print('sum', hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum).numpy().tolist())\n")
    rc, log = run_single([script], env={"CXX": "no-such-compiler", "XDG_CACHE_HOME": str(tmp_path / "cache"),
                                        "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=120)
    assert rc == 0, log
    assert "no C++ compiler was found (CXX=no-such-compiler" in log and "host callbacks" in log, log
    assert "sum [1.0, 2.0]" in log, log


def _equal_across_ranks(tmp_path, mode):
    ranks = [np.load(tmp_path / f"{mode}.{r}.npz") for r in range(2)]
    for key in ranks[0].files:
        assert np.array_equal(ranks[0][key], ranks[1][key]), f"{mode}: {key} differs between the ranks"


@BACKENDS
@pytest.mark.parametrize("mode", ["tape", "keras"])
def test_training_matches_single_process_on_the_combined_batch(tmp_path, servers, mode):
    rc, log = launch(2, [HERE / "tensorflow_worker.py", mode, "--out", tmp_path], servers=servers, timeout=240,
                     env=SMALL_PARTITIONS)
    assert rc == 0, log
    assert log.count(f"{mode} ok") == 2, log
    if mode == "keras":  # the default: each update deferred to the next forward
        assert log.count("cross-iteration=True") == 2, log
    _equal_across_ranks(tmp_path, mode)


@pytest.mark.parametrize("cross_iteration", ["1", "0"])
def test_keras_adamw_on_a_schedule_is_exact_with_and_without_cross_iteration(tmp_path, cross_iteration):
    """AdamW's update reads the step counter (bias correction, the schedule, weight decay): deferring each
    variable's update to the next forward must count steps as one apply over every variable does."""
    env = dict(SMALL_PARTITIONS, COMMSCHED_CROSS_ITERATION=cross_iteration)
    rc, log = launch(2, [HERE / "tensorflow_worker.py", "keras", "--optimizer", "adamw", "--out", tmp_path],
                     servers=1, timeout=240, env=env)
    assert rc == 0, log
    assert log.count(f"cross-iteration={cross_iteration == '1'}") == 2, log
    _equal_across_ranks(tmp_path, "keras")


def test_mixed_precision_skips_an_overflowed_step_on_every_rank_together(tmp_path):
    """Keras decides on each rank's own gradients whether the step overflowed, before the inner optimizer averages
    them: a rank that alone overflowed skipped the averaging the other waited in (a hang)."""
    rc, log = launch(2, [HERE / "tensorflow_worker.py", "loss_scale", "--out", tmp_path], servers=1, timeout=150)
    assert rc == 0, log
    assert log.count("loss_scale ok") == 2, log
    _equal_across_ranks(tmp_path, "loss_scale")


def test_the_tuner_runs_live_on_the_tape_path(tmp_path):
    """COMMSCHED_TUNE through commsched.tensorflow: every gradient() ends an iteration of the tuner's clock, the
    trials run and a choice is kept while training goes on, and the weights still match single-process training."""
    tuner = {"COMMSCHED_TUNE": "1", "COMMSCHED_TUNER_TRIALS": "3", "COMMSCHED_TUNER_MIN_TRIALS": "3",
             "COMMSCHED_TUNER_INITIAL": "2", "COMMSCHED_TUNER_WARMUP": "0", "COMMSCHED_TUNER_WINDOW": "1",
             "COMMSCHED_TUNER_WINDOWS": "1", "COMMSCHED_TUNER_DRIFT": "0"}
    rc, log = launch(2, [HERE / "tensorflow_worker.py", "tape", "--out", tmp_path], servers=1, timeout=240, env=tuner)
    assert rc == 0, log
    assert "trial 3 of 3" in log and "keeping partition" in log, log
    assert log.count("tape ok") == 2, log
    _equal_across_ranks(tmp_path, "tape")


PRIORITY_SCRIPT = """
import tensorflow as tf
import commsched.tensorflow as hvd
from commsched.tensorflow import ops
seen = []
real = ops._native_submit
def spy(tensor, name, op="reduce", priority=0, **kw):
    seen.append((name, priority))
    return real(tensor, name, op, priority, **kw)
ops._native_submit = spy
hvd.init()
vs = [tf.Variable(tf.ones([2]) * (i + 1), name=f"v{i}") for i in range(4)]
@tf.function
def grads():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum([tf.reduce_sum(v * v) for v in vs])
    return hvd.DistributedGradientTape(tape).gradient(loss, vs)
out = grads()
print("submitted", seen)
print("grads", [g.numpy().tolist() for g in out])
"""


def test_gradients_are_tasks_prioritized_by_variable_order(tmp_path):
    """One task per variable, the first variable the most urgent (priority 0), submitted last layer first (the order
    backprop produces them); the averaged gradients come back (one process: the average is the gradient)."""
    script = tmp_path / "priorities.py"
    script.write_text(PRIORITY_SCRIPT)
    rc, log = run_single([script], env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=120)
    assert rc == 0, log
    if "host callbacks" in log:
        pytest.skip("the native TensorFlow ops could not be built here (no C++ compiler)")
    assert "submitted [('grad.3.v3:0', 3), ('grad.2.v2:0', 2), ('grad.1.v1:0', 1), ('grad.0.v0:0', 0)]" in log, log
    assert "grads [[2.0, 2.0], [4.0, 4.0], [6.0, 6.0], [8.0, 8.0]]" in log, log


def test_keras_cross_iteration_in_custom_loops_and_where_it_cannot_defer():
    """One process (the average of one rank is the gradient): deferred updates in a tf.function loop and an eager
    loop match plain Keras after flush(); an optimizer built inside the traced step, and one with global_clipnorm
    (one warning saying why), wait in apply() and match too."""
    rc, log = run_single([HERE / "keras_deferred_worker.py"], env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=240)
    assert rc == 0, log
    assert "keras deferred ok" in log, log

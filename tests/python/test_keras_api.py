"""Horovod's Keras pieces beyond the optimizer: SyncBatchNormalization, BestModelCheckpoint, momentum correction in
the learning-rate callbacks, one overflow-check collective per LossScaleOptimizer, and the rest of the names of
horovod.tensorflow and horovod.keras. Two-rank cases run keras_api_worker.py under `commsched launch`."""
import importlib.util

import pytest

# Only asked, never imported here (see test_tensorflow.py): the workers import TensorFlow in their own processes.
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow not installed (the test venv has tensorflow-cpu)", allow_module_level=True)

from torch_cluster import HERE, launch, run_single  # noqa: E402

TF_QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_sync_batch_norm_matches_batch_norm_over_the_whole_batch(tmp_path, servers):
    rc, log = launch(2, [HERE / "keras_api_worker.py", "sync_bn", "--out", tmp_path], servers=servers, timeout=240)
    assert rc == 0, log
    assert log.count("sync_bn ok") == 2, log


def test_each_loss_scale_optimizer_agrees_on_its_own_overflow(tmp_path):
    rc, log = launch(2, [HERE / "keras_api_worker.py", "loss_scale_pair", "--out", tmp_path], servers=0,
                     timeout=180)
    assert rc == 0, log
    assert log.count("loss_scale_pair ok") == 2, log


def test_best_model_checkpoint_saves_the_best_epoch_on_rank_0_only(tmp_path):
    rc, log = launch(2, [HERE / "keras_api_worker.py", "best_checkpoint", "--out", tmp_path], servers=1, timeout=240)
    assert rc == 0, log
    assert log.count("best_checkpoint ok") == 2, log
    assert (tmp_path / "best.0.keras").exists() and not (tmp_path / "best.1.keras").exists()
    assert log.count("score improved") == 4 and log.count("did not improve") == 2, log  # rank 0's, per fit


@pytest.mark.parametrize("cross_iteration", ["1", "0"])
def test_momentum_correction_reaches_the_compiled_update(cross_iteration):
    env = dict(TF_QUIET, COMMSCHED_CROSS_ITERATION=cross_iteration)
    rc, log = run_single([HERE / "keras_momentum_worker.py"], env=env, timeout=180)
    assert rc == 0, log
    assert f"momentum correction ok (cross-iteration={cross_iteration == '1'})" in log, log


@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_the_rest_of_horovod_tensorflows_collectives(tmp_path, servers):
    rc, log = launch(2, [HERE / "keras_api_worker.py", "tf_names", "--out", tmp_path], servers=servers, timeout=180)
    assert rc == 0, log
    assert log.count("tf_names ok") == 2, log


def test_every_horovod_name_exists_or_says_why_not():
    """Horovod 0.28's public names of horovod.tensorflow, horovod.keras and horovod.tensorflow.keras (callbacks
    too). TensorFlow 1's broadcast_global_variables and BroadcastGlobalVariablesHook raise, naming what to use."""
    import commsched.keras
    import commsched.tensorflow as hvd
    import commsched.tensorflow.keras as tfk
    names = """SyncBatchNormalization reducescatter grouped_reducescatter grouped_allgather broadcast_
               broadcast_object_fn rank_op local_rank_op size_op local_size_op process_set_included_op ProcessSet
               add_process_set remove_process_set global_process_set is_homogeneous broadcast_global_variables
               BroadcastGlobalVariablesHook cuda_built rocm_built ddl_built ccl_built mpi_enabled gloo_enabled
               mpi_threads_supported PartialDistributedGradientTape""".split()
    assert not [n for n in names if not hasattr(hvd, n)]
    keras_names = """SyncBatchNormalization reducescatter allgather broadcast_global_variables ProcessSet
                     global_process_set add_process_set remove_process_set gloo_built gloo_enabled nccl_built
                     mpi_built cuda_built rocm_built is_initialized cross_rank cross_size elastic
                     PartialDistributedOptimizer""".split()
    for module in (commsched.keras, tfk):
        assert not [n for n in keras_names if not hasattr(module, n)], module
        assert module.SyncBatchNormalization is hvd.SyncBatchNormalization
        assert hasattr(module.callbacks, "BestModelCheckpoint")
    for tf1 in (lambda: hvd.broadcast_global_variables(0), lambda: hvd.BroadcastGlobalVariablesHook(0)):
        with pytest.raises(NotImplementedError, match=r"TensorFlow 1's; .* broadcast_variables\(model.variables"):
            tf1()
    with pytest.raises(ValueError, match="pass filepath="):
        commsched.keras.callbacks.BestModelCheckpoint(monitor="val_loss")

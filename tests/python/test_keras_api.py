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

"""The TensorFlow examples (Horovod's TensorFlow 2 benchmark and Keras MNIST example with only the import changed)
run under `commsched launch`: the benchmark reports img/s, the Keras fit's loss falls, and every rank ends with the
same weights (tensorflow_example_runner.py prints a digest of each rank's model)."""
import importlib.util
import pathlib
import re

import pytest

# Only asked, never imported here: TensorFlow loaded into the pytest process makes a later in-process import of
# torch._dynamo (triton) abort the whole run; the workers import it in their own processes.
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow not installed (the test venv has tensorflow-cpu)", allow_module_level=True)

from torch_cluster import HERE, launch  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "tensorflow"
RUNNER = HERE / "tensorflow_example_runner.py"


def _same_weights_on_both_ranks(log):
    digests = dict(re.findall(r"rank (\d) weights digest ([0-9a-f]+)", log))
    assert set(digests) == {"0", "1"} and digests["0"] == digests["1"], log


def test_synthetic_benchmark_on_the_ps_reports_throughput():
    rc, log = launch(2, [RUNNER, "model", EXAMPLES / "tensorflow2_synthetic_benchmark.py", "--model",
                         "MobileNetV3Small", "--image-size", 32, "--batch-size", 4, "--num-warmup-batches", 1,
                         "--num-batches-per-iter", 1, "--num-iters", 2], servers=1, timeout=420,
                     deterministic=False)
    assert rc == 0, log
    assert "Total img/sec on 2 CPU(s):" in log, log
    _same_weights_on_both_ranks(log)


@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_keras_mnist_fit_loss_falls(servers):
    rc, log = launch(2, [RUNNER, "mnist_model", EXAMPLES / "tensorflow2_keras_mnist.py", "--epochs", 3,
                         "--steps-per-epoch", 16, "--batch-size", 32], servers=servers, timeout=300,
                     deterministic=False)
    assert rc == 0, log
    m = re.search(r"loss ([0-9.]+) -> ([0-9.]+) over 3 epochs on 2 workers", log)
    assert m and float(m.group(2)) < float(m.group(1)) * 0.8, log
    assert "finished gradual learning rate warmup" in log, log
    _same_weights_on_both_ranks(log)

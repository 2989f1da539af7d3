"""The PyTorch examples run under `commsched launch`: the CNN's loss really falls, the benchmark reports img/s."""
import json
import pathlib

from torch_cluster import launch

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_pytorch_train_loss_falls_with_the_scheduler_and_cross_iteration(tmp_path):
    result = tmp_path / "r.json"
    rc, log = launch(2, [EXAMPLES / "pytorch_train.py", "--policy", "bytescheduler", "--cross-iteration",
                         "--steps", 30, "--hidden", 64, "--check", "--result", result], deterministic=False)
    assert rc == 0, log
    r = json.loads(result.read_text())
    assert r["policy"] == "bytescheduler" and r["cross_iteration"] and r["workers"] == 2, r
    assert r["loss_last"] < r["loss_first"] * 2 / 3 and r["images_per_s"] > 0, r


def test_pytorch_synthetic_benchmark_reports_throughput():
    rc, log = launch(2, [EXAMPLES / "pytorch_synthetic_benchmark.py", "--policy", "wfbp", "--image-size", 32,
                         "--batch-size", 4, "--num-iters", 2, "--num-batches-per-iter", 1, "--num-warmup-batches", 1],
                     deterministic=False)
    assert rc == 0, log
    assert "policy wfbp" in log and "total img/s on 2 worker(s):" in log, log

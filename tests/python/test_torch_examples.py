"""The PyTorch examples run under `commsched launch`: the CNN's loss really falls, the benchmark reports img/s."""
import json
import os
import pathlib

from torch_cluster import PYTHON, child_env, commsched_bin, run_process, launch

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_pytorch_train_loss_falls_with_the_scheduler_and_cross_iteration(tmp_path):
    result = tmp_path / "r.json"
    rc, log = launch(2, [EXAMPLES / "pytorch_train.py", "--policy", "bytescheduler", "--cross-iteration",
                         "--steps", 30, "--hidden", 64, "--check", "--result", result], deterministic=False)
    assert rc == 0, log
    r = json.loads(result.read_text())
    assert r["policy"] == "bytescheduler" and r["cross_iteration"] and r["workers"] == 2, r
    assert r["loss_last"] < r["loss_first"] * 2 / 3 and r["images_per_s"] > 0, r


def test_workers_bound_to_one_core_get_the_shared_cores_partition():
    """Two workers on one core (taskset: what a cpuset or Slurm's binding leaves them): the plugin tells the PS
    partition rule that each message's CPU comes out of the compute (1.2 ms, not 5 us), so the knobs it logs and uses
    are 4 MiB partitions; with the machine's core count instead of the affinity a multi-core host would say 5 us."""
    core = str(min(os.sched_getaffinity(0)))
    cmd = ["taskset", "-c", core, commsched_bin(), "launch", "-w", "2", "-s", "1", "--", PYTHON,
           str(EXAMPLES / "pytorch_train.py"), "--policy", "bytescheduler", "--steps", "3", "--warmup", "1", "--hidden", "16"]
    rc, log = run_process(cmd, child_env({}), 120)
    assert rc == 0, log
    assert "knobs for 2 workers x 1 servers (1200 us per message: the workers fill the host's cores" in log, log
    assert "partition 4 MiB (automatic" in log, log


def test_pytorch_synthetic_benchmark_reports_throughput():
    rc, log = launch(2, [EXAMPLES / "pytorch_synthetic_benchmark.py", "--policy", "wfbp", "--image-size", 32,
                         "--batch-size", 4, "--num-iters", 2, "--num-batches-per-iter", 1, "--num-warmup-batches", 1],
                     deterministic=False)
    assert rc == 0, log
    assert "policy wfbp" in log and "total img/s on 2 worker(s):" in log, log


def test_pytorch_train_auto_tunes_live(tmp_path):
    """COMMSCHED_TUNE through the plugin: the tuner runs its trials while training (rank 0 decides, the decision is
    broadcast through the PS), then training goes on with the kept knobs; the loss still falls."""
    result = tmp_path / "r.json"
    tuner = {"COMMSCHED_TUNER_TRIALS": "4", "COMMSCHED_TUNER_MIN_TRIALS": "4", "COMMSCHED_TUNER_INITIAL": "2",
             "COMMSCHED_TUNER_WARMUP": "0", "COMMSCHED_TUNER_WINDOW": "1", "COMMSCHED_TUNER_WINDOWS": "1",
             "COMMSCHED_TUNER_CSV": str(tmp_path / "trials.csv"),
             "COMMSCHED_TUNER_DRIFT": "0"}  # one-step windows of a tiny model: noise, not drift
    rc, log = launch(2, [EXAMPLES / "pytorch_train.py", "--policy", "bytescheduler", "--tune", "--steps", 25,
                         "--hidden", 64, "--check", "--result", result], env=tuner, deterministic=False)
    assert rc == 0, log
    r = json.loads(result.read_text())
    assert r["tuner_trials"] == 4 and r["tuning_steps"] >= 4, r
    # The kept knobs by name, in bytes (what scripts/torch_main.sh prints).
    assert set(r["knobs"]) == {"partition_bytes", "credit_bytes", "small_tensor_bytes"}, r
    assert all(isinstance(v, int) and v >= 0 for v in r["knobs"].values()), r
    assert "keeping partition" in log, log
    # The warm start (rank 0): the registered gradients and their measured backward, simulated on this cluster and
    # link; tuning starts from its choice (agreed by both ranks), or from the current knobs when no candidate is
    # predicted clearly faster (the candidates then come next), and the log sets predicted beside measured.
    assert "warm start: simulated 2 workers x 1 servers" in log and "measured backward" in log, log
    assert ("starting from partition" in log or "keeps the current partition" in log) and "(warm start" in log, log
    assert "simulated " in log and " ms/iteration, measured " in log, log
    rows = (tmp_path / "trials.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 4, rows  # header + one row per trial, written by rank 0 only
    assert r["loss_last"] < r["loss_first"] * 2 / 3, r

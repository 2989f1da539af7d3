"""Gradient compression through the engine's compression stage: the names, the errors, and the small CNN of
examples/pytorch_train.py reaching a stated loss within 40 steps with each scheme."""
import json
import pathlib
import subprocess
import sys

import pytest

from torch_cluster import launch

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "pytorch_train.py"

# Loss after 40 steps (mean of the last three) that each scheme must reach from ~2.3, one worker, seeded. Measured:
# none/fp16/bf16 ~0.24, signSGD ~1.2, top-k 1% ~1.7 (error feedback sends the rest later; 1% is slow on 40 steps).
TARGETS = {"none": 0.5, "fp16": 0.5, "bf16": 0.5, "signsgd": 1.6, "topk:0.01": 2.0}


def test_names_map_to_engine_schemes():
    sys.path.insert(0, str(ROOT / "build" / "python"))
    from commsched.torch import Compression
    assert Compression.fp16.engine_spec == "fp16" and Compression.bf16.engine_spec == "bf16"
    assert Compression.signsgd.engine_spec == "signsgd"
    assert Compression.topk(0.05).engine_spec == "topk:0.05"
    assert Compression.none.engine_spec is None
    for bad in (0, 1.5, -1):
        with pytest.raises(ValueError, match="ratio"):
            Compression.topk(bad)


def run_single(args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("scheme", list(TARGETS))
def test_small_cnn_reaches_the_stated_loss_with_each_scheme(tmp_path, scheme):
    result = tmp_path / "r.json"
    p = run_single([TRAIN, "--steps", 40, "--compression", scheme, "--result", result])
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(result.read_text())
    assert r["compression"] == scheme
    assert r["loss_last"] < TARGETS[scheme] < r["loss_first"], r


def test_fp16_on_a_parameter_server_with_two_workers(tmp_path):
    """The cast partitions are summed by the server as fp16 tensors; training still converges."""
    result = tmp_path / "r.json"
    rc, log = launch(2, [TRAIN, "--steps", 30, "--hidden", 64, "--compression", "fp16", "--check", "--result", result],
                     deterministic=False)
    assert rc == 0, log
    r = json.loads(result.read_text())
    assert r["workers"] == 2 and r["compression"] == "fp16", r


# Top-k: the loss falls by a third in 40 steps (--check). signSGD answered by a majority vote is noisy on this small
# CNN at 2 workers (measured 2.34 -> 1.70 at 40 steps, 1.44 at 80 with 0.36 on the way): it must only fall.
@pytest.mark.parametrize("scheme,extra", [("topk:0.05", ["--check"]), ("signsgd", [])])
def test_server_decoded_schemes_on_a_parameter_server_with_two_workers(tmp_path, scheme, extra):
    """Top-k and signSGD pushes are decoded and summed by the server, which answers in the same scheme; every worker
    applies the same answer, so training converges and the run ends cleanly."""
    result = tmp_path / "r.json"
    rc, log = launch(2, [TRAIN, "--steps", 40, "--hidden", 64, "--compression", scheme, *extra, "--result", result],
                     deterministic=False)
    assert rc == 0, log
    r = json.loads(result.read_text())
    assert r["workers"] == 2 and r["compression"] == scheme, r
    assert r["loss_last"] < r["loss_first"], r


def test_a_bad_scheme_and_a_refused_one_are_named():
    code = (
        "import torch, commsched.torch as hvd\n"
        "from commsched.torch import runtime\n"
        "hvd.init()\n"
        "try:\n"
        "    runtime.submit(torch.ones(8), 'g', 'reduce', compression='gzip')\n"
        "except ValueError as e:\n"
        "    print('BAD', e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT / "build" / "python"), "PATH": "/usr/bin:/bin"})
    assert "BAD compression='gzip' is invalid" in p.stdout, p.stdout + p.stderr

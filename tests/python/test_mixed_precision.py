"""Mixed precision through DistributedOptimizer at its defaults (cross-iteration on), 2 workers and 1 server: CPU
bf16 autocast with GradScaler (Horovod's synchronize / unscale_ / skip_synchronize pattern; a step whose gradients
overflowed on one rank only is skipped on every rank alike), bf16 and fp16 parameters, fp16 and bf16 compression. In each mode the loss
falls, the ranks end bitwise equal, and equal to WFBP waiting in step()."""
import json
import re

import pytest
import torch

from mixed_precision_worker import MODES, OVERFLOW_STEP
from torch_cluster import HERE, launch

WORKERS = 2
WAITING = {"COMMSCHED_POLICY": "wfbp", "COMMSCHED_CROSS_ITERATION": "0"}


def run(out, env):
    out.mkdir()
    rc, log = launch(WORKERS, [HERE / "mixed_precision_worker.py", "--out", out], env)
    assert rc == 0, log
    return [json.loads((out / f"{r}.json").read_text()) for r in range(WORKERS)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("mixed")
    return {"default": (base / "default", run(base / "default", {})),
            "waiting": (base / "waiting", run(base / "waiting", WAITING))}


def states(out, mode):
    return [torch.load(out / f"{mode}.{r}.pt") for r in range(WORKERS)]


def assert_bitwise(a, b, what):
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: '{k}' differs (max abs {float((a[k] - b[k]).abs().max())})"


@pytest.mark.parametrize("mode", list(MODES))
def test_mode_trains_and_ranks_agree_with_each_other_and_with_wfbp(runs, mode):
    out, info = runs["default"]
    waiting_out, waiting_info = runs["waiting"]
    if mode in info[0]["skipped"]:
        pytest.skip(info[0]["skipped"][mode])
    losses = [x for x in info[0]["losses"][mode] if x is not None]
    assert sum(losses[-3:]) < sum(losses[:3]), f"{mode}: the loss did not fall: {losses}"
    default, waiting = states(out, mode), states(waiting_out, mode)
    for r in range(WORKERS):
        assert_bitwise(default[0], default[r], f"{mode}: rank {r} vs rank 0")
        assert_bitwise(waiting[0], default[r], f"{mode}: rank {r} vs WFBP waiting in step()")
    for r in range(WORKERS):
        assert info[r]["losses"][mode] == waiting_info[r]["losses"][mode]


def test_grad_scaler_skips_the_overflowing_step_on_every_rank(runs):
    _, info = runs["default"]
    if "autocast" in info[0]["notes"]:
        pytest.skip(info[0]["notes"]["autocast"])
    skipped = [i["skipped_steps"] for i in info]
    # Rank 0's gradients overflowed there, rank 1's did not: the averaged ones did on both.
    assert skipped == [[OVERFLOW_STEP]] * WORKERS, f"expected every rank to skip step {OVERFLOW_STEP}: {skipped}"


@pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"), reason=f"torch {torch.__version__} has no CPU GradScaler")
@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_plain_grad_scaler_step_unscales_the_averaged_gradients(servers):
    """torch's own recipe, scaler.step(optimizer) without Horovod's synchronize() first: GradScaler must unscale (and
    look for inf in) the averaged gradients, not buffers still being reduced."""
    rc, log = launch(WORKERS, [HERE / "grad_scaler_step_worker.py"], servers=servers, deterministic=False)
    assert rc == 0, log
    for r in range(WORKERS):
        found = re.search(rf"rank {r}: skipped \[2\], largest difference from single-process training (\S+)", log)
        assert found and float(found.group(1)) <= 1e-6, log

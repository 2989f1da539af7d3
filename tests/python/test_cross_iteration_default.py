"""Cross-iteration overlap for a Horovod script that changes only its import (no model=): on by default, exact
(bitwise equal to waiting in step() when the servers sum in rank order, and equal to single-process training on the
combined batch), and off, with a warning naming the parameter, where a parameter is read outside its module."""
import json
import warnings

import pytest
import torch

from torch_cluster import HERE, launch
from unchanged_script_worker import train

WORKERS, STEPS, BATCH = 2, 10, 4
ENGINE_ENV = {"COMMSCHED_PARTITION_BYTES": "256", "COMMSCHED_CREDIT_BYTES": "1KiB"}


def run(tmp_path, env, *extra):
    out = tmp_path / "-".join(["run"] + [f"{k}{v}" for k, v in env.items()] + [e.strip("-") for e in extra])
    out.mkdir()
    rc, log = launch(WORKERS, [HERE / "unchanged_script_worker.py", "--out", out, "--steps", STEPS,
                               "--batch", BATCH, *extra], dict(ENGINE_ENV, **env))
    assert rc == 0, log
    states = [torch.load(out / f"{r}.pt") for r in range(WORKERS)]
    deferred = [json.loads((out / f"{r}.json").read_text())["deferred"] for r in range(WORKERS)]
    return states, deferred, log


def reference(reads_weight=False):
    """One process on the combined batch: what every worker must end with."""
    model, _ = train(STEPS, BATCH * WORKERS, 0, 1, reads_weight, wrap=False)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_relative_error(state, ref):
    return max(float((state[k] - ref[k]).norm() / ref[k].norm()) for k in ref)


def assert_bitwise(a, b, what):
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: '{k}' differs (max abs {float((a[k] - b[k]).abs().max())})"


@pytest.mark.parametrize("policy", ["bytescheduler", "wfbp"])
def test_unchanged_script_overlaps_by_default_and_stays_exact(tmp_path, policy):
    default, deferred, _ = run(tmp_path, {"COMMSCHED_POLICY": policy})
    plain, plain_deferred, _ = run(tmp_path, {"COMMSCHED_POLICY": "wfbp", "COMMSCHED_CROSS_ITERATION": 0})
    assert all(d > 0 for d in deferred), f"step() deferred no update on some worker: {deferred}"
    assert plain_deferred == [0] * WORKERS
    for r in range(WORKERS):
        assert_bitwise(plain[0], default[r], f"{policy} default (rank {r}) vs wfbp waiting in step()")
    err = max_relative_error(default[0], reference())
    assert err <= 1e-6, f"relative error {err:.3g} against single-process training"


def test_parameter_read_outside_its_module_turns_overlap_off_with_a_warning(tmp_path):
    states, deferred, log = run(tmp_path, {}, "--reads-weight")
    assert deferred == [0] * WORKERS, deferred
    assert "parameter 'b.weight' is not a parameter of any module that ran" in log, log
    err = max_relative_error(states[0], reference(reads_weight=True))
    assert err <= 1e-6, f"relative error {err:.3g} against single-process training"

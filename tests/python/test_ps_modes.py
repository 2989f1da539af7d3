"""COMMSCHED_PS_MODE=async|ssp under `commsched launch`: the example still reaches its target loss (convergence shown,
not assumed), a worker whose mode differs from the servers' fails the start naming it, and bad values name the
variable."""
import json
import pathlib

import pytest

torch = pytest.importorskip("torch", reason="the PS-mode tests train with torch, which is not installed")

from torch_cluster import launch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "pytorch_train.py"
TARGET = 1.0  # the loss starts near 2.3; synchronous training passes 1.0 after about 20 of these 40 steps


@pytest.mark.parametrize("mode", [{"COMMSCHED_PS_MODE": "async"},
                                  {"COMMSCHED_PS_MODE": "ssp", "COMMSCHED_STALENESS": "1"}],
                         ids=["async", "ssp1"])
def test_the_example_reaches_its_target_loss(tmp_path, mode):
    result = tmp_path / "r.json"
    rc, out = launch(2, [TRAIN, "--steps", 40, "--warmup", 2, "--target-loss", TARGET, "--result", result],
                     env=mode, timeout=400, deterministic=False)
    assert rc == 0, out
    words = " ".join(f"{k}={v}" for k, v in mode.items())
    assert f"gradients {words}" in out, out  # the server says which mode it runs
    r = json.loads(result.read_text())
    assert r["steps_to_loss"] is not None, f"{words}: loss per step {r['loss_per_step']}"


# torch first: under a torch build with its own NCCL, commsched's module loaded first would bind the system one.
INIT_ONLY = "import torch; import commsched.torch as hvd; hvd.init(); hvd.shutdown()"

# Rank 1 switches itself to async before it starts: the server (sync) refuses it at the rendezvous, naming it.
MISMATCHED = """
import os
if os.environ["COMMSCHED_RANK"] == "1":
    os.environ["COMMSCHED_PS_MODE"] = "async"
import torch
import commsched.torch as hvd
hvd.init()
hvd.shutdown()
"""


def test_a_worker_in_another_mode_fails_the_start_naming_it():
    rc, out = launch(2, ["-c", MISMATCHED], env={"COMMSCHED_PS_MODE": "sync"}, timeout=60, deterministic=False)
    assert rc != 0, out
    assert "worker 1" in out and "runs with COMMSCHED_PS_MODE=async but server 0 with COMMSCHED_PS_MODE=sync" in out, out


@pytest.mark.parametrize("env,var", [({"COMMSCHED_PS_MODE": "bsp"}, "COMMSCHED_PS_MODE"),
                                     ({"COMMSCHED_PS_MODE": "ssp", "COMMSCHED_STALENESS": "two"}, "COMMSCHED_STALENESS")])
def test_bad_values_name_the_variable(env, var):
    rc, out = launch(1, ["-c", INIT_ONLY], env=env, timeout=60,
                     deterministic=False)
    assert rc != 0 and var in out, out


def test_hierarchical_mode_needs_sync():
    rc, out = launch(2, ["-c", INIT_ONLY],
                     env={"COMMSCHED_PS_MODE": "ssp", "COMMSCHED_HIERARCHICAL": "gloo"}, timeout=60, deterministic=False)
    assert rc != 0 and "COMMSCHED_HIERARCHICAL=gloo needs COMMSCHED_PS_MODE=sync (it is ssp)" in out, out


def test_deterministic_sums_need_sync():
    rc, out = launch(1, ["-c", INIT_ONLY],
                     env={"COMMSCHED_PS_MODE": "async"}, timeout=60, deterministic=True)
    assert rc != 0 and "COMMSCHED_PS_DETERMINISTIC=1 needs COMMSCHED_PS_MODE=sync" in out, out


# Rank 2 computes much slower (argv[2] seconds a step, the others 10 ms; argv[3] seconds of training); every worker hears that rank 2 lags: through
# the Python API, in its log (rate-limited) and as trace events.
STRAGGLER = """
import json, os, sys, time
import torch
import commsched.torch as hvd
hvd.init()
out = sys.argv[1]
hvd.start_timeline(os.path.join(out, "t.json"))
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
heard = []
start = time.time()
while time.time() - start < float(sys.argv[3]):
    opt.zero_grad()
    loss = model(torch.ones(2, 4)).sum()
    time.sleep(float(sys.argv[2]) if hvd.rank() == 2 else 0.01)  # the compute, before the gradients are submitted
    loss.backward()
    opt.step()
    heard += [s for s in hvd.stragglers() if s["rank"] == 2]
opt.flush()
hvd.stop_timeline()
hvd.join()
json.dump(heard, open(os.path.join(out, f"heard{hvd.rank()}.json"), "w"))
hvd.shutdown()
"""


# PS async: the others run ahead, so rank 2 is many iterations behind. Gloo (all-reduce, `launch -s 0`): the others
# wait for it at every step, so it is behind in time (rank 0's negotiation sees its ready reports come late).
@pytest.mark.parametrize("servers,slow,seconds,iterations,log", [
    (1, 0.2, 4, 5, "[commsched worker 0] rank 2 lags: "),
    (0, 3.0, 7, 1, "[commsched negotiator rank 0] rank 2 lags: ")], ids=["ps_async", "gloo"])
def test_every_worker_learns_which_rank_lags(tmp_path, servers, slow, seconds, iterations, log):
    env = {"COMMSCHED_PS_MODE": "async"} if servers else {}
    rc, out = launch(3, ["-c", STRAGGLER, tmp_path, slow, seconds], env=env, timeout=120,
                     deterministic=False, servers=servers)
    assert rc == 0, out
    for rank in (0, 1):
        heard = json.loads((tmp_path / f"heard{rank}.json").read_text())
        assert heard, f"worker {rank} never heard that rank 2 lags\n{out}"
        assert max(s["iterations_behind"] for s in heard) >= iterations, heard
        assert max(s["seconds_behind"] for s in heard) >= 1.0, heard
        trace = (tmp_path / f"t.rank{rank}.json").read_text()
        assert '"stragglers"' in trace and '"rank":2' in trace, trace[-2000:]
    assert log in out, out
    assert out.count(log) <= 2, "the log is not rate-limited"

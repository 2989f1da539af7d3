"""Elastic training (Horovod's hvd.elastic API) under `commsched launch --min-workers`, on Gloo and on the parameter
server (fresh servers for each generation, a lost server replaced too): a killed or frozen
worker is left behind and the survivors finish the run, with parameters equal across them and equal (to rounding) to
those of a run that lost nobody; below the minimum every process stops with an error that says so; a worker started
again joins at the next commit and receives the state; torchrun's --max-restarts meets in a new generation. Also the
states' commit/restore and the sampler, in one process.
"""
import glob
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

torch = pytest.importorskip("torch")

from torch_cluster import (HERE, PYTHON, child_env, commsched_bin, finish_launchers, free_port_pair,  # noqa: E402
                           run_process, run_single)

WORKER = HERE / "elastic_worker.py"


def elastic_launch(out, workers=4, min_workers=2, extra=(), env=None, timeout=150, servers=0):
    cmd = [commsched_bin(), "launch", "-w", str(workers), "-s", str(servers), "--min-workers", str(min_workers), *extra,
           "--", PYTHON, str(WORKER), "--out", str(out)]
    # A worker killed inside a Gloo collective is noticed by the ranks waiting on it after COMMSCHED_TIMEOUT.
    full = {"COMMSCHED_TIMEOUT": "5", **(env or {})}
    if servers == 0:
        full["COMMSCHED_BACKEND"] = "gloo"
    return run_process(cmd, child_env(full), timeout)


def results(out):
    return {pathlib.Path(f).name.split(".")[1]: torch.load(f) for f in sorted(glob.glob(os.path.join(out, "*.pt")))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The parameters of the same run that loses nobody."""
    out = tmp_path_factory.mktemp("reference")
    rc, log = elastic_launch(out)
    assert rc == 0, log
    models = results(out)
    assert len(models) == 4, log
    return models["0"]["model"]


def assert_survivors(models, ids, size, reference, log):
    assert sorted(models) == sorted(ids), log
    first = models[ids[0]]["model"]
    for ident in ids:
        m = models[ident]
        assert m["size"] == size and m["steps"] == 24, (ident, m["size"], m["steps"], log)
        for k, v in m["model"].items():
            assert torch.equal(v, first[k]), f"worker {ident}: {k} differs from worker {ids[0]}'s\n{log}"
            # Each step averages the same global batch at any size: only the rounding of the sums differs.
            assert torch.allclose(v, reference[k], atol=1e-5), f"{k}: {(v - reference[k]).abs().max()}\n{log}"


def test_a_killed_worker_is_left_behind_and_the_others_finish(tmp_path, reference):
    rc, log = elastic_launch(tmp_path, env={"ELASTIC_VICTIM": "2", "ELASTIC_FAULT": "kill", "ELASTIC_FAULT_STEP": "7"})
    assert rc == 0, log
    assert "worker 2 exited with status 137; elastic: 3 worker(s) remain" in log, log
    assert "generation 1 formed with 3 worker(s) (was 4; " in log and "; gone: 2)" in log, log
    assert_survivors(results(tmp_path), ["0", "1", "3"], 3, reference, log)


def elastic_nodes(out, env, workers=2, min_workers=2, servers=0, timeout=150):
    """Two launchers (node 0 and node 1) on this machine meeting at node 0's --root, `workers` workers each, Gloo.
    Returns their exit codes and their output."""
    port = free_port_pair()
    full = child_env({"COMMSCHED_TIMEOUT": "5", "COMMSCHED_BACKEND": "gloo", **env})
    procs = []
    for node in (1, 0):  # node 1 first: it waits for node 0
        cmd = [commsched_bin(), "launch", "--nnodes", "2", "--node-rank", str(node), "--root", f"127.0.0.1:{port}",
               "-w", str(workers), "-s", str(servers), "--min-workers", str(min_workers), "--join-timeout", "30",
               "--", PYTHON, str(WORKER), "--out", str(out)]
        procs.append(subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    codes, outs = finish_launchers(procs, timeout)
    return codes[::-1], "\n".join(outs)


def test_across_nodes_a_killed_worker_is_left_behind(tmp_path, reference):
    """Node 1's first worker (elastic id 1-0: ids are numbered per node) dies; the three others re-form over the
    store node 0's launcher serves, and finish."""
    codes, log = elastic_nodes(tmp_path, {"ELASTIC_VICTIM": "1-0", "ELASTIC_FAULT": "kill", "ELASTIC_FAULT_STEP": "7"})
    assert codes == [0, 0], log
    assert "worker 2 on node 1 exited with status 137; elastic: 3 worker(s) remain (minimum 2)" in log, log
    assert_survivors(results(tmp_path), ["0-0", "0-1", "1-1"], 3, reference, log)


def test_across_nodes_a_lost_node_is_survived(tmp_path, reference):
    """Node 1's launcher is killed outright (a host gone): its workers die with it, node 0 counts the node lost
    instead of tearing the run down, and its two workers, the minimum, finish."""
    codes, log = elastic_nodes(tmp_path, {"ELASTIC_VICTIM": "1-1", "ELASTIC_FAULT": "kill-launcher",
                                          "ELASTIC_FAULT_STEP": "7"})
    assert codes[0] == 0 and codes[1] == -signal.SIGKILL, (codes, log)
    lost = "node 1: its launcher is gone (connection closed before it finished); elastic: 2 worker(s) remain"
    assert lost in log, log
    assert_survivors(results(tmp_path), ["0-0", "0-1"], 2, reference, log)


def test_across_nodes_below_the_minimum_every_node_stops(tmp_path):
    codes, log = elastic_nodes(tmp_path, {"ELASTIC_VICTIM": "1-1", "ELASTIC_FAULT": "kill-launcher",
                                          "ELASTIC_FAULT_STEP": "7"}, min_workers=3)
    assert codes[0] != 0, log
    assert "fewer workers than the minimum remain (2 < 3, --min-workers)" in log, log
    stopped = sorted(pathlib.Path(f).name for f in glob.glob(os.path.join(tmp_path, "stopped.*.txt")))
    assert stopped == ["stopped.0-0.txt", "stopped.0-1.txt"], (stopped, log)


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_across_two_namespace_hosts_rank_0_is_lost_and_the_others_finish(tmp_path, reference):
    """Two hosts (network namespaces joined by a veth pair, one secret): node 0's store is reached beyond loopback,
    and with rank 0 (node 0's first worker) gone the next generation's root is a survivor's address, which the other
    host must reach."""
    env = child_env({"COMMSCHED_TIMEOUT": "5", "COMMSCHED_BACKEND": "gloo", "NETNS_LAUNCH_ARGS": "--min-workers 2",
                     "ELASTIC_VICTIM": "0-0", "ELASTIC_FAULT": "kill", "ELASTIC_FAULT_STEP": "7"})
    cmd = [str(HERE / "netns_two_nodes.sh"), commsched_bin(), "2", "0", "--", PYTHON, str(WORKER),
           "--out", str(tmp_path)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    assert_survivors(results(tmp_path), ["0-1", "1-0", "1-1"], 3, reference, log)


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_horovodrun_min_np_survives_a_lost_host(tmp_path, reference):
    """`commsched horovodrun --min-np 2` on two namespace hosts (reached through an ssh stand-in): host 1's launcher
    is killed, and horovodrun lets node 0 carry the run instead of stopping it."""
    env = child_env({"COMMSCHED_TIMEOUT": "5", "COMMSCHED_BACKEND": "gloo", "ELASTIC_VICTIM": "1-1",
                     "ELASTIC_FAULT": "kill-launcher", "ELASTIC_FAULT_STEP": "7"})
    cmd = [str(HERE / "netns_horovodrun.sh"), commsched_bin(), "4", "2", "2", "--", "--min-np", "2", PYTHON,
           str(WORKER), "--out", str(tmp_path)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    assert "exited with status 137; elastic: the run goes on without it" in log, log
    assert_survivors(results(tmp_path), ["0-0", "0-1"], 2, reference, log)


def test_across_nodes_elastic_runs_on_gloo_only(tmp_path):
    codes, log = elastic_nodes(tmp_path, {}, servers=1, timeout=60)
    assert codes[0] != 0 and codes[1] != 0, log
    assert "elastic training across nodes (--min-workers with --nnodes 2) runs on Gloo: use -s 0 (got -s 1)" in log, log


def test_on_the_parameter_server_each_generation_gets_fresh_servers(tmp_path, reference):
    """The servers keep nothing between rounds: they stop with the broken group, and the launcher starts new ones for
    the survivors' generation (its size, its root)."""
    rc, log = elastic_launch(tmp_path, servers=2,
                             env={"ELASTIC_VICTIM": "1", "ELASTIC_FAULT": "kill", "ELASTIC_FAULT_STEP": "6"})
    assert rc == 0, log
    assert "elastic: generation 1 of 3 worker(s): started its 2 server(s)" in log, log
    assert_survivors(results(tmp_path), ["0", "2", "3"], 3, reference, log)


def test_a_lost_parameter_server_is_replaced_too(tmp_path, reference):
    rc, log = elastic_launch(tmp_path, servers=1,
                             env={"ELASTIC_VICTIM": "3", "ELASTIC_FAULT": "kill-servers", "ELASTIC_FAULT_STEP": "6"})
    assert rc == 0, log
    assert "server 0 exited with status 137; elastic: the next generation gets new servers" in log, log
    assert "generation 1 formed with 4 worker(s)" in log, log
    assert_survivors(results(tmp_path), ["0", "1", "2", "3"], 4, reference, log)


def test_rank_zero_can_be_lost_too(tmp_path, reference):
    rc, log = elastic_launch(tmp_path, env={"ELASTIC_VICTIM": "0", "ELASTIC_FAULT": "kill", "ELASTIC_FAULT_STEP": "5"})
    assert rc == 0, log
    assert_survivors(results(tmp_path), ["1", "2", "3"], 3, reference, log)


def test_a_frozen_worker_is_left_behind_after_the_timeout(tmp_path, reference):
    """SIGSTOP: silent, not dead. The survivors give up on it after COMMSCHED_TIMEOUT and finish; resumed afterwards,
    it finds the job finished and exits 0 (so the launcher can return)."""
    cmd = [commsched_bin(), "launch", "-w", "4", "-s", "0", "--min-workers", "2", "--", PYTHON, str(WORKER),
           "--out", str(tmp_path)]
    env = child_env({"COMMSCHED_BACKEND": "gloo", "COMMSCHED_TIMEOUT": "3", "ELASTIC_VICTIM": "1",
                     "ELASTIC_FAULT": "stop", "ELASTIC_FAULT_STEP": "6"})
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(glob.glob(str(tmp_path / "*.pt"))) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        frozen = (tmp_path / "frozen.pid")
        if frozen.exists():
            os.kill(int(frozen.read_text()), signal.SIGCONT)
        log, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, log
    assert frozen.exists(), log
    assert "the job finished before worker" in log, log
    assert_survivors(results(tmp_path), ["0", "2", "3"], 3, reference, log)


def test_below_the_minimum_every_process_stops_saying_so(tmp_path):
    rc, log = elastic_launch(tmp_path, workers=3, min_workers=3,
                             env={"ELASTIC_VICTIM": "1", "ELASTIC_FAULT": "kill", "ELASTIC_FAULT_STEP": "3"})
    assert rc != 0, log
    assert "fewer workers than the minimum remain" in log, log
    # Both survivors raise it themselves (no hang, no teardown needed).
    stopped = sorted(pathlib.Path(tmp_path).glob("stopped.*.txt"))
    assert [p.name for p in stopped] == ["stopped.0.txt", "stopped.2.txt"], log
    for p in stopped:
        assert "fewer workers than the minimum remain (2 < 3, --min-workers)" in p.read_text(), log
    assert "still running 20 s after" not in log, log
    assert not results(tmp_path), log


def test_a_failure_that_loses_nobody_is_raised_after_three_tries(tmp_path):
    rc, log = elastic_launch(tmp_path, workers=2, min_workers=1,
                             env={"ELASTIC_FAULT": "mismatch", "ELASTIC_FAULT_STEP": "2"})
    assert rc != 0, log
    stopped = sorted(pathlib.Path(tmp_path).glob("stopped.*.txt"))
    assert [p.name for p in stopped] == ["stopped.0.txt", "stopped.1.txt"], log
    for p in stopped:
        assert "failed 3 times in a row without losing a worker" in p.read_text(), log
    assert "elastic.mismatch" in log, log


def test_a_restarted_worker_joins_at_the_next_commit_and_gets_the_state(tmp_path, reference):
    rc, log = elastic_launch(tmp_path, extra=["--restarts", "1"],
                             env={"ELASTIC_VICTIM": "2", "ELASTIC_FAULT": "kill", "ELASTIC_FAULT_STEP": "4",
                                  "ELASTIC_WAIT_FOR_SIZE": "4"})
    assert rc == 0, log
    assert "starting it again as a joiner" in log, log
    # Let in at the next commit, or with the survivors' re-forming if it was already waiting by then.
    assert "formed with 4 worker(s)" in log, log
    assert_survivors(results(tmp_path), ["0", "1", "3", "4"], 4, reference, log)


@pytest.mark.parametrize("servers", [0, 1], ids=["gloo", "ps"])
def test_workers_added_at_start_join_at_the_first_commit(tmp_path, reference, servers):
    rc, log = elastic_launch(tmp_path, workers=3, extra=["--join-workers", "1", "--max-workers", "4"],
                             env={"ELASTIC_WAIT_FOR_SIZE": "4"}, servers=servers)
    assert rc == 0, log
    assert "generation 1 formed with 4 worker(s) (was 3; workers joined)" in log, log
    assert_survivors(results(tmp_path), ["0", "1", "2", "3"], 4, reference, log)


def test_torchrun_max_restarts_meets_in_a_new_generation(tmp_path):
    """torchrun restarts every worker when one dies: the new attempt is generation 1 of commsched's rendezvous (its
    keys differ from the first attempt's) and resumes from the script's checkpoint."""
    env = {k: v for k, v in child_env({}).items() if not k.startswith(("COMMSCHED_", "DMLC_"))}
    env["COMMSCHED_TIMEOUT"] = "10"
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max_restarts", "1", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port_pair()), "--tee", "1", "--redirects", "2",
           str(HERE / "torchrun_restart_worker.py"), "--out", str(tmp_path)]
    rc, log = run_process(cmd, env, 200)
    assert rc == 0, log
    for r in range(2):
        assert f"rank {r} of 2: attempt 1, generation 1, finished at step 10" in log, log
    a, b = (torch.load(tmp_path / f"model.{r}.pt") for r in range(2))
    assert all(torch.equal(a[k], b[k]) for k in a), log


def test_the_sampler_gives_every_sample_once_per_epoch_when_a_worker_is_lost(tmp_path):
    """The lost worker's committed batches count as processed on the survivors too (each rank records every rank's
    batch): the survivors share what the epoch has left, repeating nothing and skipping nothing."""
    cmd = [commsched_bin(), "launch", "-w", "3", "-s", "0", "--min-workers", "2", "--", PYTHON,
           str(HERE / "elastic_sampler_worker.py"), str(tmp_path)]
    rc, log = run_process(cmd, child_env({"COMMSCHED_TIMEOUT": "5", "COMMSCHED_BACKEND": "gloo"}), 150)
    assert rc == 0, log
    assert "worker 2 exited with status 137" in log and len(re.findall(r"finished as rank \d of 2", log)) == 2, log
    for epoch in range(2):
        seen = [s for f in tmp_path.glob("samples.*.jsonl") for line in f.read_text().splitlines()
                for e, samples in [json.loads(line)] if e == epoch for s in samples]
        assert sorted(seen) == list(range(36)), f"epoch {epoch}: {sorted(seen)}\n{log}"


def test_launch_refuses_elastic_settings_without_a_minimum():
    out = subprocess.run([commsched_bin(), "launch", "-w", "2", "-s", "0", "--restarts", "1", "--", "true"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "set --min-workers too" in out.stderr, out.stderr
    out = subprocess.run([commsched_bin(), "launch", "-w", "2", "-s", "0", "--min-workers", "3", "--max-workers", "2",
                          "--", "true"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "--min-workers 3 is above --max-workers 2" in out.stderr, out.stderr


def test_states_commit_restore_and_the_sampler_in_one_process(tmp_path):
    script = tmp_path / "states.py"
    script.write_text(STATES_SCRIPT)
    rc, out = run_single([script])
    assert rc == 0 and "states ok" in out, out


STATES_SCRIPT = r'''
import torch
import commsched.torch as hvd

hvd.init()
model = torch.nn.Linear(2, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=3, seen=[1])
calls = []
state.register_reset_callbacks([lambda: calls.append(1)])
before = {k: v.clone() for k, v in model.state_dict().items()}
state.epoch, state.seen = 4, [1, 2]
sampler.record_batch(0, 4)
state.commit()
with torch.no_grad():
    model.weight.add_(1.0)
state.epoch = 9
state.seen.append(3)
sampler.record_batch(1, 4)
state.restore()
assert state.epoch == 4 and state.seen == [1, 2], (state.epoch, state.seen)
assert torch.equal(model.weight, before["weight"])
assert sorted(sampler.processed_indices) == [0, 1, 2, 3] and list(sampler) == [4, 5, 6, 7, 8, 9], list(sampler)
state.sync()
state.on_reset()
assert calls == [1]
obj = hvd.elastic.ObjectState(step=5)
obj.step = 6
obj.restore()
assert obj.step == 5

@hvd.elastic.run
def train(state, factor):
    return state.epoch * factor

assert train(state, 2) == 8  # without an elastic store: called once

# Unnamed operations are numbered from 0 in every Context: a generation's survivors (a new Context each) and its
# joiners (new processes) then name them alike.
from commsched.torch import ops
hvd.allreduce(torch.ones(1))
assert ops._auto_name("allreduce", None) != "allreduce.noname.0"
hvd.shutdown()
hvd.init()
assert ops._auto_name("allreduce", None) == "allreduce.noname.0"
print("states ok")
hvd.shutdown()
'''

"""torchrun starts Horovod-style scripts with no COMMSCHED_* variable (Gloo all-reduce, no servers), and the DDP comm
hook gives the parameters of plain DDP (within 1e-6) on Gloo under torchrun and on the PS under commsched launch."""
import os
import signal
import subprocess

import torch

from torch_cluster import HERE, PYTHON, child_env, commsched_bin, free_port_pair, launch, run_process


def torchrun(script_args, nproc=2, timeout=120, master_port=None, extra=None):
    env = {k: v for k, v in child_env({}).items() if not k.startswith(("COMMSCHED_", "DMLC_"))}
    env["COMMSCHED_TIMEOUT"] = "10"  # a failure ends in seconds, not minutes
    env.update(extra or {})
    # --tee 1 --redirects 2: Debian's torch 1.13 on Python 3.11 fails on its own default of 0 (an enum flag
    # lookup that finds no member for 0).
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
           "--master_port", str(master_port or free_port_pair()), "--tee", "1", "--redirects", "2"]
    cmd += [str(a) for a in script_args]
    return run_process(cmd, env, timeout)


def test_torchrun_horovod_script_runs_on_gloo_and_ranks_agree(tmp_path):
    rc, log = torchrun([HERE / "torchrun_train.py", "--out", tmp_path])
    assert rc == 0, log
    assert "rank 0 of 2 on gloo: sum of ones 2.0" in log and "rank 1 of 2 on gloo: sum of ones 2.0" in log, log
    a, b = (torch.load(tmp_path / f"model.{r}.pt") for r in range(2))
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs between ranks"


def test_torchrun_workers_use_servers_started_with_commsched_server(tmp_path):
    master = free_port_pair()
    env = {k: v for k, v in child_env({}).items() if not k.startswith(("COMMSCHED_", "DMLC_"))}
    env.update(COMMSCHED_ROLE="server", COMMSCHED_RANK="0", COMMSCHED_NUM_WORKERS="2", COMMSCHED_NUM_SERVERS="1",
               COMMSCHED_ROOT_ADDR="127.0.0.1", COMMSCHED_ROOT_PORT=str(master + 1), COMMSCHED_TIMEOUT="10")
    server = subprocess.Popen([commsched_bin(), "server"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        rc, log = torchrun([HERE / "torchrun_train.py", "--out", tmp_path], master_port=master,
                           extra={"COMMSCHED_NUM_SERVERS": "1"})
        assert rc == 0, log
        assert "rank 0 of 2 on ps: sum of ones 2.0" in log and "rank 1 of 2 on ps: sum of ones 2.0" in log, log
        assert server.wait(timeout=20) == 0, server.communicate()[0]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_ddp_hook_matches_plain_ddp_under_torchrun_on_gloo(tmp_path):
    rc, log = torchrun([HERE / "ddp_worker.py", "--out", tmp_path, "--steps", "10"])
    assert rc == 0, log
    assert log.count("max |plain - hooked|") == 2, log


def test_ddp_hook_matches_plain_ddp_on_the_ps(tmp_path):
    store = tmp_path / "store"
    rc, log = launch(2, [HERE / "ddp_worker.py", "--out", tmp_path, "--steps", "10", "--store", store],
                     env={"COMMSCHED_PARTITION_BYTES": "1KiB", "COMMSCHED_CREDIT_BYTES": "4KiB"})
    assert rc == 0, log
    assert log.count("max |plain - hooked|") == 2, log
    a, b = (torch.load(tmp_path / f"hooked.{r}.pt") for r in range(2))
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs between ranks"

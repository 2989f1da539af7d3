"""Helpers of the launcher tests (test_launchers.py, test_kubernetes_examples.py): an environment with no launcher's
variables in it, and a group of processes started together and always reaped."""
import os
import signal
import subprocess

import pytest

from torch_cluster import child_env

LAUNCHER_PREFIXES = ("COMMSCHED_", "DMLC_", "SLURM_", "OMPI_", "PMIX_", "BYTEPS_", "PET_", "TORCHELASTIC_")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def bare_env(extra=None):
    """The suite's environment without any contract variable: what a user's shell has before the launcher."""
    env = {k: v for k, v in child_env({}).items() if not k.startswith(LAUNCHER_PREFIXES) and k not in TORCHRUN_VARS}
    env["COMMSCHED_TIMEOUT"] = "10"  # not part of the contract: a failure ends in seconds
    env["COMMSCHED_PS_DETERMINISTIC"] = "1"  # servers sum in rank order, as `commsched launch --deterministic`
    env.update(extra or {})
    return env


def run_group(commands, timeout=150):
    """Starts every (argv, env) at once, each in its own process group; returns [(returncode, output)] in order.
    On a timeout every process still running is killed and the test fails with what each printed."""
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for cmd, env in commands]
    try:
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    _kill(q)
                logs = "\n".join(f"--- {' '.join(cmd)}:\n{q.communicate()[0]}" for (cmd, _), q in zip(commands, procs))
                pytest.fail(f"timed out after {timeout}s\n{logs}")
        return [(p.returncode, out) for p, out in zip(procs, outs)]
    finally:
        for p in procs:
            _kill(p)


def _kill(p):
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()

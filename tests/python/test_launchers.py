"""The same 4-process training script (launcher_train.py) under commsched launch, torchrun, mpirun and srun, with no
COMMSCHED_* contract variable where the launcher's own describe the cluster: every run trains to the parameters of
commsched launch (bitwise on the parameter server's deterministic mode), with exact sums on Gloo and on the PS. Also BytePS's
job contract (DMLC_*, a scheduler process) and `commsched env`."""
import importlib.util
import os
import shutil
import subprocess

import pytest
import torch

from launcher_cluster import bare_env, run_group
from local_slurm import LocalSlurm
from torch_cluster import HERE, PYTHON, commsched_bin, free_port_pair, launch, run_process

WORKERS = 4
TRAIN = HERE / "launcher_train.py"
BACKENDS = pytest.mark.parametrize("servers", [0, 1], ids=["gloo", "ps"])


def models(out):
    return [torch.load(out / f"model.{r}.pt") for r in range(WORKERS)]


def assert_trained_alike(log, out, reference, backend):
    """Bitwise on the PS (its deterministic mode sums in rank order). Gloo's all-reduce has no such mode: rank 0
    fuses what is queued when a collective starts, and an element's place in the fused buffer decides its ring's
    summation order, so its parameters agree within float rounding."""
    for r in range(WORKERS):
        assert f"rank {r} of {WORKERS} local {r}/{WORKERS} on {backend}: sum 10.0" in log, log
    for r, model in enumerate(models(out)):
        for k, v in reference.items():
            same = torch.equal(model[k], v) if backend == "ps" else torch.allclose(model[k], v, rtol=0, atol=1e-6)
            assert same, f"rank {r}: {k} differs from commsched launch's by {(model[k] - v).abs().max()}\n{log}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The parameters commsched launch trains to, per backend (servers 0: Gloo, 1: the PS)."""
    out = {}
    for servers in (0, 1):
        d = tmp_path_factory.mktemp(f"launch{servers}")
        rc, log = launch(WORKERS, [TRAIN, "--out", d], servers=servers, timeout=120)
        assert rc == 0, log
        out[servers] = models(d)[0]
    return out


def server_cmd(port):
    """One parameter server beside launcher-started workers (a separate process, as a separate srun step would be)."""
    env = bare_env(dict(COMMSCHED_ROLE="server", COMMSCHED_RANK="0", COMMSCHED_NUM_WORKERS=str(WORKERS),
                        COMMSCHED_NUM_SERVERS="1", COMMSCHED_ROOT_ADDR="127.0.0.1", COMMSCHED_ROOT_PORT=str(port)))
    return [commsched_bin(), "server"], env


def run_with_servers(launcher_cmd, env, servers, port):
    """Runs the launcher's command, beside one server when `servers`; returns the launcher's (returncode, output)."""
    if not servers:
        return run_process(launcher_cmd, env, 150)
    (server_rc, server_log), (rc, log) = run_group([server_cmd(port), (launcher_cmd, env)])
    assert rc != 0 or server_rc == 0, server_log
    return rc, log


@BACKENDS
def test_torchrun_trains_like_commsched_launch(tmp_path, reference, servers):
    master = free_port_pair()
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(WORKERS), "--master_addr", "127.0.0.1",
           "--master_port", str(master), "--tee", "1", "--redirects", "2", str(TRAIN), "--out", str(tmp_path)]
    rc, log = run_with_servers(cmd, bare_env({"COMMSCHED_NUM_SERVERS": str(servers)}), servers, master + 1)
    assert rc == 0, log
    assert_trained_alike(log, tmp_path, reference[servers], "ps" if servers else "gloo")


def mpirun_cmd():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("mpirun not installed (apt-get install openmpi-bin; .ci/install-deps.sh does)")
    # As root Open MPI wants its flag; --oversubscribe: 4 ranks on fewer cores.
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [mpirun, *root, "--oversubscribe", "--bind-to", "none", "-np", str(WORKERS)]


@BACKENDS
def test_mpirun_trains_like_commsched_launch(tmp_path, reference, servers):
    # Gloo: rank, size, local rank and size, the loopback root and its port all come from mpirun's variables. The PS:
    # its server is a separate process, so the workers are told where it meets them.
    cmd = mpirun_cmd() + [PYTHON, str(TRAIN), "--out", str(tmp_path)]
    port = free_port_pair()
    extra = {"COMMSCHED_NUM_SERVERS": "1", "COMMSCHED_ROOT_PORT": str(port)} if servers else {}
    rc, log = run_with_servers(cmd, bare_env(extra), servers, port)
    assert rc == 0, log
    assert_trained_alike(log, tmp_path, reference[servers], "ps" if servers else "gloo")


@pytest.fixture(scope="module")
def slurm():
    cluster = LocalSlurm()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@BACKENDS
def test_srun_trains_like_commsched_launch(tmp_path, reference, slurm, servers):
    train = [PYTHON, str(TRAIN), "--out", str(tmp_path)]
    if not servers:  # no COMMSCHED_* contract variable: srun's describe the job, its node list the root
        cmd = ["srun", "-n", str(WORKERS), "-O", *train]
    else:  # one job, two steps: the server and the workers meet at the root derived from the job's id and node list
        server = f"srun --overlap -n 1 -O --export=ALL,COMMSCHED_ROLE=server,COMMSCHED_NUM_WORKERS={WORKERS} " \
                 f"{commsched_bin()} server"
        workers = f"srun --overlap -n {WORKERS} -O --export=ALL,COMMSCHED_NUM_SERVERS=1 {' '.join(train)}"
        cmd = ["salloc", "-n", str(WORKERS + 1), "-O", "bash", "-c", f"{server} & {workers}; rc=$?; wait; exit $rc"]
    # The root is the node's name, not loopback: the processes bind beyond loopback, so they share a secret, as on a
    # real cluster (the one variable a Slurm job needs).
    rc, log = run_process(cmd, slurm.env(bare_env({"COMMSCHED_SECRET": "slurm-test-secret"})), 150)
    assert rc == 0, log
    assert_trained_alike(log, tmp_path, reference[servers], "ps" if servers else "gloo")


def test_ray_train_torch_trainer_trains_like_commsched_launch(tmp_path, reference):
    # Asked, not imported: Ray's libraries in the pytest process would be there for every later test.
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.train") is None:
        pytest.skip("ray[train] is not installed for this interpreter (the test venv has it: scripts/test_venv.sh)")
    # Ray's MASTER_ADDR is the node's address, not loopback: the workers share a secret, as on a real Ray cluster.
    # RAY_DEDUP_LOGS=0: every worker's line reaches the driver's output, not one of each kind.
    env = bare_env({"COMMSCHED_SECRET": "ray-train-test-secret", "RAY_DEDUP_LOGS": "0"})
    rc, log = run_process([PYTHON, str(HERE / "ray_train_driver.py"), "--out", str(tmp_path)], env, 240)
    assert rc == 0, log
    assert_trained_alike(log, tmp_path, reference[0], "gloo")


def test_commsched_env_reports_the_launcher_and_what_it_derived():
    env = bare_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(x2)",
                    "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "41"})
    out = subprocess.run([commsched_bin(), "env"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "launcher: Slurm" in out.stdout, out.stdout
    assert "root_addr = gpu07  (Slurm: first host of SLURM_JOB_NODELIST)" in out.stdout, out.stdout
    assert "worker 2 of 4" in out.stdout and "root=gpu07:10164" in out.stdout, out.stdout
    env["OMPI_COMM_WORLD_RANK"] = "3"
    env["OMPI_COMM_WORLD_SIZE"] = "4"
    out = subprocess.run([commsched_bin(), "env"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stdout
    assert "SLURM_PROCID=2 (Slurm) and OMPI_COMM_WORLD_RANK=3 (Open MPI) disagree" in out.stderr, out.stderr


def test_byteps_job_runs_with_its_dmlc_contract(tmp_path):
    """A bpslaunch-style job: a scheduler, one server and the workers, each told only DMLC_* and BYTEPS_* variables;
    the scheduler exits 0 at once, the workers train (push_pull through `import commsched.torch as bps`)."""
    port = free_port_pair()
    common = bare_env({"DMLC_NUM_WORKER": str(WORKERS), "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
                       "DMLC_PS_ROOT_PORT": str(port), "BYTEPS_PARTITION_BYTES": "4096000",
                       "BYTEPS_SCHEDULING_CREDIT": "2"})
    rc, log = run_process([PYTHON, str(TRAIN), "--out", str(tmp_path)], dict(common, DMLC_ROLE="scheduler"), 60)
    assert rc == 0 and "commsched needs no scheduler process" in log, log
    rc, log = run_process([commsched_bin(), "server"], dict(common, DMLC_ROLE="scheduler"), 30)
    assert rc == 0 and "commsched needs no scheduler process" in log, log
    server = ([commsched_bin(), "server"], dict(common, DMLC_ROLE="server", DMLC_SERVER_ID="0"))
    workers = [([PYTHON, str(TRAIN), "--out", str(tmp_path)], dict(common, DMLC_ROLE="worker", DMLC_WORKER_ID=str(r)))
               for r in range(WORKERS)]
    results = run_group([server] + workers, timeout=120)
    for r, (rc, log) in enumerate(results[1:]):
        assert rc == 0, log
        assert f"rank {r} of {WORKERS} local {r}/{WORKERS} on ps: sum 10.0" in log, log
    assert results[0][0] == 0, results[0][1]

"""Each manifest under examples/kubernetes, run on one machine: the test reads its pods (replicas, commands, env),
adds what the operator would set in each pod (Kubeflow's PyTorchJob, Trainer v2 and MPIJob, JobSet's completion
index), maps the pods' DNS names to loopback and its fixed ports to free ones, and starts the processes the pods
would run, all at once. Every one trains launcher_train.py with exact sums."""
import shutil

import pytest

from launcher_cluster import bare_env, run_group
from torch_cluster import HERE, PYTHON, commsched_bin, free_port_pair

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the manifests (python3-yaml / pip PyYAML)")

EXAMPLES = HERE.parents[1] / "examples" / "kubernetes"
SECRET = "kubernetes-example-secret"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
WORKERS = 4


def manifest(name):
    return yaml.safe_load((EXAMPLES / name).read_text())


class Pods:
    """What turns a pod of the manifest into a local process: its names and ports mapped, its image's paths."""

    def __init__(self, out, hosts, ports):
        self.swap = {h: "127.0.0.1" for h in hosts}
        self.swap.update({str(p): str(free_port_pair()) for p in ports})
        self.swap.update({"/workspace/train.py": str(HERE / "launcher_train.py"), "/output": str(out)})

    def local(self, text):
        text = str(text)
        for a, b in self.swap.items():
            text = text.replace(a, b)
        return text

    def command(self, argv):
        programs = {"python3": [PYTHON], "commsched": [commsched_bin()],
                    "torchrun": [PYTHON, "-m", "torch.distributed.run"]}
        cmd = [word for a in argv for word in programs.get(a, [self.local(a)])]
        if argv[0] == "mpirun":  # this machine has fewer cores than the job has processes
            cmd.insert(1, "--oversubscribe")
        return cmd

    def env(self, container, operator_env, index=0):
        """The container's env (values, the secret, the completion index) over what the operator sets."""
        env = bare_env({k: self.local(v) for k, v in operator_env.items()})
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = self.local(e["value"])
                continue
            source = e["valueFrom"]
            if "secretKeyRef" in source:
                env[e["name"]] = SECRET
            elif source.get("fieldRef", {}).get("fieldPath") == COMPLETION_INDEX:
                env[e["name"]] = str(index)
            else:
                raise AssertionError(f"{e['name']}: a source this test cannot render: {source}")
        return env


def assert_trained(results, backend, local_size):
    logs = "\n".join(log for _, log in results)
    for rc, log in results:
        assert rc == 0, log
    for r in range(WORKERS):
        assert f"rank {r} of {WORKERS} local {r % local_size}/{local_size} on {backend}: sum 10.0" in logs, logs


def test_legacy_pytorchjob_one_process_per_pod(tmp_path):
    job = manifest("pytorchjob-allreduce.yaml")
    name, specs = job["metadata"]["name"], job["spec"]["pytorchReplicaSpecs"]
    container = specs["Master"]["template"]["spec"]["containers"][0]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "pytorchjob-port")
    pods = Pods(tmp_path, [f"{name}-master-0"], [port])
    roles = [("Master", 0)] * specs["Master"]["replicas"] + [("Worker", i) for i in range(specs["Worker"]["replicas"])]
    world = len(roles)
    assert world == WORKERS
    commands = []
    for rank, (role, _) in enumerate(roles):  # the operator: master rank 0, worker i rank i + 1
        c = specs[role]["template"]["spec"]["containers"][0]
        operator = {"MASTER_ADDR": f"{name}-master-0", "MASTER_PORT": port, "WORLD_SIZE": world, "RANK": rank}
        commands.append((pods.command(c["command"]), pods.env(c, operator)))
    assert_trained(run_group(commands), "gloo", local_size=1)


def test_trainer_v2_trainjob_runs_torchrun_per_node(tmp_path):
    job = manifest("trainjob-allreduce.yaml")
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    nodes, per_node = trainer["numNodes"], trainer["numProcPerNode"]
    assert nodes * per_node == WORKERS
    master = f"{name}-node-0-0.{name}"  # the runtime's JobSet: node 0's pod
    pods = Pods(tmp_path, [master], [29400])
    commands = []
    for node in range(nodes):
        operator = {"PET_NNODES": nodes, "PET_NPROC_PER_NODE": per_node, "PET_NODE_RANK": node,
                    "PET_MASTER_ADDR": master, "PET_MASTER_PORT": 29400,
                    # Debian's torch 1.13 under Python 3.11 fails on torchrun's own default of --redirects 0.
                    # stderr then goes to files under the log dir, which a failure shows (torchrun_logs).
                    "PET_TEE": 1, "PET_REDIRECTS": 2, "PET_LOG_DIR": tmp_path / f"torchrun-node-{node}"}
        commands.append((pods.command(trainer["command"]), pods.env(trainer, operator)))
    results = run_group(commands)
    try:
        assert_trained(results, "gloo", local_size=per_node)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{torchrun_logs(tmp_path)}") from None


def torchrun_logs(root):
    """What torchrun redirected into its log dirs (its workers' stderr), file by file."""
    parts = [f"== {f.relative_to(root)}\n{f.read_text(errors='replace')}"
             for f in sorted(root.glob("torchrun-node-*/**/*")) if f.is_file()]
    return "\n".join(parts) or "(torchrun wrote no log files)"


def test_mpijob_launcher_runs_mpirun(tmp_path):
    job = manifest("mpijob-allreduce.yaml")
    name, specs = job["metadata"]["name"], job["spec"]["mpiReplicaSpecs"]
    assert specs["Worker"]["replicas"] * job["spec"]["slotsPerWorker"] == WORKERS
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    # mpirun reaches the worker pods through the operator's hostfile; here every slot is on this machine.
    pods = Pods(tmp_path, [f"{name}-worker-0.{name}-worker"], [29500])
    if not shutil.which("mpirun"):
        pytest.skip("mpirun not installed (apt-get install openmpi-bin; .ci/install-deps.sh does)")
    assert_trained(run_group([(pods.command(launcher["command"]), pods.env(launcher, {}))]), "gloo",
                   local_size=WORKERS)


def test_jobset_ps_with_server_and_worker_roles(tmp_path):
    job = manifest("jobset-ps.yaml")
    name = job["metadata"]["name"]
    pods = Pods(tmp_path, [f"{name}-server-0-0.{name}"], [29500])
    commands = []
    for role in job["spec"]["replicatedJobs"]:  # servers first: server 0 binds the root
        spec = role["template"]["spec"]
        container = spec["template"]["spec"]["containers"][0]
        for index in range(role["replicas"] * spec["parallelism"]):
            commands.append((pods.command(container["command"]), pods.env(container, {}, index)))
    assert sum(c[1]["COMMSCHED_ROLE"] == "worker" for c in commands) == WORKERS
    assert_trained(run_group(commands), "ps", local_size=1)

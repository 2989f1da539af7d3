"""A one-machine Slurm for tests: munged, slurmctld and slurmd on loopback, configured in a temporary folder and
stopped by their pid files afterwards. Needs Debian's slurm-wlm and munge (.ci/install-deps.sh installs them) and root
(slurmd starts job steps as their user; munged runs as the munge user)."""
import os
import pathlib
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest



def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _missing():
    """Why a local Slurm cannot start here, or None."""
    tools = ["munged", "slurmctld", "slurmd", "srun", "salloc", "sinfo"]
    absent = [t for t in tools if not shutil.which(t)]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install slurm-wlm munge; .ci/install-deps.sh does)"
    if os.geteuid() != 0:
        return "a local slurmd and munged need root"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (the munge package makes it)"
    return None


class LocalSlurm:
    """Its folder is its own under /tmp (pytest's are private to root, and munged runs as the munge user)."""

    def __init__(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="commsched-slurm-"))
        os.chmod(self.dir, 0o755)
        self.conf = self.dir / "slurm.conf"

    def env(self, base):
        env = dict(base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def start(self):
        why = _missing()
        if why:
            pytest.skip(f"no local Slurm: {why}")
        self._start_munge()
        self._write_conf()
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([daemon, "-f", str(self.conf)], check=True, timeout=30)
        self._wait_idle()

    def _start_munge(self):
        munge = pwd.getpwnam("munge")
        d = self.dir / "munge"
        d.mkdir(mode=0o700)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for p in (d, key):
            os.chown(p, munge.pw_uid, munge.pw_gid)
        self.munge_socket = d / "munge.socket"
        subprocess.run(["runuser", "-u", "munge", "--", "munged", "--force", f"--socket={self.munge_socket}",
                        f"--key-file={key}", f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                        f"--seed-file={d / 'munged.seed'}"], check=True, timeout=30)
        self._until(lambda: self.munge_socket.exists(), "munged's socket", d / "munged.log")

    def _write_conf(self):
        d = self.dir
        host = socket.gethostname().split(".")[0]
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        # A random first job id: the rendezvous port derives from SLURM_JOB_ID, so two suites on one host differ.
        self.conf.write_text(f"""ClusterName=commsched-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
FirstJobId={random.randint(1, 4000)}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd.log'}
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")

    def _wait_idle(self):
        def idle():
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env(os.environ), capture_output=True,
                                 text=True, timeout=10).stdout
            return "idle" in out
        self._until(idle, "the Slurm node to be idle", self.dir / "slurmd.log", self.dir / "slurmctld.log")

    @staticmethod
    def _until(ready, what, *logs, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.2)
        tails = "\n".join(f"--- {log}:\n{log.read_text()[-2000:]}" for log in logs if log.exists())
        raise RuntimeError(f"timed out waiting for {what}\n{tails}")

    def stop(self):
        """Stops every daemon by its pid file (never by name: other Slurms may run here)."""
        pids = []
        for pid_file in (self.dir / "slurmd.pid", self.dir / "slurmctld.pid", self.dir / "munge" / "munged.pid"):
            try:
                pids.append(int(pid_file.read_text().strip()))
            except (OSError, ValueError):
                continue
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False

"""Runs a script on a local commsched cluster (`commsched launch`) with a hard timeout; never leaves processes behind."""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
# The interpreter running the suite runs the workers too, so the suite under the test venv (torch 2.x) trains on
# torch 2.x, and under /usr/bin/python3 on Debian's torch 1.13.
PYTHON = sys.executable


def commsched_bin():
    """The `commsched` executable: $COMMSCHED_BIN, the build tree beside the imported package, or PATH (pip)."""
    if os.environ.get("COMMSCHED_BIN"):
        return os.environ["COMMSCHED_BIN"]
    import commsched._C as C
    build = pathlib.Path(C.__file__).resolve().parents[2]  # <build>/python/commsched/_C*.so
    candidate = build / "plugins" / "commsched"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("commsched")
    if not found:
        pytest.fail("the commsched executable was not found (set COMMSCHED_BIN)")
    return found


def free_port_pair():
    """A port P with P + 1 free too, both checked while held: commsched's rendezvous under torchrun and under a
    multi-node launch listens on --root's port + 1 (a single free port left P + 1 to chance; CI once lost it)."""
    for _ in range(100):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def child_env(extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("COMMSCHED_TIMEOUT", "10")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _kill_session(sid):
    """SIGKILLs every process of session `sid`: the launcher puts its workers in a process group of their own, which
    outlives a kill of the launcher's group (and holds the output pipe open, so reading it would never end). The
    launcher (the session's leader) goes first, so it cannot start another worker meanwhile."""
    try:
        os.kill(sid, signal.SIGKILL)
    except OSError:
        pass
    for entry in pathlib.Path("/proc").iterdir():
        try:
            # Fields after the command's closing parenthesis: state ppid pgrp session ...
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, IndexError, ValueError):  # gone meanwhile
            pass


def run_process(cmd, env, timeout):
    """Runs cmd in its own session; on timeout every process of the session is killed and the test fails."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(proc.pid)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{out}")
    except BaseException:
        _kill_session(proc.pid)
        proc.wait()
        raise
    return proc.returncode, out


def launch(workers, script_args, env=None, timeout=120, deterministic=True, servers=1, transport=None):
    """transport: None (launch's choice: UCX shared memory where built in, else ZeroMQ; with the run's secret either
    way), "zmq" or "ucx" (UCX shared memory)."""
    env = dict(env or {})
    if transport:
        env["COMMSCHED_PS_TRANSPORT"] = transport
        if transport == "ucx":
            env.setdefault("UCX_TLS", "sm,self")
    cmd = [commsched_bin(), "launch", "-w", str(workers), "-s", str(servers)]
    if deterministic:
        cmd.append("--deterministic")
    cmd += ["--", PYTHON] + [str(a) for a in script_args]
    rc, out = run_process(cmd, child_env(env), timeout)
    if rc != 0 and transport == "ucx" and "this build has no UCX" in out:
        pytest.skip("this build has no UCX (install libucx-dev and rebuild)")
    return rc, out


def run_single(script_args, env=None, timeout=60):
    """One plain process, no cluster contract (the default single-rank loopback backend)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("COMMSCHED_", "DMLC_"))}
    full = child_env(env or {})
    full = {k: v for k, v in full.items() if k in clean or k in (env or {}) or k == "PYTHONPATH"}
    return run_process([PYTHON] + [str(a) for a in script_args], full, timeout)


def finish_launchers(procs, timeout):
    """Waits for launchers started side by side (one per node); kills them all when one does not exit in time.
    Returns their exit codes and outputs, in the order given."""
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("a launcher did not exit: " + "\n".join(p.communicate()[0] for p in procs))
    return [p.returncode for p in procs], outs

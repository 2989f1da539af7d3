"""Multi-node `commsched launch` without ssh: two launchers (node 0 and node 1) on this machine, meeting at node 0's
--root; the cluster spans both; a failed worker or Ctrl-C on either node tears both nodes down. And `commsched
horovodrun`, horovodrun's command line over them: on this host, and on two namespace hosts reached through ssh."""
import os
import re
import signal
import subprocess
import time

import pytest

from torch_cluster import HERE, PYTHON, child_env, commsched_bin, finish_launchers as finish, free_port_pair


def start_nodes(mode, servers, workers=1):
    """workers: every node's -w, or a pair (node 0's, node 1's)."""
    port = free_port_pair()
    per_node = workers if isinstance(workers, tuple) else (workers, workers)
    procs = []
    for node in (1, 0):  # node 1 first: it must wait for node 0
        cmd = [commsched_bin(), "launch", "--nnodes", "2", "--node-rank", str(node), "--root", f"127.0.0.1:{port}",
               "-w", str(per_node[node]), "-s", str(servers), "--join-timeout", "30", "--",
               PYTHON, str(HERE / "multinode_worker.py"), mode]
        procs.append(subprocess.Popen(cmd, env=child_env({}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    return procs[1], procs[0]  # node 0, node 1


@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_two_launchers_form_one_cluster(servers):
    codes, outs = finish(start_nodes("ok", servers, workers=2), 60)
    log = "\n".join(outs)
    assert codes == [0, 0], log
    for r in range(4):
        node = r // 2
        assert f"rank {r} of 4 local {r % 2}/2 cross {node}: sum 10.0" in outs[node], log


def rank_reports(log, size):
    """Each 'ok' worker's report as (rank, local rank, local size, sum), wherever it is in the log: two hosts' lines
    can reach the log run together (one host's line is cut by the other's)."""
    found = re.findall(rf"rank (\d+) of {size} local (\d+)/(\d+) cross \d+: sum ([\d.]+)", log)
    return sorted((int(r), int(local), int(n), float(total)) for r, local, n, total in found)


def test_nodes_of_different_sizes_number_their_workers_one_after_the_other():
    """-w 2 on node 0 and -w 1 on node 1 (horovodrun -H a:2,b:1): ranks 0..2, each exactly once."""
    codes, outs = finish(start_nodes("ok", 0, workers=(2, 1)), 60)
    log = "\n".join(outs)
    assert codes == [0, 0], log
    assert rank_reports(log, 3) == [(0, 0, 2, 6.0), (1, 1, 2, 6.0), (2, 0, 1, 6.0)], log
    for r, (node, local, size) in enumerate([(0, 0, 2), (0, 1, 2), (1, 0, 1)]):
        assert f"rank {r} of 3 local {local}/{size} " in outs[node], log


@pytest.mark.parametrize("hierarchical", ["", "gloo"], ids=["flat", "hierarchical"])
def test_a_parameter_server_run_refuses_nodes_of_different_sizes_naming_the_counts(monkeypatch, hierarchical):
    """Each worker's automatic partition size follows its host's share: uneven nodes would cut tensors differently."""
    monkeypatch.setenv("COMMSCHED_HIERARCHICAL", hierarchical)
    codes, outs = finish(start_nodes("ok", 1, workers=(2, 1)), 60)
    assert codes[0] != 0 and codes[1] != 0, "\n".join(outs)
    for out in outs:
        assert "a parameter-server run (-s) needs the same number of workers on every node, but the nodes run 2,1" \
            in out, out


def test_a_failed_worker_on_node_1_tears_down_node_0():
    t0 = time.monotonic()
    codes, outs = finish(start_nodes("fail", 1), 40)
    assert codes[0] != 0 and codes[1] != 0, "\n".join(outs)
    assert "worker 1 exited with status 3" in outs[0], outs[0]
    assert time.monotonic() - t0 < 30


def test_ctrl_c_on_node_1_tears_down_node_0():
    node0, node1 = start_nodes("wait", 0)
    t0 = time.monotonic()
    # Wait until both workers run (they print), then interrupt node 1's launcher.
    line = ""
    while "waiting" not in line and time.monotonic() - t0 < 30:
        line = node1.stdout.readline()
    node1.send_signal(signal.SIGINT)
    codes, outs = finish([node0, node1], 30)
    assert codes[0] != 0 and codes[1] == 130, "\n".join(outs)
    assert "interrupted" in outs[0], outs[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_two_launchers_on_two_namespace_hosts():
    cmd = [str(HERE / "netns_two_nodes.sh"), commsched_bin(), "1", "1", "--", PYTHON,
           str(HERE / "multinode_worker.py"), "ok"]
    res = subprocess.run(cmd, env=child_env({}), capture_output=True, text=True, timeout=90)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    assert "node0| rank 0 of 2 local 0/1 cross 0: sum 3.0" in log, log
    assert "node1| rank 1 of 2 local 0/1 cross 1: sum 3.0" in log, log


def horovodrun(args, timeout=120):
    res = subprocess.run([commsched_bin(), "horovodrun", *args], env=child_env({"COMMSCHED_BACKEND": "gloo"}),
                         capture_output=True, text=True, timeout=timeout)
    return res.returncode, res.stdout + res.stderr


def test_horovodrun_on_this_host_runs_np_workers_with_horovodruns_settings(tmp_path):
    """--timeline-filename becomes COMMSCHED_TIMELINE: each rank writes its trace."""
    timeline = tmp_path / "t.json"
    rc, log = horovodrun(["-np", "2", "--timeline-filename", str(timeline), PYTHON, str(HERE / "multinode_worker.py"),
                          "ok"])
    assert rc == 0, log
    for r in range(2):
        assert f"rank {r} of 2 local {r}/2 cross 0: sum 3.0" in log, log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.rank0.json", "t.rank1.json"], log


@pytest.mark.parametrize("args, error", [
    (["-np", "5", "-H", "a:2,b:2"], "-np 5 is more than the hosts' 4 slot(s)"),
    (["--mpi", "-np", "2"], "--mpi is not supported: commsched starts its own processes"),
    (["-np", "2", "--fusion-threshold-mb", "32"], "unknown option --fusion-threshold-mb"),
    (["-np", "2", "-H", "localhost:1,b:1"], "name each by an address the others reach, not 'localhost'"),
    (["-H", "a:2"], "-np (the number of workers) is required"),
], ids=["too-many", "mpi", "unknown", "localhost", "no-np"])
def test_horovodrun_refuses_what_it_cannot_run_naming_why(args, error):
    rc, log = horovodrun(args + ["python3", "-c", "pass"], timeout=30)
    assert rc != 0 and error in log, log


def netns_horovodrun(np, slots_a, slots_b, mode):
    """horovodrun -np NP -H A:SLOTS_A,B:SLOTS_B on two namespace hosts (netns_horovodrun.sh); its output."""
    cmd = [str(HERE / "netns_horovodrun.sh"), commsched_bin(), str(np), str(slots_a), str(slots_b), "--", PYTHON,
           str(HERE / "multinode_worker.py"), mode]
    res = subprocess.run(cmd, env=child_env({"COMMSCHED_BACKEND": "gloo"}), capture_output=True, text=True,
                         timeout=120)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    return log


def test_horovodrun_refuses_an_environment_larger_than_ssh_input_naming_the_largest_variables():
    big = {f"BIG{i}": "x" * (100000 + i) for i in range(11)}  # one variable may hold at most 128 KiB (execve)
    res = subprocess.run([commsched_bin(), "horovodrun", "-np", "2", "-H", "10.9.9.1:1,10.9.9.2:1", "--ssh-command",
                          "false", "python3", "-c", "pass"], env=child_env(big), capture_output=True, text=True,
                         timeout=30)
    assert res.returncode != 0, res.stderr
    assert "the largest variables: BIG10 (100010 bytes), BIG9 (100009 bytes), BIG8" in res.stderr, res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_horovodrun_on_two_namespace_hosts_over_ssh():
    """Both hosts are started over (a stand-in for) ssh with a bare environment: the workers find torch and
    commsched through the forwarded environment, and prove the secret that came on ssh's stdin."""
    log = netns_horovodrun(4, 2, 2, "ok")
    for r in range(4):
        assert f"rank {r} of 4 local {r % 2}/2 cross {r // 2}: sum 10.0" in log, log
    # --verbose prints each host's ssh command line: nothing of the run (secret, environment) is on it.
    lines = [line for line in log.splitlines() if line.startswith("[commsched horovodrun] host ")]
    assert len(lines) == 2 and all('read -r script' in line for line in lines), log
    assert "COMMSCHED" not in "".join(lines) and "PYTHONPATH" not in "".join(lines), log


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_horovodrun_places_uneven_shares_as_horovodrun_does():
    """-np 3 -H A:2,B:2: two workers on A, one on B; every rank once, and one all-reduce over all three."""
    log = netns_horovodrun(3, 2, 2, "ok")
    assert rank_reports(log, 3) == [(0, 0, 2, 6.0), (1, 1, 2, 6.0), (2, 0, 1, 6.0)], log


def processes_with(token):
    """The pids of the processes whose command line holds `token`."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    pids.append(int(entry))
        except (OSError, ValueError):
            pass
    return pids


def gone_within(token, seconds):
    """Whether every process holding `token` exits within `seconds`; SIGKILLs those left, so that none outlives the
    test."""
    deadline = time.monotonic() + seconds
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_with(token)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return not left


def lifeline_launch(workers, command):
    """`launch --stdin-lifeline` (Gloo) with stdin, stdout and stderr on pipes, once its `workers` say they wait."""
    cmd = [commsched_bin(), "launch", "--stdin-lifeline", "-w", str(workers), "-s", "0", "--", *command]
    proc = subprocess.Popen(cmd, env=child_env({"COMMSCHED_BACKEND": "gloo"}), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    waiting, t0 = 0, time.monotonic()
    while waiting < workers and time.monotonic() - t0 < 30:
        waiting += proc.stdout.readline().count("waiting")  # two ranks may share a line
    assert proc.poll() is None and waiting == workers, "the workers did not start"
    return proc


def ended_within(proc, seconds):
    """Whether proc ended in time; if not, its session is killed."""
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


def test_a_launcher_with_stdin_lifeline_stops_its_workers_when_stdin_closes():
    """What a remote host's launcher does when its ssh dies or horovodrun closes the pipe (no signal reaches it)."""
    token = f"lifeline-{os.getpid()}-{time.monotonic_ns()}"
    proc = lifeline_launch(2, [PYTHON, str(HERE / "multinode_worker.py"), "wait", token])
    proc.stdin.close()
    if not ended_within(proc, 20):
        gone_within(token, 0)
        pytest.fail("the launcher ignored its stdin's end: " + proc.stdout.read())
    out = proc.stdout.read()
    assert proc.returncode == 130 and "stdin closed" in out, out
    assert gone_within(token, 10), "workers outlived their launcher"


def test_a_launcher_whose_ssh_is_gone_stops_its_workers_children_too():
    """sshd closes the remote command's stdin, stdout and stderr together: the launcher's next message must not kill
    it by SIGPIPE before it stops its workers (their parent-death signal reaches them, not a script's children)."""
    token = f"lifeline-pipe-{os.getpid()}-{time.monotonic_ns()}"
    worker = f"{PYTHON} {HERE / 'multinode_worker.py'} wait {token}; true"  # a grandchild of the launcher
    proc = lifeline_launch(1, ["/bin/sh", "-c", worker])
    proc.stdout.close()
    proc.stdin.close()
    ended_within(proc, 20)
    assert proc.returncode == 130, f"the launcher ended with {proc.returncode} (-13: SIGPIPE)"
    assert gone_within(token, 10), "a worker's child outlived its launcher"


def test_stdin_lifeline_refuses_a_stdin_that_is_not_a_pipe():
    """Run by hand from a terminal, cron or nohup (/dev/null), the lifeline would end the run at once or on Ctrl-D."""
    proc = subprocess.run([commsched_bin(), "launch", "--stdin-lifeline", "-w", "1", "-s", "0", "--", "true"],
                          env=child_env({}), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--stdin-lifeline watches a pipe" in proc.stderr, proc.stderr


def test_with_stdin_lifeline_workers_read_an_empty_stdin_not_the_launchers():
    """The launcher keeps the lifeline to itself: a worker reading stdin gets end-of-file at once, as it did once the
    remote shell had read its script (it would otherwise wait on ssh's channel for the whole run)."""
    cmd = [commsched_bin(), "launch", "--stdin-lifeline", "-w", "1", "-s", "0", "--", PYTHON, "-c",
           "import sys; print('read', len(sys.stdin.read()), 'bytes', flush=True)"]
    proc = subprocess.Popen(cmd, env=child_env({}), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        proc.wait(timeout=30)  # stdin still open
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail("the worker waited on the launcher's stdin: " + proc.stdout.read())
    out = proc.stdout.read()
    proc.stdin.close()
    assert proc.returncode == 0 and "read 0 bytes" in out, out


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_ctrl_c_on_horovodrun_stops_every_remote_host():
    """Both hosts are remote (over the ssh stand-in, which, as ssh without a tty, forwards no signal): Ctrl-C (SIGINT
    to the foreground process group) reaches only this host's processes, and every remote launcher and worker still
    stops, because ssh's stdin closes."""
    token = f"ctrl-c-{os.getpid()}-{time.monotonic_ns()}"
    cmd = [str(HERE / "netns_horovodrun.sh"), commsched_bin(), "3", "2", "1", "--", PYTHON,
           str(HERE / "multinode_worker.py"), "wait", token]
    proc = subprocess.Popen(cmd, env=child_env({"COMMSCHED_BACKEND": "gloo"}), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, waiting, t0 = [], 0, time.monotonic()
    while waiting < 3 and time.monotonic() - t0 < 60:
        line = proc.stdout.readline()
        lines.append(line)
        waiting += line.count("waiting")  # two ranks may share a line
    assert waiting == 3, "".join(lines)
    os.killpg(proc.pid, signal.SIGINT)
    stopped = gone_within(token, 15)
    try:
        out = proc.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
    assert stopped, "remote launchers or workers outlived Ctrl-C:\n" + "".join(lines) + out

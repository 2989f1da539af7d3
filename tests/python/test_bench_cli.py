"""`commsched bench`: the grid simulated, and run as real local parameter-server clusters (--mode cluster)."""
import csv
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from torch_cluster import child_env, commsched_bin, run_process


def tiny_profile(path):
    """Three layers, 4 MiB of gradients, 30 ms of compute: a cluster trial of a few iterations takes about a second."""
    tensors = [
        {"name": "conv.w", "layer": 0, "dtype": "f32", "elements": 65536, "forward_ms": 3.0, "backward_ms": 6.0},
        {"name": "conv.b", "layer": 0, "dtype": "f32", "elements": 64, "forward_ms": 0.0, "backward_ms": 0.0},
        {"name": "mid.w", "layer": 1, "dtype": "f32", "elements": 262144, "forward_ms": 3.0, "backward_ms": 6.0},
        {"name": "fc.w", "layer": 2, "dtype": "f32", "elements": 720896, "forward_ms": 4.0, "backward_ms": 8.0},
    ]
    path.write_text(json.dumps({"name": "tiny", "source": "test", "batch_size": 1, "device": "none",
                                "tensors": tensors}))
    return path


def test_cluster_mode_measures_each_cell_beside_the_simulator(tmp_path):
    profile = tiny_profile(tmp_path / "tiny.json")
    out = tmp_path / "out"
    cmd = [commsched_bin(), "bench", "--mode", "cluster", "--models", str(profile), "--bandwidths", "0.5gbit",
           "--workers", "2", "--policies", "wfbp,bytescheduler", "--trials", "2", "--trial-iterations", "3",
           "--trial-warmup", "2", "--partitions", "256KiB", "--credit-multipliers", "4", "--out", str(out)]
    rc, text = run_process(cmd, child_env({}), timeout=240)
    assert rc == 0, text
    assert "(1 of 2 cells, " in text and "(2 of 2 cells, " in text and "s left)" in text, text  # progress lines
    with open(out / "cluster.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["policy"] for r in rows] == ["wfbp", "bytescheduler"]
    bytes_per_iteration = 4 * (65536 + 64 + 262144 + 720896)
    link_s = bytes_per_iteration * 8 / 0.5e9  # each worker pushes every byte once per iteration
    for r in rows:
        trials = [float(t) for t in r["trials_ms"].split()]
        assert len(trials) == 2
        real, sim = float(r["cluster_ms"]), float(r["sim_ms"])
        assert abs(real - sum(trials) / 2) < 0.01 * real
        # No run beats the emulated link, and the simulator is in the same range as the real run.
        assert real > 0.9 * link_s * 1e3, r
        assert 0.5 < sim / real < 2.0, r
        assert r["knobs"].startswith("partition 256 KiB, credit 1 MiB") or r["policy"] != "bytescheduler", r
        # What the trials used of the machine: a share of all cores, and some CPU of the cluster's own processes.
        assert 0 < float(r["machine_busy"]) <= 1 and float(r["trial_cores"]) > 0, r
    assert "% busy, cluster " in (out / "cluster.md").read_text()
    # The measured cells are written in the simulator's formats too (speedups over WFBP filled in).
    with open(out / "results.csv") as f:
        cells = {r["policy"]: r for r in csv.DictReader(f)}
    assert float(cells["wfbp"]["speedup_vs_wfbp"]) == 1.0
    assert abs(float(cells["bytescheduler"]["iteration_ms"]) - float(rows[1]["cluster_ms"])) < 0.01
    assert "Measured on a local PS cluster" in (out / "results.md").read_text()


def test_simulated_grid_prints_progress_with_time_left(tmp_path):
    profile = tiny_profile(tmp_path / "tiny.json")
    cmd = [commsched_bin(), "bench", "--models", str(profile), "--bandwidths", "1gbit,10gbit", "--workers", "2,4",
           "--policies", "wfbp,bytescheduler", "--out", str(tmp_path / "out")]
    rc, text = run_process(cmd, child_env({}), timeout=240)
    assert rc == 0, text
    for done in range(1, 5):
        assert f"commsched bench: {done} of 4 cells, " in text, text
    assert text.count("s left") == 4, text


def test_ps_message_cost_is_charged_by_default_and_can_be_set(tmp_path):
    """Real NICs: the measured 5 us per message (the default) makes the PS slower than no per-message cost."""
    profile = tiny_profile(tmp_path / "tiny.json")

    def step_ms(name, extra):
        out = tmp_path / name
        rc, text = run_process([commsched_bin(), "bench", "--models", str(profile), "--bandwidths", "10gbit",
                                "--workers", "4", "--network", "ps", "--policies", "wfbp", "--ps-workers", "each",
                                *extra, "--out", str(out)], child_env({}), timeout=120)
        assert rc == 0, text
        return float(next(csv.DictReader(open(out / "results.csv")))["iteration_ms"]), (out / "results.md").read_text()

    default_ms, report = step_ms("default", [])
    free_ms, _ = step_ms("free", ["--ps-message-cost", "0"])
    dear_ms, _ = step_ms("dear", ["--ps-message-cost", "1ms"])
    assert "5 us per message" in report
    assert free_ms < default_ms < dear_ms, (free_ms, default_ms, dear_ms)
    rc, text = run_process([commsched_bin(), "bench", "--models", str(profile), "--ps-message-cost", "fast",
                            "--out", str(tmp_path / "bad")], child_env({}), timeout=60)
    assert rc != 0 and "--ps-message-cost" in text, text


def test_cluster_mode_refuses_what_it_cannot_run(tmp_path):
    profile = tiny_profile(tmp_path / "tiny.json")
    base = [commsched_bin(), "bench", "--mode", "cluster", "--models", str(profile), "--out", str(tmp_path / "o")]
    rc, text = run_process(base + ["--network", "allreduce"], child_env({}), timeout=60)
    assert rc != 0 and "only --network ps" in text
    rc, text = run_process(base + ["--partitions", "1MiB,4MiB"], child_env({}), timeout=60)
    assert rc != 0 and "--partitions: cluster mode runs one knob setting, got 2" in text
    sim_only = pathlib.Path(commsched_bin()).parent.parent / "simulator" / "commsched-sim"
    if sim_only.exists():  # the standalone simulator cannot launch clusters and says where to go
        rc, text = run_process([str(sim_only)] + base[1:], child_env({}), timeout=60)
        assert rc != 0 and "use `commsched bench --mode cluster`" in text


def simulate_directly(profile, out, ps_workers, extra=()):
    """`commsched bench --mode sim` at the knobs resimulate_one_cell gives, emulated links: the rows by policy."""
    rc, text = run_process([commsched_bin(), "bench", "--mode", "sim", "--models", str(profile), "--bandwidths",
                            "500mbit", "--workers", "2", "--servers", "2", "--network", "ps", "--latency", "50us",
                            "--policies", "bytescheduler", "--partitions", "4MiB", "--credit-multipliers", "1",
                            "--small-tensor", "0", "--ps-workers", ps_workers, "--emulated-links", *extra,
                            "--out", str(out)], child_env({}), timeout=120)
    assert rc == 0, text
    return {r["policy"]: float(r["iteration_ms"]) for r in csv.DictReader(open(out / "results.csv"))}


def resimulate_one_cell(tmp_path, executable):
    """A cluster.csv of one real cell (the columns of an older run, no knobs column), predicted again."""
    profile = tiny_profile(tmp_path / "tiny.json")
    real = tmp_path / "real.csv"
    real.write_text("model,bandwidth,workers,servers,policy,cluster_ms,ci95_ms,trials_ms\n"
                    f"{profile},0.5gbit,2,2,bytescheduler,100.0,1.0,99.0 101.0\n")
    rc, text = run_process([executable, "bench", "--mode", "cluster", "--resimulate", str(real), "--latency", "50us",
                            "--partitions", "4MiB", "--credit-multipliers", "1", "--small-tensor", "0",
                            "--out", str(tmp_path / "out")], child_env({}), timeout=120)
    assert rc == 0, text
    rows = list(csv.DictReader(open(tmp_path / "out" / "cluster.csv")))
    assert len(rows) == 1, rows
    assert rows[0]["machine_busy"] == "-1", rows  # an older cluster.csv has no CPU columns: unknown, not zero
    assert "not measured" in (tmp_path / "out" / "cluster.md").read_text()
    return profile, rows[0]


def test_resimulate_predicts_the_knobs_the_real_cell_ran(tmp_path):
    """--resimulate sets each real cell beside the simulated row of the knobs that cell ran. The grid also reports the
    scheduler at its automatic knobs ("bytescheduler-auto", the first row), which must not stand in for it: a
    validation would then compare a run at some knobs with a simulation at others."""
    profile, got = resimulate_one_cell(tmp_path, commsched_bin())
    assert (got["cluster_ms"], got["ci95_ms"], got["trials_ms"], got["servers"]) == ("100", "1", "99 101", "2"), got
    each = simulate_directly(profile, tmp_path / "each", "each")
    assert abs(each["bytescheduler"] - each["bytescheduler-auto"]) > 1.0, each  # the two rows can be told apart
    assert abs(float(got["sim_ms"]) - each["bytescheduler"]) < 0.01, (got, each)
    assert abs(float(got["sim_over_real"]) - each["bytescheduler"] / 100.0) < 1e-3, got
    # The symmetric column: one representative worker simulated, at the same knobs.
    one = simulate_directly(profile, tmp_path / "one", "one")
    assert abs(float(got["sim_one_ms"]) - one["bytescheduler"]) < 0.01, (got, one)
    assert "| sim ms, symmetric |" in (tmp_path / "out" / "cluster.md").read_text()


def test_standalone_simulator_resimulates_too(tmp_path):
    """commsched-sim cannot launch clusters, but predicting measured cells again needs none."""
    sim_only = pathlib.Path(commsched_bin()).parent.parent / "simulator" / "commsched-sim"
    if not sim_only.exists():
        pytest.skip(f"no standalone simulator at {sim_only} (an installed package ships only `commsched`)")
    _, got = resimulate_one_cell(tmp_path, str(sim_only))
    assert float(got["sim_ms"]) > 0 and float(got["sim_one_ms"]) > 0, got


def test_resimulate_names_a_missing_column(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("model,bandwidth,workers,policy,cluster_ms\nvgg16,1gbit,2,wfbp,10\n")
    rc, text = run_process([commsched_bin(), "bench", "--mode", "cluster", "--resimulate", str(bad),
                            "--out", str(tmp_path / "o")], child_env({}), timeout=60)
    assert rc != 0 and f"'{bad}' has no column servers" in text, text


def netns_unavailable():
    """Why real shaped links cannot be made here (None when they can): root, ip netns and tc tbf are needed."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    name = f"cbprobe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return "ip netns add is not permitted here"
    try:
        ok = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate",
                             "1gbit", "burst", "256kb", "latency", "20ms"], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None if ok else "tc tbf is not available (sch_tbf)"


def test_cluster_mode_over_real_shaped_links(tmp_path):
    """--links netns: every process in its own network namespace, links shaped with tbf; predicted with the real-NIC
    model (the rate given to the simulator is the TCP payload share of the shaped rate)."""
    why = netns_unavailable()
    if why:
        pytest.skip(f"--links netns {why}")
    profile = tiny_profile(tmp_path / "tiny.json")
    out = tmp_path / "out"
    cmd = [commsched_bin(), "bench", "--mode", "cluster", "--links", "netns", "--auth", "off", "--models",
           str(profile), "--bandwidths", "0.5gbit", "--workers", "2", "--policies", "bytescheduler", "--trials", "2",
           "--trial-iterations", "3", "--trial-warmup", "2", "--partitions", "256KiB", "--out", str(out)]
    rc, text = run_process(cmd, child_env({}), timeout=300)
    assert rc == 0, text
    row = next(csv.DictReader(open(out / "cluster.csv")))
    link_ms = 4 * (65536 + 64 + 262144 + 720896) * 8 / 0.5e9 * 1e3
    assert float(row["cluster_ms"]) > 0.9 * link_ms, row
    assert 0.5 < float(row["sim_over_real"]) < 2.0 and 0.5 < float(row["sim_one_over_real"]) < 2.0, row

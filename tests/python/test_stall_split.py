"""bench/simgrid/stall_split.py: splits a simulated period's waits by where in the iteration they fall."""
import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "simgrid" / "stall_split.py"


def span(lane, first, start, end):
    return {"lane": lane, "first": first, "last": first, "start_ms": start, "end_ms": end, "bytes": 0, "parts": 0}


def write_run(folder, period_s):
    # Two layers: forward 0-1, 1.5-2.5 (a 0.5 ms wait), backward 2.5-4.5, 4.7-5.7 (a 0.2 ms wait). Layer 0's tensor
    # starts to leave 0.3 ms after the backward's end and its sum is in 2 ms later.
    spans = [span("forward", 0, 0, 1), span("forward", 1, 1.5, 2.5), span("backward", 1, 2.5, 4.5),
             span("backward", 0, 4.7, 5.7), span("comm", 1, 4.5, 6.0), span("comm", 0, 6.0, 7.0),
             span("comm", 0, 6.1, 8.0)]
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps([
        {"model": "m", "bandwidth_bps": 1e10, "workers": 4, "policy": "bytescheduler", "iteration_s": period_s},
        {"model": "m", "bandwidth_bps": 1e10, "workers": 4, "policy": "wfbp", "iteration_s": period_s}]))
    (folder / "timeline-m.json").write_text(json.dumps({
        "model": "m", "bandwidth_bps": 1e10, "workers": 4,
        "policies": [{"policy": "bytescheduler", "knobs": "k", "spans": spans}]}))


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_the_waits_add_up_to_the_period_above_compute(tmp_path):
    write_run(tmp_path / "out", 0.0065)
    out = run(tmp_path / "out")
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "period 6.50 ms, compute 5.00 ms" in line, line
    assert "forward_wait 0.50 ms, backward_wait 0.20 ms, before_first_layer 0.80 ms" in line, line
    assert "first_tensor_start_after_backward 0.30 ms, first_tensor_push_to_sum 2.00 ms" in line, line


def test_a_policy_without_a_timeline_is_named_in_the_error(tmp_path):
    write_run(tmp_path / "out", 0.0065)
    out = run(tmp_path / "out", "wfbp")
    assert out.returncode != 0
    assert "no row of policy 'wfbp' with a timeline" in out.stderr

"""The link measured at startup (plugins/api/link_probe.h) on local clusters: with tuning on, every worker times a few
reduces through the real backend before its first step, and rank 0's numbers are what the warm start simulates."""
import json
import re

import pytest

from torch_cluster import child_env, commsched_bin, launch, run_process

# A worker that only connects (tuning on: the probe runs in the Context's constructor) and leaves.
WORKER = "import commsched._C as C\nctx = C.Context(tune=True)\nctx.shutdown()\n"
# Rank 0's probe line (the tuner's warm-start line quotes it again, under its own prefix).
MEASURED = re.compile(r"^\[commsched\] link measured at startup: ([0-9.]+) (Mbit|Gbit)/s", re.M)


def measured_bps(out):
    found = MEASURED.findall(out)
    assert len(found) == 1, f"expected one measurement line (rank 0's):\n{out}"
    value, unit = found[0]
    return float(value) * (1e9 if unit == "Gbit" else 1e6)


def test_the_measured_bandwidth_is_the_emulated_rate():
    # 2 workers, 1 server: the server sends both workers the sum, so the probe sees 2 bytes on the busiest link per
    # byte of the tensor; the token bucket paces every process's sends at 200 Mbit/s. A loaded machine only slows the
    # exchange (a lower rate); the pacing cannot be beaten by much: 0.6x .. 1.15x.
    rate = 200e6
    rc, out = launch(2, ["-c", WORKER], env={"COMMSCHED_EMULATE_RATE": "200mbit"}, timeout=120, deterministic=False)
    assert rc == 0, out
    got = measured_bps(out)
    assert 0.6 * rate <= got <= 1.15 * rate, f"measured {got / 1e6:.1f} Mbit/s on a 200 Mbit/s emulated link:\n{out}"
    assert "over 1 servers" in out and "latency" in out, out


def test_the_probe_can_be_turned_off():
    rc, out = launch(2, ["-c", WORKER], env={"COMMSCHED_EMULATE_RATE": "200mbit", "COMMSCHED_LINK_PROBE": "off"},
                     timeout=120, deterministic=False)
    assert rc == 0, out
    assert not MEASURED.search(out), out
    rc, out = launch(2, ["-c", WORKER], env={"COMMSCHED_LINK_PROBE": "sometimes"}, timeout=120, deterministic=False)
    assert rc != 0 and "COMMSCHED_LINK_PROBE" in out, out


def test_the_probe_measures_an_all_reduce_too():
    import commsched._C as C
    if not C.build.get("gloo"):
        pytest.skip("this build has no Gloo (install libgloo-dev and rebuild)")
    rc, out = launch(2, ["-c", WORKER], servers=0, timeout=120, deterministic=False)
    assert rc == 0, out
    assert measured_bps(out) > 0, out
    assert "all-reduce" in out and "per ring step" in out, out


def test_commsched_run_tunes_from_the_measured_link_and_the_profiles_compute(tmp_path):
    # `commsched run --tune` on a local PS cluster: the warm start simulates the profile's compute on the link the
    # Context measured at startup (the plugin's warm start, with the compute known instead of measured), under the
    # same rule for where tuning starts.
    tensors = [{"name": f"t{i}", "layer": i, "dtype": "f32", "elements": 1 << 18, "forward_ms": 2, "backward_ms": 4}
               for i in range(16)]  # 16 MiB of gradients, 96 ms of compute
    profile = tmp_path / "sixteen.json"
    profile.write_text(json.dumps({"name": "sixteen", "source": "test", "batch_size": 1, "tensors": tensors}))
    env = child_env({"COMMSCHED_TUNER_TRIALS": "2", "COMMSCHED_TUNER_MIN_TRIALS": "1"})
    rc, out = run_process([commsched_bin(), "run", "--backend", "ps", "-w", "2", "-s", "1", "--bandwidth", "1gbit",
                           "--model", str(profile), "--policies", "bytescheduler+tune", "--iterations", "2",
                           "--warmup", "1", "--timeline-dir", ""], env, timeout=240)
    assert rc == 0, out
    got = measured_bps(out)
    assert 0.4e9 <= got <= 1.15e9, f"measured {got / 1e6:.1f} Mbit/s on a 1 Gbit/s emulated link:\n{out}"
    assert "warm start: simulated 2 workers x 1 servers" in out, out
    assert "the profile's compute 96.0 ms" in out and "measured backward" not in out, out
    warm = [line for line in out.splitlines() if "warm start: simulated" in line]
    assert len(warm) == 1 and "link measured at startup" in warm[0], out  # the probe's numbers, not the estimate

"""The option, policy and backend registries as Python sees them: init() keywords, the flush rule, generated flags."""
import os
import subprocess
import time

import pytest

from commsched import _C
from commsched import _runtime_core as core
from torch_cluster import commsched_bin


def test_options_come_from_the_registry():
    names = {o["name"] for o in _C.options()}
    assert {"policy", "partition_bytes", "trials", "chunk_bytes", "backend", "collective_fusion_bytes"} <= names
    for o in _C.options():
        assert o["env"].startswith("COMMSCHED_") and o["doc"] and o["allowed"], o


def test_init_keywords_map_to_options(monkeypatch):
    monkeypatch.setenv("COMMSCHED_TUNER_TRIALS", "12")  # restored after the test, whatever init() sets
    engine = core._split_options({"partition": "1MiB", "credit-bytes": "unlimited", "trials": 3}, "commsched.torch")
    assert engine == {"partition_bytes": "1MiB", "credit_bytes": "unlimited"}
    assert os.environ["COMMSCHED_TUNER_TRIALS"] == "3"  # read by the tuner's layer when the Context connects


def test_unknown_keyword_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown option 'partition_size'.*partition_bytes"):
        core._split_options({"partition_size": "1MiB"}, "commsched.torch")


def test_flush_rule_comes_from_the_policy_registry():
    holding = {p["name"] for p in _C.policies() if p["holds_tasks"]}
    assert core._HOLDING_POLICIES == holding
    assert holding and holding < {p["name"] for p in _C.policies()}


def test_build_flags_come_from_the_backend_registry():
    for b in _C.backends():
        assert _C.build[b["name"]] == b["available"]
    assert _C.build["ps"] and _C.build["loopback"]


def run_cli(*args):
    return subprocess.run([commsched_bin(), *args], capture_output=True, text=True, timeout=60)


def test_run_has_a_flag_per_engine_option():
    help_text = run_cli("run", "--help").stdout
    for o in _C.options():
        if o["group"] == "engine" and o["name"] not in ("policy", "timeline"):
            assert o["name"].replace("_", "-") in help_text, o["name"]
    assert "--partition" in help_text  # the older flag, an alias of the option


def test_bad_generated_flag_names_flag_value_and_allowed():
    r = run_cli("run", "--model", "vgg16", "--iterations", "1", "--warmup", "0", "--timeline-dir", "",
                "--fusion-bytes", "lots")
    assert r.returncode != 0
    assert "--fusion-bytes='lots' is invalid" in r.stderr and "MiB" in r.stderr, r.stderr


def test_options_command_prints_every_variable():
    out = run_cli("options").stdout
    for o in _C.options():
        assert o["env"] in out
    policies = run_cli("options", "--policies").stdout
    for p in _C.policies():
        assert f"`{p['name']}`" in policies
    knobs = run_cli("options", "--knobs").stdout  # the README's knob table, from the knob rows
    assert _C.knob_names()
    for name in _C.knob_names():
        assert f"`{name}`" in knobs, name


def test_context_knobs_are_the_knob_set():
    ctx = _C.Context(engine={"partition_bytes": "1MiB"}, backend="loopback")
    try:
        knobs = ctx.knobs()
        assert list(knobs) == _C.knob_names()
        assert knobs["partition_bytes"] == 1 << 20
        with pytest.raises(ValueError, match="unknown knob 'colour'.*partition_bytes"):
            ctx.set_knobs({"colour": 1})
    finally:
        ctx.shutdown()


def test_tuner_state_reports_the_best_of_every_knob(monkeypatch):
    for var, value in {"TRIALS": "2", "MIN_TRIALS": "2", "INITIAL": "2", "WARMUP": "0", "WINDOW": "1", "WINDOWS": "1",
                       "DRIFT": "0", "REUSE": "0", "STORE": ""}.items():
        monkeypatch.setenv(f"COMMSCHED_TUNER_{var}", value)
    ctx = _C.Context(backend="loopback", tune=True)
    try:
        for _ in range(8):
            time.sleep(0.002)  # a step of measurable length
            ctx.iteration_end()
        state = ctx.tuner_state()
        assert state["trials"] >= 1, state
        for name in _C.knob_names():
            assert isinstance(state[f"best_{name}"], int), state
    finally:
        ctx.shutdown()


def test_cross_iteration_default_is_read_through_the_registry(monkeypatch):
    monkeypatch.setenv("COMMSCHED_CROSS_ITERATION", "off")
    assert core.cross_iteration_default() is False
    monkeypatch.setenv("COMMSCHED_CROSS_ITERATION", "maybe")
    with pytest.raises(ValueError, match="COMMSCHED_CROSS_ITERATION"):
        core.cross_iteration_default()
    monkeypatch.delenv("COMMSCHED_CROSS_ITERATION")
    assert core.cross_iteration_default() is True
    assert "cross_iteration" in {o["name"] for o in _C.options()}


def test_context_keywords_init_does_not_take_set_their_variable(monkeypatch):
    monkeypatch.setenv("COMMSCHED_CROSS_ITERATION", "1")  # restored after the test, whatever init() sets
    assert core._split_options({"cross_iteration": 0}, "commsched.torch") == {}
    assert os.environ["COMMSCHED_CROSS_ITERATION"] == "0"
    with pytest.raises(ValueError, match=r"pass 'tune' as init\(tune=...\)"):
        core._split_options({"tune": 1}, "commsched.torch")

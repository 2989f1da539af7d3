"""torch.compile with DistributedOptimizer at its defaults: 2 workers and 1 server train a compiled model (LR scheduler,
backward_passes_per_step=2, zero_grad(set_to_none) alternating, a module called twice, with and without a graph
break); every rank ends bitwise equal to the same compiled model under WFBP waiting in step(), and the overlap
survives compilation (step() defers updates) wherever it can be exact: where torch has torch.library.custom_op
(>= 2.4), each module's updates land inside the compiled graph, before its forward, with no graph break. model.compile()
without model= falls back to waiting in step() with one warning that says why. Compiled autograd too."""
import json

import pytest
import torch

from commsched.torch import compiled
from torch_cluster import HERE, launch

if not hasattr(torch, "compile"):
    pytest.skip(f"torch {torch.__version__} has no torch.compile (it came in 2.0)", allow_module_level=True)

WORKERS = 2
ENGINE_ENV = {"COMMSCHED_PARTITION_BYTES": "256", "COMMSCHED_CREDIT_BYTES": "1KiB"}
WAITING = {"COMMSCHED_POLICY": "wfbp", "COMMSCHED_CROSS_ITERATION": "0"}


def run(tmp_path, env, *args):
    out = tmp_path / "-".join(["run"] + [f"{k}{v}" for k, v in env.items()] + [a.strip("-") for a in args])
    out.mkdir()
    rc, log = launch(WORKERS, [HERE / "compiled_worker.py", "--out", out, *args], dict(ENGINE_ENV, **env),
                     timeout=300)
    assert rc == 0, log
    states = [torch.load(out / f"{r}.pt") for r in range(WORKERS)]
    info = [json.loads((out / f"{r}.json").read_text()) for r in range(WORKERS)]
    return states, info, log


_waiting = {}


def run_waiting(tmp_path, *args):
    """The same compiled model under WFBP waiting in step(). model= changes nothing there (no update is deferred),
    so runs that differ only in it share one."""
    key = tuple(a for a in args if a != "--pass-model")
    if key not in _waiting:
        _waiting[key] = run(tmp_path, WAITING, *key)
    return _waiting[key]


def assert_bitwise(a, b, what):
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: '{k}' differs (max abs {float((a[k] - b[k]).abs().max())})"


def check_same(default, waiting):
    for r in range(WORKERS):
        assert_bitwise(waiting[0], default[r], f"rank {r} at the defaults vs rank 0 under WFBP waiting in step()")
        assert_bitwise(waiting[0], waiting[r], f"WFBP: rank {r} vs rank 0")


@pytest.mark.parametrize("variant", [[], ["--graph-break"], ["--pass-model"], ["--graph-break", "--pass-model"]],
                         ids=["wrap", "wrap-graph-break", "wrap-model=", "wrap-graph-break-model="])
def test_torch_compile_keeps_the_overlap_and_is_bitwise_equal_to_wfbp(tmp_path, variant):
    default, info, log = run(tmp_path, {}, "--compile", "wrap", *variant)
    waiting, waiting_info, _ = run_waiting(tmp_path, "--compile", "wrap", *variant)
    check_same(default, waiting)
    assert all(i["deferred"] > 0 for i in info), f"step() deferred no update on some worker: {info}"
    assert [i["deferred"] for i in waiting_info] == [0] * WORKERS
    if "--graph-break" in variant:
        assert all(i["graph_breaks"] > 0 for i in info), f"the model made no graph break: {info}"
    elif compiled.LANDS_IN_GRAPH:
        assert [i["graph_breaks"] for i in info] == [0] * WORKERS, f"landing updates broke the graph: {info}"
    check_landed_in_graph(info)
    assert "fire an extra time" not in log, log
    assert "waiting in step()" not in log, log


def check_landed_in_graph(info):
    """Where torch has the op, modules inside the compiled graph landed their updates (every step, every module)."""
    if compiled.LANDS_IN_GRAPH:
        assert all(i["landed_in_graph"] > 0 for i in info), f"no module landed its updates in the graph: {info}"
    else:
        assert [i["landed_in_graph"] for i in info] == [0] * WORKERS, info


def test_compile_in_place_with_model_keeps_the_overlap(tmp_path):
    default, info, log = run(tmp_path, {}, "--compile", "inplace", "--pass-model")
    waiting, _, _ = run_waiting(tmp_path, "--compile", "inplace", "--pass-model")
    check_same(default, waiting)
    assert all(i["deferred"] > 0 for i in info), f"step() deferred no update on some worker: {info}"
    check_landed_in_graph(info)
    if compiled.LANDS_IN_GRAPH:  # every module lands its own updates inside the graph: no break
        assert [i["graph_breaks"] for i in info] == [0] * WORKERS, info
    else:  # the root's pre-hook applies the pending updates outside the graph: one break per compiled forward
        assert all(i["graph_breaks"] > 0 for i in info), info


def test_torch_compile_with_a_weight_read_outside_its_module_lands_it_before_the_graph(tmp_path):
    """The head reads b.weight with F.linear without calling b: no hook inside the graph lands b's parameters, so
    the wrapper lands them before its graph runs (never read stale); the other modules still land theirs inside."""
    default, info, log = run(tmp_path, {}, "--compile", "wrap", "--reads-weight")
    waiting, _, _ = run_waiting(tmp_path, "--compile", "wrap", "--reads-weight")
    check_same(default, waiting)
    assert all(i["deferred"] > 0 for i in info), f"step() deferred no update on some worker: {info}"
    check_landed_in_graph(info)
    assert "waiting in step()" not in log, log


def test_compile_in_place_without_model_waits_in_step_with_one_warning(tmp_path):
    default, info, log = run(tmp_path, {}, "--compile", "inplace")
    waiting, _, _ = run_waiting(tmp_path, "--compile", "inplace")
    check_same(default, waiting)
    assert [i["deferred"] for i in info] == [0] * WORKERS, info
    warning = "the forward ran only inside a compiled graph (a model compiled in place with model.compile())"
    assert log.count(warning) == WORKERS, log


@pytest.mark.skipif(not hasattr(getattr(torch._dynamo, "compiled_autograd", None), "_enable"),
                    reason=f"torch {torch.__version__} has no compiled autograd (torch._dynamo.compiled_autograd)")
def test_compiled_autograd_keeps_the_overlap_and_matches_wfbp(tmp_path):
    """Compiled autograd traces backward hooks; the optimizer's stay out of its graph and run eagerly."""
    default, info, log = run(tmp_path, {}, "--compile", "wrap", "--compiled-autograd")
    waiting, _, _ = run_waiting(tmp_path, "--compile", "wrap")  # the same numbers as an uncompiled backward
    check_same(default, waiting)
    assert all(i["compiled_backwards"] > 0 for i in info), f"no backward was compiled: {info}"
    assert all(i["deferred"] > 0 for i in info), info


def test_inductor_matches_wfbp(tmp_path):
    """The default backend (inductor: generated C++ kernels) rather than aot_eager."""
    default, info, _ = run(tmp_path, {}, "--compile", "wrap", "--backend", "inductor", "--steps", "3")
    waiting, _, _ = run_waiting(tmp_path, "--compile", "wrap", "--backend", "inductor", "--steps", "3")
    check_same(default, waiting)
    assert all(i["deferred"] > 0 for i in info), info

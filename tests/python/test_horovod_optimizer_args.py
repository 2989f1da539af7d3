"""Horovod's DistributedOptimizer arguments mean what they mean in Horovod, on the PS and on Gloo: process_set=
averages over the set's members only and refuses other ranks; groups=/num_groups= hold a group's gradients until all
of it is ready and change no result; sparse_as_dense= densifies an embedding's sparse gradient, and without it the
sparse gradient takes the sparse path; gradient_predivide_factor= as Horovod; an argument that cannot be honoured
raises."""
import json

import pytest
import torch

from horovod_args_worker import GROUP_CASES, train
from torch_cluster import HERE, launch
from unchanged_script_worker import TwiceUsed

BACKENDS = pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
STEPS, BATCH = 4, 4


def run(tmp_path, case, workers, servers):
    out = tmp_path / f"{case}-w{workers}-s{servers}"
    out.mkdir()
    rc, log = launch(workers, [HERE / "horovod_args_worker.py", "--out", out, "--case", case, "--steps", STEPS,
                               "--batch", BATCH], servers=servers)
    assert rc == 0, log
    return out, [json.loads((out / f"{r}.json").read_text()) for r in range(workers)]


def states(out, case, ranks):
    return [torch.load(out / f"{case}.{r}.pt") for r in ranks]


def assert_bitwise(a, b, what):
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: '{k}' differs (max abs {float((a[k] - b[k]).abs().max())})"


def assert_close(state, ref, what):
    err = max(float((state[k] - ref[k]).norm() / ref[k].norm()) for k in ref)
    assert err <= 1e-6, f"{what}: relative error {err:.3g} against single-process training"


def reference(workers, sparse=False, late=False):
    """One process on the combined batch of `workers` ranks."""
    return train(STEPS, BATCH * workers, 0, 1, wrap=False, sparse=sparse, late=late)[0]


@BACKENDS
def test_process_set_averages_over_its_members_and_refuses_the_others(tmp_path, servers):
    out, info = run(tmp_path, "process_set", 3, servers)
    s0, s1 = states(out, "process_set", [0, 1])
    assert_bitwise(s0, s1, "rank 1 vs rank 0")
    assert_close(s0, reference(2), "process set {0, 1}")  # averaged over 2 ranks, not 3
    assert "refused" not in info[0] and "refused" not in info[1], info
    assert "rank 2 is not a member; only ranks [0, 1] may train with this optimizer" in info[2]["refused"], info[2]


@BACKENDS
def test_groups_hold_a_group_until_it_is_ready_and_change_no_result(tmp_path, servers):
    out, info = run(tmp_path, "groups", 2, servers)
    plain = states(out, "plain", [0, 1])
    assert_bitwise(plain[0], plain[1], "plain: rank 1 vs rank 0")
    assert_close(plain[0], reference(2), "plain")
    for case in GROUP_CASES:  # predivide by 2 (a power of two) changes no rounding either
        for r, state in enumerate(states(out, case, [0, 1])):
            assert_bitwise(plain[0], state, f"{case} (rank {r}) vs no groups")
    per_step = len(list(TwiceUsed(False).parameters()))
    for r in range(2):
        plain_order = info[r]["order.plain"][:per_step]
        grouped = info[r]["order.groups"][:per_step]
        # b.weight's gradient is among the first ready, inp.weight's the last: the group goes out when inp.weight's is.
        assert plain_order.index("b.weight") < plain_order.index("inp.weight"), plain_order
        assert grouped.index("b.weight") == grouped.index("inp.weight") + 1, grouped


@BACKENDS
@pytest.mark.parametrize("case", ["sparse", "sparse_as_dense"])
def test_sparse_gradients(tmp_path, servers, case):
    out, _ = run(tmp_path, case, 2, servers)
    s0, s1 = states(out, case, [0, 1])
    assert_bitwise(s0, s1, "rank 1 vs rank 0")
    assert_close(s0, reference(2, sparse=True), case)


@BACKENDS
def test_a_param_group_added_after_wrapping_is_averaged_too(tmp_path, servers):
    """Horovod's wrapper leaves it out of the reduction (the ranks drift apart); here it joins it."""
    out, info = run(tmp_path, "add_param_group", 2, servers)
    s0, s1 = states(out, "add_param_group", [0, 1])
    assert_bitwise(s0, s1, "rank 1 vs rank 0")
    assert_close(s0, reference(2, late=True), "a group added halfway")
    refusals = info[0]["refusals"]
    assert "add_param_group() between backward() and step()" in refusals.get("mid_step", ""), refusals
    assert "already being accumulated" in refusals.get("mid_accumulation", ""), refusals
    unnamed = "parameter 0 of the new group (shape (8, 8)) is not in the named_parameters"
    assert unnamed in refusals.get("unnamed", ""), refusals
    assert refusals["unnamed"].endswith("(groups: 1)"), refusals


def test_arguments_that_cannot_be_honoured_raise(tmp_path):
    _, info = run(tmp_path, "errors", 1, 1)
    errors = info[0]["errors"]
    expected = {
        "groups_and_num_groups": "give groups= or num_groups=",
        "foreign_group_member": "groups[0][0]: not a parameter of this optimizer",
        "duplicate_group_member": "groups[1][0]: the parameter is in more than one group",
        "negative_groups": "groups=-1: must be >= 0",
        "predivide_with_sum": "gradient_predivide_factor=2.0 needs op=Average",
        "adasum": "op=Adasum is not supported",
        "max": "op='max' is not supported",
    }
    for case, text in expected.items():
        assert errors[case] is not None and text in errors[case], (case, errors[case])

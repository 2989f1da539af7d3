"""Ask/tell tuner from Python: the bindings in the main module, commsched._C.tuner. Run with PYTHONPATH pointing at
<build>/python (scripts/run_tests.sh does)."""
import math

import pytest

from commsched._C import tuner as t


def branin(u):
    x1, x2 = -5.0 + 15.0 * u[0], 15.0 * u[1]
    b, c, s = 5.1 / (4 * math.pi ** 2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1 ** 2 + c * x1 - 6) ** 2 + 10 * (1 - s) * math.cos(x1) + 10


def test_ask_tell_minimises_branin():
    bo = t.BayesOpt(dim=2, seed=3, candidates=500)
    for _ in range(20):
        x = bo.ask()
        assert len(x) == 2 and all(0.0 <= v <= 1.0 for v in x)
        bo.tell(x, branin(x))
    x, y = bo.best()
    assert bo.num_observations == 20
    assert y < 0.397887 + 1.0  # random search with 20 points averages a regret of about 2.5
    assert bo.last_max_expected_improvement is not None


def test_maximise_and_best_by_model():
    bo = t.BayesOpt(dim=1, goal="maximize", seed=1, candidates=300)
    for _ in range(10):
        x = bo.ask()
        bo.tell(x, -(x[0] - 0.25) ** 2)
    x, y = bo.best_by_model()
    assert abs(x[0] - 0.25) < 0.1
    assert bo.should_stop(10, 0.0)


def test_same_seed_same_points():
    def run(seed):
        bo = t.BayesOpt(dim=2, seed=seed, candidates=200)
        pts = []
        for _ in range(7):
            pts.append(bo.ask())
            bo.tell(pts[-1], branin(pts[-1]))
        return pts

    assert run(5) == run(5)


def test_bad_input_raises_value_error():
    bo = t.BayesOpt(dim=2)
    with pytest.raises(ValueError, match="outside"):
        bo.tell([0.5, 1.5], 1.0)
    with pytest.raises(ValueError, match="goal"):
        t.BayesOpt(dim=2, goal="sideways")


def test_search_space_round_trip_and_units():
    s = t.SearchSpace(min_partition="64KiB", max_partition="64MiB")
    assert t.SearchSpace.dim == 3  # partition, credit, small-tensor fusion bound
    assert s.to_knobs([0.0, 0.0, 0.0]) == (64 << 10, 1, 0)  # credit 1: one batch in flight; fusion 0: off
    assert s.to_knobs([0.0, 1.0 / 8, 0.0]) == (64 << 10, 64 << 10, 0)
    assert s.to_knobs([1.0, 1.0, 1.0]) == (64 << 20, 0, 256 << 20)  # credit 0: unlimited; the largest fusion bound
    for knobs in [(1 << 20, 8 << 20, 0), (256 << 10, 0, 64 << 10), (64 << 20, 64 << 20, 8 << 20), (1 << 20, 1, 0)]:
        assert s.to_knobs(s.from_knobs(*knobs)) == knobs
    with pytest.raises(ValueError, match="COMMSCHED_TUNER_MAX_PARTITION"):
        t.SearchSpace(min_partition="1MiB", max_partition="512KiB")
    narrow = t.SearchSpace(min_small_tensor="64KiB", max_small_tensor="1MiB")
    assert narrow.to_knobs([1.0, 1.0, 1.0])[2] == 1 << 20
    assert narrow.to_knobs([1.0, 1.0, 0.0])[2] == 0  # off stays below the smallest bound
    with pytest.raises(ValueError, match="COMMSCHED_TUNER_MAX_SMALL_TENSOR"):
        t.SearchSpace(min_small_tensor="1MiB", max_small_tensor="512KiB")


def test_search_space_keywords_are_the_generated_bound_options():
    # The keywords are the tuner's bound options, generated from the knob rows (options/knobs.h).
    s = t.SearchSpace(max_credit_multiple=4, unlimited_credit=False, max_partition=1 << 20)
    assert s.to_knobs([1.0, 1.0, 0.0]) == (1 << 20, 4 << 20, 0)
    with pytest.raises(ValueError, match="no_such_bound"):
        t.SearchSpace(no_such_bound=1)
    # Knobs by name; one not given keeps its default.
    assert s.from_knobs(credit_bytes=1, partition_bytes=64 << 10) == s.from_knobs(64 << 10, 1, 0)


def test_tune_a_synthetic_objective_in_knob_space():
    s = t.SearchSpace()
    bo = t.BayesOpt(dim=t.SearchSpace.dim, goal="maximize", seed=2, candidates=500)

    def throughput(part, credit, _fusion):
        mult = 128 if credit == 0 else credit / part
        return 10 / (1 + 0.5 * (math.log2(part / (1 << 20)) / 4) ** 2 + 0.3 * ((math.log2(mult) - 3) / 4) ** 2)

    for _ in range(12):
        u = s.snap(bo.ask())
        bo.tell(u, throughput(*s.to_knobs(u)))
    x, _ = bo.best_by_model()
    assert throughput(*s.to_knobs(x)) > 0.95 * 10

"""The torch.compile guards of commsched.torch.compiled, on whichever torch runs the suite: on torch without
torch.compile (1.13) they report "not compiling" and pass functions through; on 2.x they see dynamo's trace, keep a
function out of the graph, and recognise the module torch.compile(model) returns."""
import pytest
import torch

from commsched.torch import compiled

HAS_COMPILE = hasattr(torch, "compile")


def test_availability_matches_this_torch():
    assert compiled.AVAILABLE == HAS_COMPILE, torch.__version__


def test_eager_code_is_not_compiling_and_plain_modules_are_not_wrappers():
    assert compiled.is_compiling() is False
    m = torch.nn.Linear(2, 2)
    assert not compiled.is_compiled_wrapper(m)
    assert compiled.unwrapped(m) is m


def test_outside_graph_runs_the_function():
    calls = []
    f = compiled.outside_graph(lambda x: calls.append(x) or x + 1)
    assert f(1) == 2 and calls == [1]


@pytest.mark.skipif(not HAS_COMPILE, reason=f"torch {torch.__version__} has no torch.compile (it came in 2.0)")
def test_inside_a_compiled_function_it_is_compiling_and_outside_graph_runs_eagerly():
    seen = []
    record = compiled.outside_graph(lambda: seen.append(compiled.is_compiling()))

    def f(x):
        record()
        return x * 2 if compiled.is_compiling() else x * 3

    out = torch.compile(f, backend="eager")(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0)), "is_compiling() was False inside the compiled function"
    assert seen == [False], "the function kept out of the graph did not run eagerly"


@pytest.mark.skipif(not HAS_COMPILE, reason=f"torch {torch.__version__} has no torch.compile (it came in 2.0)")
def test_compiled_wrapper_is_recognised_and_unwrapped():
    m = torch.nn.Linear(2, 2)
    wrapper = torch.compile(m, backend="eager")
    assert compiled.is_compiled_wrapper(wrapper)
    assert compiled.unwrapped(wrapper) is m


def test_landing_in_graph_matches_this_torch():
    assert compiled.LANDS_IN_GRAPH == (HAS_COMPILE and hasattr(torch.library, "custom_op")), torch.__version__


class _Lander:
    """Stands in for the optimizer: adds 1 to its parameter where the op sits, as an update would."""

    def __init__(self, param):
        self.param, self.calls = param, []

    def land(self, params, positions):
        self.calls.append(list(positions))
        with torch.no_grad():
            self.param.add_(1.0)
            for given in params:
                if given.data_ptr() != self.param.data_ptr():
                    given.copy_(self.param)


@pytest.mark.skipif(not compiled.LANDS_IN_GRAPH,
                    reason=f"torch {torch.__version__} has no torch.library.custom_op (it came in 2.4)")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_landing_op_stays_in_the_graph_and_the_graph_reads_what_it_wrote(backend):
    param = torch.nn.Parameter(torch.zeros(3))
    lander = _Lander(param)
    owner = compiled.register_lander(lander.land)
    landed = {}

    def f(x):
        compiled.land(landed, [param], owner, [7])
        compiled.land(landed, [param], owner, [7])  # a module called twice: lands once
        return x * param

    torch._dynamo.utils.counters.clear()
    out = torch.compile(f, backend=backend)(torch.full((3,), 2.0))
    assert lander.calls == [[7]], "the op's body did not run once, with the positions given"
    assert torch.equal(param.detach(), torch.ones(3)), "the parameter does not hold what the op wrote"
    assert torch.equal(out.detach(), torch.full((3,), 2.0)), "the graph read the parameter from before the op"
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])

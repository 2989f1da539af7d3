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

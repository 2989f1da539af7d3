"""What DistributedOptimizer needs to know about torch.compile, guarded for torch without it (1.13).

Dynamo traces module hooks into the compiled graph (per-module hooks of a compiled module, and process-wide hooks of
every module called inside it), so Python bookkeeping in a hook would be traced, and crashes dynamo or freezes into
the graph. The optimizer's hooks therefore do nothing while dynamo traces (is_compiling()), and pending updates land
before a compiled graph runs instead: from a hook that runs eagerly (the OptimizedModule that torch.compile(model)
returns is called outside the graph), or from a function that dynamo keeps out of the graph (outside_graph: one
graph break at the start of a compiled forward).
"""
import importlib
import warnings

import torch


def _probe():
    compiler = getattr(torch, "compiler", None)
    probe = getattr(compiler, "is_compiling", None)  # torch >= 2.3
    if probe is None and hasattr(torch, "compile"):  # torch 2.0-2.2
        probe = getattr(importlib.import_module("torch._dynamo"), "is_compiling", None)
    return probe


# Dynamo knows this function and folds it to True in traced code; it is False when the code runs eagerly.
_IS_COMPILING = _probe()
AVAILABLE = _IS_COMPILING is not None


def is_compiling():
    return _IS_COMPILING is not None and _IS_COMPILING()


def outside_graph(fn):
    """fn, kept out of compiled graphs (a call from traced code is a graph break and runs eagerly); fn itself where
    torch has no torch.compile."""
    if not AVAILABLE:
        return fn
    return importlib.import_module("torch._dynamo").disable(fn)


def eager_unless_traced(fn):
    """fn for hooks that run on every backward: eager calls go straight to fn (dynamo's disable wrapper costs a few
    microseconds a call, paid per tensor per step); where dynamo traces the call (compiled autograd traces backward
    hooks) the traced code calls outside_graph(fn) instead, a graph break, so fn still runs eagerly there."""
    if not AVAILABLE:
        return fn
    disabled = outside_graph(fn)
    compiling = _IS_COMPILING

    def call(*args):
        if compiling():
            return disabled(*args)
        return fn(*args)
    return call


def is_compiled_wrapper(module):
    """Whether `module` is the OptimizedModule that torch.compile(model) returns: it is called eagerly, and its
    forward runs the compiled graph of the wrapped model."""
    if not AVAILABLE:
        return False
    from torch._dynamo.eval_frame import OptimizedModule
    return isinstance(module, OptimizedModule)


def unwrapped(module):
    """The model a torch.compile(model) wrapper runs; any other module itself."""
    return module._orig_mod if is_compiled_wrapper(module) else module


def quiet_global_hook_warning():
    """torch warns, on every call of a torch.compile(model) wrapper while process-wide module hooks exist, that those
    hooks fire an extra time for the wrapper. The optimizer's process-wide hooks are meant to see the wrapper (they
    apply pending updates there, before the compiled graph runs), so that warning is silenced; its text is
    matched exactly, so other warnings stay."""
    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks on modules",
                            category=UserWarning)

"""What DistributedOptimizer needs to know about torch.compile, guarded for torch without it (1.13).

Dynamo traces module hooks into the compiled graph (per-module hooks of a compiled module, and process-wide hooks of
every module called inside it), so Python bookkeeping in a hook would be traced, and crashes dynamo or freezes into
the graph. The optimizer's hooks therefore keep no bookkeeping while dynamo traces (is_compiling()): a module's
pre-hook puts an op in the graph that lands the module's pending updates there (land(), torch >= 2.4); on older torch
pending updates land before a compiled graph runs instead, from a hook that runs eagerly (the OptimizedModule that
torch.compile(model) returns is called outside the graph), or from a function that dynamo keeps out of the graph
(outside_graph: one graph break at the start of a compiled forward).
"""
import importlib
import warnings
import weakref

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


# ---- landing pending updates inside a compiled graph (torch >= 2.4: torch.library.custom_op) ----
# A module's pre-hook, traced by dynamo, calls an opaque custom op that declares it mutates the module's parameters.
# The op stays in the graph at the start of the module's forward, and every later read of those parameters in the
# graph is ordered after it (functionalization reads the op's results), so each layer's update lands just before its
# forward inside the compiled graph, as in eager mode, with no graph break. The op's body runs eagerly: it waits for
# the gradients and runs the optimizer's update on the real parameters; where the compiler hands it copies of them
# (no reinplacing, e.g. the aot_eager backend), it copies the results in.
LANDS_IN_GRAPH = AVAILABLE and hasattr(torch.library, "custom_op")
_landers = {}      # owner number -> weak reference to the bound method that lands updates (an optimizer's)
_OP = "land_pending_updates"


def _define_land_op():
    @torch.library.custom_op(f"commsched::{_OP}", mutates_args=("params",))
    def land_op(params: list[torch.Tensor], owner: int, positions: list[int]) -> None:
        ref = _landers.get(owner)
        lander = ref() if ref is not None else None
        if lander is not None:
            lander(params, positions)

    @land_op.register_fake
    def _(params, owner, positions):
        return None


def register_lander(method):
    """Registers `method(params, positions)` (a bound method, held weakly) as what the op runs; returns the owner
    number that land() takes. None where torch cannot land updates inside a graph."""
    if not LANDS_IN_GRAPH:
        return None
    if not _landers:
        _define_land_op()
    owner = len(_landers)
    _landers[owner] = weakref.WeakMethod(method)
    return owner


def land(landed, params, owner, positions):
    """Called from a hook that dynamo traces: puts the op in the graph, landing the pending updates of `params`
    (positions: their indices in the owner's parameter list) at this point of the forward, once per forward.
    `landed`: a dict the caller empties when the forward begins. A module called twice lands at its first call
    only: a second op would, to the compiler, mutate parameters the graph has already read (and saved for
    backward). Dynamo replays the dict's changes after each run of the graph, so every run lands the same."""
    key = tuple(positions)
    if key in landed:
        return
    landed[key] = True
    with torch.no_grad():
        torch.ops.commsched.land_pending_updates(params, owner, positions)

"""DistributedOptimizer: wraps any torch optimizer in one line (Horovod-compatible).

Every parameter's gradient becomes a commsched task the moment autograd has accumulated it (a hook on the parameter's
gradient accumulator). Its priority is the parameter's position in forward order: declaration order at first, then
the order learned from forward pre-hooks during the first iteration (when `model=` is given) or the reverse of the
first backward's order (when it is not). At the end of every backward the engine is told (engine.backward_done()),
so BSP and knob changes work; every optimizer step ends with Context.iteration_end() (the auto-tuner's clock).

The optimizer class is assembled from one class per job: gradient_exchange.GradientExchange (gradient hooks,
priorities, submission and results), cross_iteration.CrossIteration (cross-iteration mode, below, and how compiled
models keep it) and _DistributedOptimizer here (construction, Horovod's public API, elastic training); Horovod's
arguments are checked in optimizer_args.

Cross-iteration mode (the default; cross_iteration=False or COMMSCHED_CROSS_ITERATION=0 turns it off): step()
returns at once and each update is applied just before the forward that reads its parameter (cross_iteration.py).
After the last step, call optimizer.flush() (state_dict() does) before reading the parameters other than through a
forward or model.state_dict().
"""
import contextlib
import inspect
import warnings

import torch

from commsched.torch import compiled, ops, optimizer_args, runtime
from commsched.torch.compression import Compression
from commsched.torch.cross_iteration import CrossIteration, ForwardCoverage
from commsched.torch.gradient_exchange import GradientExchange

class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, model, cross_iteration, original, horovod):
        super(self.__class__, self).__init__(params)
        # The class's defaults (e.g. SGD's momentum=0) are not the wrapped optimizer's: a group added later
        # (add_param_group) takes what the wrapped optimizer was given, as it would unwrapped.
        self.defaults = original.defaults
        self.state.update(original.state)
        self._compression = compression
        self._op = ops._resolve_op(None, op)
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step={backward_passes_per_step}: must be >= 1")
        self._passes_per_step = backward_passes_per_step
        optimizer_args.check_predivide(gradient_predivide_factor, self._op)
        self._predivide = gradient_predivide_factor
        self._names = optimizer_args.parameter_names(self.param_groups, named_parameters)
        self._named = named_parameters is not None
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._process_set = horovod["process_set"]
        self._sparse_as_dense = horovod["sparse_as_dense"]
        self._sparse = set()            # parameters seen with a sparse gradient (Horovod's sparse path)
        self._group_of = optimizer_args.resolve_groups(horovod["groups"], horovod["num_groups"], self._params)
        self._group_ready = {}          # group -> its members whose gradient of this step is ready
        self._set_priorities(self._params)
        self._index_groups()
        self._forward_order = []        # params in first-seen forward order (first iteration)
        self._order_final = False
        self._backward_order = []       # params in first backward's hook order (when there is no model)
        self._passes_left = [backward_passes_per_step] * len(self._params)  # by position in self._params
        self._inflight = {}             # p -> _GradTask submitted this step
        self._pending_update = {}       # cross-iteration: p -> _GradTask whose update is not applied yet
        self._pending_order = []        # cross-iteration: the parameters in forward order, when step() deferred
        self._pending_next = 0          # the first of them whose update may still be pending (_apply_pending)
        self._deferred_zero = {}        # p -> set_to_none, for zero_grad() calls made while an update was pending
        self._callback_queued = False
        self._completed_pass = False
        self._backward_done_sent = False
        self._synchronized = False
        self._synchronized_for_scaler = False  # synchronize() was GradScaler.step's (_step_supports_amp_scaling)
        self._should_synchronize = True
        self._warned_fallback = False
        # zero_grad()'s default is the wrapped optimizer's (torch 2.x: set_to_none=True), as Horovod's wrapper inherits
        self._set_to_none_default = _zero_grad_default(original)
        self._keep = []                 # gradient accumulators and hook handles (their lifetime is ours)
        self._register_grad_hooks()
        # The model's signature (gradient sizes in declaration order) keys the auto-tuner's store of best knobs; with
        # the gradients' ready times of the first backwards it is what the tuner's warm start simulates.
        self._tell_model()
        self._ready_times = None        # per parameter, while the tuner wants backward times (rank 0, first steps)
        self._watch_backward_times(self._context())
        self._model = model
        if cross_iteration is None:
            cross_iteration = runtime.cross_iteration_default()
        if cross_iteration and isinstance(self, torch.optim.LBFGS):
            warnings.warn("commsched: LBFGS needs every gradient at once; cross-iteration mode is off for it")
            cross_iteration = False
        self._cross_iteration = bool(cross_iteration)
        self._hyperparameters = None    # cross-iteration: each group's settings when step() deferred the updates
        self._orphans = []              # our parameters no module owns (applied when the outermost forward begins)
        self._ran_eagerly = None        # with model=: parameters whose module's updates landed in the first forward
        self._coverage = None           # without model=: what the forwards showed (ForwardCoverage)
        # Inside compiled graphs, modules' pre-hooks land updates through an op (compiled.land), where torch has it.
        self._owner = compiled.register_lander(self._land_from_graph) if self._cross_iteration else None
        self._landed = {}               # with model=: what a compiled forward has landed so far (compiled.land)
        if model is not None:
            self._ran_eagerly = set()
            # For the root's pre-hook inside a compiled forward: runs eagerly there (made here, not at import:
            # importing dynamo takes a second).
            self._flush_outside_graph = compiled.outside_graph(self.flush)
            self._apply_orphans_outside_graph = compiled.outside_graph(self._apply_orphans)
            self._register_module_hooks(model)
            self._register_state_dict_flush(model)
        elif self._cross_iteration:
            self._coverage = ForwardCoverage(self)
            self._keep.extend(self._coverage.handles)

    def _index_groups(self):
        """Each parameter's param group, for narrowing the groups to a set of parameters (_step_subset)."""
        self._group_index = {p: i for i, g in enumerate(self.param_groups) for p in g["params"]}

    def _tell_model(self):
        self._context().set_model([p.numel() * p.element_size() for p in self._params])

    def add_param_group(self, param_group):
        """A group added after wrapping (e.g. layers unfrozen for fine-tuning) is reduced like the others from the
        next backward on. (Horovod's wrapper hooks only the parameters it was given, so it leaves such a group out of
        the reduction and the ranks drift apart.)"""
        constructing = "_keep" not in vars(self)  # torch's __init__ adds the wrapped optimizer's groups
        if not constructing:
            accumulating = any(n != self._passes_per_step for n in self._passes_left)  # backward_passes_per_step
            if self._inflight or accumulating:
                raise RuntimeError("add_param_group() between backward() and step(): this step's gradients are "
                                   "already " + ("on their way" if self._inflight else "being accumulated") +
                                   "; add the group after step()")
            self.flush()
        super(self.__class__, self).add_param_group(param_group)
        if not constructing:
            try:
                self._adopt(self.param_groups[-1]["params"])
            except ValueError:
                self.param_groups.pop()  # refused: the optimizer stays as it was
                raise

    def _adopt(self, params):
        known = set(self._params)
        new = [p for p in params if p.requires_grad and p not in known]
        start = len(self._params)
        if not self._named:  # param.I by position, as the constructor named them
            self._names = optimizer_args.parameter_names(self.param_groups, None)
        for i, p in enumerate(params):
            if p not in self._names:
                raise ValueError(f"add_param_group(): parameter {i} of the new group (shape {tuple(p.shape)}) "
                                 "is not in the named_parameters given to DistributedOptimizer (give it every "
                                 "parameter the optimizer may hold, e.g. model.named_parameters())")
        self._params.extend(new)
        self._passes_left.extend([self._passes_per_step] * len(new))
        self._index_groups()
        self._set_priorities(self._by_priority)  # the new ones last, until a forward order is learned
        self._register_grad_hooks(start)
        # Their updates land when the outermost forward begins, before any module reads them (cross-iteration).
        self._orphans.extend(new)
        if self._coverage is not None:
            self._coverage.adopt(new)
        self._tell_model()
        self._watch_backward_times(self._context())

    def _context(self):
        """The Context gradients go through: the process set's (the global one by default)."""
        return self._process_set.context()

    def synchronize(self):
        """Waits for every gradient of this step and leaves the averaged gradients in p.grad."""
        if self._pending_update:
            self._apply_pending(list(self._pending_update))
        self._end_of_step_submissions()
        tasks, self._inflight = self._inflight, {}
        for task in tasks.values():
            self._finish(task)
        self._synchronized = True
        self._backward_done_sent = False  # a later backward in this step (a closure) starts a new round

    @contextlib.contextmanager
    def skip_synchronize(self):
        """with optimizer.skip_synchronize(): optimizer.step()  -- after an explicit synchronize()."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    @property
    def _step_supports_amp_scaling(self):
        """GradScaler.step(optimizer) asks this just before it unscales p.grad in place and looks for inf in it. By
        then the gradients must be the averaged ones (as after Horovod's synchronize() / unscale_ / skip_synchronize
        recipe), or it would unscale buffers still being reduced: wrong updates, different on each rank. So they are
        awaited here; False: GradScaler unscales them itself."""
        if getattr(self, "_inflight", None) and self._should_synchronize:
            self.synchronize()
            self._synchronized_for_scaler = True
        return False

    @_step_supports_amp_scaling.setter
    def _step_supports_amp_scaling(self, value):
        """The wrapped class's __init__ may set it (torch's fused optimizers, a subclass fixing fused=True): ignored,
        since GradScaler must unscale the averaged gradients itself (the getter); a fused step without GradScaler's
        arguments is an ordinary one."""
        del value

    def step(self, closure=None):
        runtime.context()  # a clear error when init() was not called
        ctx = self._context()
        if self._overlap_ready() and closure is None and not self._synchronized and self._should_synchronize:
            self._end_of_step_submissions()
            self._pending_update.update(self._inflight)
            self._inflight = {}
            self._pending_order, self._pending_next = self._by_priority, 0
            self._hyperparameters = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
            self._next_step(ctx)
            return None
        if closure is not None:
            return self._step_with_closure(ctx, closure)
        if self._should_synchronize:
            if self._synchronized and not self._synchronized_for_scaler:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(): the gradients are reduced once, as intended, but use "
                              "skip_synchronize() as in Horovod")
            else:
                self.synchronize()
        self._synchronized = self._synchronized_for_scaler = False
        loss = super(self.__class__, self).step(closure)
        self._next_step(ctx)
        return loss

    def _step_with_closure(self, ctx, closure):
        """LBFGS and friends evaluate the closure (forward + backward) possibly several times per step: every
        evaluation's gradients are averaged before the optimizer sees them."""
        if self._cross_iteration and not self._warned_fallback:
            self._warned_fallback = True
            warnings.warn("commsched: step(closure) needs every gradient at once; waiting in step() "
                          "(no cross-iteration overlap)")
        if self._inflight:  # a backward before step(): finish its round (the closure recomputes the gradients)
            self.synchronize()

        def averaged_closure():
            loss = closure()
            self.synchronize()
            return loss

        loss = super(self.__class__, self).step(averaged_closure)
        self._synchronized = False
        self._next_step(ctx)
        return loss

    def _next_step(self, ctx):
        self._backward_done_sent = False
        self._completed_pass = False
        self._group_ready.clear()
        self._passes_left = [self._passes_per_step] * len(self._params)
        ctx.iteration_end()
        self._watch_backward_times(ctx)

    def zero_grad(self, set_to_none=None):
        if set_to_none is None:
            set_to_none = self._set_to_none_default
        if not self._pending_update:
            return super(self.__class__, self).zero_grad(set_to_none)
        # Gradients still on the wire (cross-iteration): zero them once their update is applied.
        for group in self.param_groups:
            for p in group["params"]:
                if p in self._pending_update:
                    self._deferred_zero[p] = set_to_none
                elif p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.detach_()
                        p.grad.zero_()
        return None

    @property
    def cross_iteration(self):
        """Whether step() returns at once and updates are applied by forward pre-hooks."""
        return self._cross_iteration and (self._coverage is None or self._coverage.decided)

    @property
    def pending_updates(self):
        """Number of parameters whose update waits for their module's next forward (cross-iteration mode)."""
        return len(self._pending_update)

    def flush(self):
        """Cross-iteration mode: applies every update still pending (call before reading the final parameters)."""
        if self._pending_update:
            self._apply_pending(list(self._pending_update))

    def state_dict(self):
        self.flush()
        return super(self.__class__, self).state_dict()

    def forget_inflight(self):
        """The group broke mid-step: gradients submitted to it will never be reduced, so they are dropped, not
        applied (the state rolls back to its last commit anyway)."""
        self._inflight.clear()
        self._pending_update.clear()
        self._deferred_zero.clear()
        self._group_ready.clear()
        self._synchronized = self._synchronized_for_scaler = False
        self._backward_done_sent = False
        self._completed_pass = False
        self._passes_left = [self._passes_per_step] * len(self._params)
        for p in self._params:
            p.grad = None

    def rejoin(self):
        """The group was formed again (a new Context): tells it the model, as the constructor told the first."""
        self.forget_inflight()
        self._tell_model()
        self._watch_backward_times(self._context())


def _zero_grad_default(optimizer):
    param = inspect.signature(optimizer.zero_grad).parameters.get("set_to_none")
    return bool(param.default) if param is not None and param.default is not inspect.Parameter.empty else False


def _class_body():
    """The wrapper class's methods: each job's class, then _DistributedOptimizer's own. Taken when an optimizer is
    wrapped (the class derives from the wrapped optimizer's, so the methods are copied, not inherited)."""
    methods = {}
    for job in (GradientExchange, CrossIteration):
        methods.update({k: v for k, v in vars(job).items() if not (k.startswith("__") and k.endswith("__"))})
    methods.update(vars(_DistributedOptimizer))
    return methods


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=ops.Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None, *, model=None, cross_iteration=None):
    """Wraps `optimizer` (any torch.optim.Optimizer) so its gradients are averaged over every worker, scheduled by
    commsched. Horovod's signature, every argument meaning what it means there (optimizer_args.py: process_set,
    groups/num_groups, sparse_as_dense, gradient_predivide_factor); commsched extras (keyword only): model= (learns
    forward order from forward hooks) and cross_iteration= (default: COMMSCHED_CROSS_ITERATION)."""
    horovod = {"process_set": optimizer_args.member_set(process_set), "groups": groups, "num_groups": num_groups,
               "sparse_as_dense": bool(sparse_as_dense)}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), _class_body())
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, model, cross_iteration, optimizer, horovod)

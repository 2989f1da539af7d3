"""DistributedOptimizer: wraps any torch optimizer in one line (Horovod-compatible).

Every parameter's gradient becomes a commsched task the moment autograd has accumulated it (a hook on the parameter's
gradient accumulator). Its priority is the parameter's position in forward order: declaration order at first, then
the order learned from forward pre-hooks during the first iteration (when `model=` is given) or the reverse of the
first backward's order (when it is not). At the end of every backward the engine is told (engine.backward_done()),
so BSP and knob changes work; every optimizer step ends with Context.iteration_end() (the auto-tuner's clock).

Cross-iteration mode (the default; cross_iteration=False or COMMSCHED_CROSS_ITERATION=0 turns it off): step()
returns at once. Before a module's forward, its parameters' gradients are awaited and the wrapped optimizer's own
step() runs on just those parameters, together with every later one whose gradient has already arrived (their param
groups narrowed to them, with the hyperparameters they had when step() was called, so a learning-rate scheduler
stepping in between changes nothing), so the next forward starts while later layers still communicate. This is
exact for optimizers whose update is per parameter (SGD, momentum, Adam, AdamW, RMSprop, Adagrad, ...).

Which modules own which parameters: with model= given, forward pre-hooks on its modules; without it (a Horovod script
that passes only named_parameters), process-wide module hooks (torch.nn.modules.module.register_module_forward_pre_hook)
learn it from the forwards themselves. Overlap starts once one full forward has been seen, and only if every
parameter is a direct parameter of a module that ran in it (else a parameter could be read outside any module's
forward, stale: the optimizer then waits in step(), with a warning that names the parameter; pass model= to cover
it). The outermost module call that holds any of our parameters plays the model's role: at its end every update
still pending (of modules that did not run) is applied, and its state_dict() applies them first. LBFGS, a closure, or
an explicit synchronize() before step() (global-norm clipping) fall back to waiting in step(). After the last step,
call optimizer.flush() (state_dict() does) before reading the parameters other than through a forward or
model.state_dict().

Compiled models (compiled.py): no hook keeps Python bookkeeping while dynamo traces it. Where torch has
torch.library.custom_op (>= 2.4), a module's pre-hook, traced, puts an op in the compiled graph that lands that
module's pending updates just before its forward (no graph break), so a compiled model keeps the per-layer overlap of
eager mode: with model=, every module's hook does; without it, the torch.compile(model) wrapper (called eagerly)
tags its model's modules with which parameters are theirs, and lands before its graph runs only those that no
module landed in the first forward (e.g. a weight read by F.linear outside its module). On older torch the wrapper,
or with model= the root's pre-hook from outside the graph (one graph break), applies every pending update before the
graph runs.
model.compile() without model= leaves no eager hook to learn from, so step() waits (one warning says why).
"""
import contextlib
import time
import warnings
import weakref

import torch

from commsched.torch import collectives, compiled, ops, optimizer_args, runtime
from commsched.torch.compression import Compression

CROSS_ITERATION_VAR = "COMMSCHED_CROSS_ITERATION"


def _direct_parameters(module):
    """The parameters a module's forward reads as its own: its direct parameters and those of parameter containers
    among its children (ParameterList, ParameterDict), which are never called and so run no hooks of their own."""
    params = list(module.parameters(recurse=False))
    for child in module.children():
        if isinstance(child, (torch.nn.ParameterList, torch.nn.ParameterDict)):
            params.extend(child.parameters())
    return params


class _GradTask:
    """A gradient in flight: the C++ handle and how to turn the wire result back into p.grad. A sparse gradient's
    task has no handle: `sparse` waits for its all-gathers and returns the combined sparse gradient."""

    def __init__(self, handle, name, work, cctx, grad, sparse=None):
        self.handle, self.name, self.work, self.cctx, self.grad = handle, name, work, cctx, grad
        self.sparse = sparse

    def arrived(self):
        """Whether the reduced gradient is here (finishing it will not wait); a sparse one is never taken early."""
        return self.sparse is None and (self.handle is None or self.handle.poll())


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, model, cross_iteration, original, horovod):
        super(self.__class__, self).__init__(params)
        self.state.update(original.state)
        self._compression = compression
        self._op = ops._resolve_op(None, op)
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step={backward_passes_per_step}: must be >= 1")
        self._passes_per_step = backward_passes_per_step
        optimizer_args.check_predivide(gradient_predivide_factor, self._op)
        self._predivide = gradient_predivide_factor
        self._names = self._parameter_names(named_parameters)
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._process_set = horovod["process_set"]
        self._sparse_as_dense = horovod["sparse_as_dense"]
        self._sparse = set()            # parameters seen with a sparse gradient (Horovod's sparse path)
        self._group_of = optimizer_args.resolve_groups(horovod["groups"], horovod["num_groups"], self._params)
        self._group_ready = {}          # group -> its members whose gradient of this step is ready
        self._set_priorities(self._params)
        # Each parameter's param group, for narrowing the groups to a set of parameters (_step_subset).
        self._group_index = {p: i for i, g in enumerate(self.param_groups) for p in g["params"]}
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
        self._should_synchronize = True
        self._warned_fallback = False
        self._keep = []                 # gradient accumulators and hook handles (their lifetime is ours)
        self._register_grad_hooks()
        # The model's signature (gradient sizes in declaration order) keys the auto-tuner's store of best knobs; with
        # the gradients' ready times of the first backwards it is what the tuner's warm start simulates.
        self._context().set_model([p.numel() * p.element_size() for p in self._params])
        self._ready_times = None        # per parameter, while the tuner wants backward times (rank 0, first steps)
        self._watch_backward_times(self._context())
        self._model = model
        if cross_iteration is None:
            cross_iteration = runtime.env_flag(CROSS_ITERATION_VAR, default=True)
        if cross_iteration and isinstance(self, torch.optim.LBFGS):
            warnings.warn("commsched: LBFGS needs every gradient at once; cross-iteration mode is off for it")
            cross_iteration = False
        self._cross_iteration = bool(cross_iteration)
        self._hyperparameters = None    # cross-iteration: each group's settings when step() deferred the updates
        self._orphans = []              # our parameters no module owns (applied when the outermost forward begins)
        self._ran_eagerly = None        # with model=: parameters whose module's updates landed in the first forward
        self._coverage = None           # without model=: what the forwards showed (_ForwardCoverage)
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
            self._coverage = _ForwardCoverage(self)
            self._keep.extend(self._coverage.handles)

    # ---- set-up ----
    def _context(self):
        """The Context gradients go through: the process set's (the global one by default)."""
        return self._process_set.context()

    def _parameter_names(self, named_parameters):
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is None:
            return {p: f"param.{i}" for i, p in enumerate(all_params)}
        named = list(named_parameters)
        if any(not (isinstance(t, tuple) and len(t) == 2) for t in named):
            raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                             "usually model.named_parameters()")
        names = [n for n, _ in named]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"named_parameters contains duplicate names: {', '.join(dups)}")
        by_param = {p: n for n, p in named}
        unnamed = [i for i, p in enumerate(all_params) if p not in by_param]
        if unnamed:
            raise ValueError(f"the optimizer has {len(unnamed)} parameter(s) missing from named_parameters "
                             f"(positions {unnamed[:5]} in its param groups)")
        return by_param

    def _register_grad_hooks(self):
        for i, p in enumerate(self._params):
            # The AccumulateGrad node of p: its hook runs once p.grad holds this backward's gradient.
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            # Compiled autograd traces backward hooks into its graph: ours talk to the engine, so they stay out of it
            # (a graph break each) and run eagerly, in backward order.
            acc.register_hook(compiled.eager_unless_traced(self._make_grad_hook(i, p)))
            self._keep.append(acc)
            # Runs before accumulation: an update still pending from the previous step must land first.
            self._keep.append(p.register_hook(compiled.eager_unless_traced(self._make_pre_accumulate_hook())))

    def _register_module_hooks(self, model):
        position = {p: i for i, p in enumerate(self._params)}
        owned = set()
        model.register_forward_pre_hook(self._root_pre_forward)
        for module in model.modules():
            held = _direct_parameters(module)
            local = [j for j, p in enumerate(held) if p in position]
            if local:
                params = [held[j] for j in local]
                owned.update(params)
                hook = self._make_module_pre_hook(params, local, [position[p] for p in params])
                self._keep.append(module.register_forward_pre_hook(hook))
        model.register_forward_hook(self._root_post_forward)
        self._orphans = [p for p in self._params if p not in owned]

    def _register_state_dict_flush(self, module):
        # model.state_dict() shares the parameters' storage, so updates applied in place after it is built still
        # show in it: a checkpoint taken between step() and the next forward holds the updated parameters.
        self._keep.append(module._register_state_dict_hook(lambda *unused: self.flush()))

    # ---- hooks ----
    # While dynamo traces a hook (compiled.is_compiling()) it keeps no Python bookkeeping: a module's pre-hook puts the
    # op that lands its parameters' updates in the graph (compiled.land); where torch has no such op, the root's
    # pre-hook applies every pending update before the compiled graph runs, through a function dynamo keeps out of
    # the graph (a graph break).
    def _root_pre_forward(self, module, inputs):
        self._landed.clear()
        if compiled.is_compiling():
            if self._owner is None:
                self._flush_outside_graph()
            elif self._orphans:  # parameters no module's hook lands
                self._apply_orphans_outside_graph()
        elif self._pending_update and self._orphans:
            self._apply_pending(self._orphans)

    def _apply_orphans(self):
        if self._pending_update:
            self._apply_pending(self._orphans)

    def _root_post_forward(self, module, inputs, output):
        if compiled.is_compiling():
            return
        if self._ran_eagerly is not None:
            self._adopt_hidden_parameters()
        if self._pending_update:  # modules that did not run this time
            self._apply_pending(list(self._pending_update))

    def _adopt_hidden_parameters(self):
        """After the first eager forward with model=: parameters whose module's updates did not land (a module that
        did not run, or a submodule compiled on its own where torch has no op to land them in its graph) are applied
        when the root's forward begins, like parameters no module owns."""
        seen, self._ran_eagerly = self._ran_eagerly, None
        orphans = set(self._orphans)
        self._orphans.extend(p for p in self._params if p not in seen and p not in orphans)

    def _note_forward(self, params):
        seen = set(self._forward_order)
        self._forward_order.extend(p for p in params if p not in seen)

    def _make_module_pre_hook(self, params, local, positions):
        """local: the positions of `params` among the module's direct parameters; positions: in self._params."""
        owner = self._owner

        def hook(module, inputs):
            if compiled.is_compiling():
                if owner is not None:
                    held = _direct_parameters(module)
                    compiled.land(self._landed, [held[j] for j in local], owner, positions)
                return
            if self._ran_eagerly is not None:
                self._ran_eagerly.update(params)
            if not self._order_final:
                self._note_forward(params)
            if self._pending_update:
                self._apply_pending(params)
        return hook

    def _make_pre_accumulate_hook(self):
        def hook(grad):
            if self._pending_update:
                self._apply_pending(list(self._pending_update))
            return grad
        return hook

    def _make_grad_hook(self, i, p):
        # Runs once per tensor per backward: per-parameter counters are kept by position i (a list), since hashing a
        # tensor is a Python call in torch 2.x.
        def hook(*unused):
            runtime.context()  # a clear error when init() was not called
            if not self._order_final:
                self._learn_order(p)
            if self._passes_left[i] <= 0 or p in self._inflight:
                raise RuntimeError(f"gradient of '{self._names[p]}' was computed more than "
                                   f"backward_passes_per_step={self._passes_per_step} times before step(); "
                                   "call step() (or raise backward_passes_per_step)")
            if self._ready_times is not None:
                self._ready_times[i] = time.perf_counter()
            self._queue_backward_end()
            self._passes_left[i] -= 1
            if self._passes_left[i] == 0:
                self._ready(p)
                self._completed_pass = True
        return hook

    def _learn_order(self, p):
        if self._forward_order:
            self._set_priorities(self._forward_order)
            self._order_final = True
        else:  # no module hooks saw this forward (plain functional code): learn from the backward
            self._backward_order.append(p)

    def _set_priorities(self, ordered):
        ordered = list(ordered)
        seen = set(ordered)
        rest = [p for p in self._params if p not in seen]
        self._by_priority = ordered + rest
        self._priority = {p: i for i, p in enumerate(self._by_priority)}

    def _queue_backward_end(self):
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)

    def _watch_backward_times(self, ctx):
        self._ready_times = [-1.0] * len(self._params) if ctx.wants_backward_times else None

    def _report_backward_times(self):
        times, self._ready_times = self._ready_times, None
        if times is not None and any(t >= 0 for t in times):
            self._context().note_backward(times)

    def _on_backward_end(self):
        self._callback_queued = False
        if self._completed_pass:
            self._report_backward_times()
        if not self._order_final and self._backward_order:
            self._set_priorities(reversed(self._backward_order))
            self._order_final = True
        if self._completed_pass:
            self._completed_pass = False
            self._submit_missing()
            self._send_backward_done()

    def _send_backward_done(self):
        if not self._backward_done_sent:
            self._backward_done_sent = True
            self._context().backward_done()

    # ---- communication ----
    def _ready(self, p):
        """p's gradient of this step is complete: submit it, or (groups=) its group once every member is ready."""
        group = self._group_of.get(p)
        if group is None:
            self._submit(p)
            return
        ready = self._group_ready.setdefault(group, set())
        ready.add(p)
        if len(ready) == len(group):
            del self._group_ready[group]
            for q in group:
                self._submit(q)

    def _submit(self, p):
        if p.grad is None:
            p.grad = self._zero_grad_for(p)
        name = f"grad.{self._names[p]}"
        if p.grad.is_sparse:
            if not self._sparse_as_dense:
                self._submit_sparse(p, name)
                return
            p.grad = p.grad.to_dense()
        grad = p.grad.detach()
        if self._predivide != 1.0:
            grad.mul_(1.0 / self._predivide)
        compressed, cctx = self._compression.compress(grad)
        work = compressed if compressed.is_contiguous() else compressed.contiguous()
        handle = runtime.submit(work, name, "reduce", priority=self._priority[p], ctx=self._context(),
                                compression=getattr(self._compression, "engine_spec", None)) if work.numel() else None
        self._inflight[p] = _GradTask(handle, name, work, cctx, grad)

    def _zero_grad_for(self, p):
        """A parameter without a gradient this step still takes part, in the same form as on the other ranks."""
        if p in self._sparse and not self._sparse_as_dense:
            return torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64),
                                           torch.zeros(0, *p.shape[1:], dtype=p.dtype), p.shape)
        return torch.zeros_like(p)

    def _submit_sparse(self, p, name):
        """Horovod's sparse path (no compression, as there): every rank's indices and values are all-gathered."""
        self._sparse.add(p)
        wait = collectives.sparse_allreduce_async(p.grad, name, self._op, self._process_set)
        self._inflight[p] = _GradTask(None, name, None, None, p.grad, sparse=wait)

    def _submit_missing(self):
        """Parameters that got no gradient this step still take part (zero gradient), so every worker sends the
        same tensors; Horovod does the same."""
        if len(self._inflight) < len(self._params):
            for p in self._params:
                if p not in self._inflight:
                    self._submit(p)
        self._passes_left = [self._passes_per_step] * len(self._params)
        self._group_ready.clear()

    def _finish(self, task):
        if task.sparse is not None:
            task.grad.zero_().add_(task.sparse())
            return
        if task.handle is not None:
            runtime.wait(task.handle, task.name)
        result = self._compression.decompress(task.work, task.cctx)
        scale = self._predivide / self._process_set.size() if self._op == ops.Average else self._predivide
        if result.data_ptr() != task.grad.data_ptr():
            task.grad.copy_(result)
        if scale != 1.0:
            task.grad.mul_(scale)

    def _end_of_step_submissions(self):
        """Whatever backward did not submit goes now; the engine learns the step's backward is over."""
        runtime.context()
        self._submit_missing()
        self._send_backward_done()

    # ---- public API (Horovod's) ----
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
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(): the gradients are reduced once, as intended, but use "
                              "skip_synchronize() as in Horovod")
            else:
                self.synchronize()
        self._synchronized = False
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

    def zero_grad(self, set_to_none=False):
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

    def _overlap_ready(self):
        """Cross-iteration mode is on and (without model=) a forward has shown it exact."""
        if not self._cross_iteration:
            return False
        if self._coverage is None or self._coverage.decided:
            return self._cross_iteration
        ok, uncovered = self._coverage.decide()
        if not ok:
            self._cross_iteration = False
            if uncovered is not None:
                warnings.warn(f"commsched: parameter '{self._names[uncovered]}' is not a parameter of any module that "
                              "ran in the forward, so it may be read outside a module's forward before its update "
                              "lands; waiting in step() (pass DistributedOptimizer(..., model=model) to overlap)")
            elif self._coverage.traced:
                warnings.warn("commsched: the forward ran only inside a compiled graph (a model compiled in place "
                              "with model.compile()), where no hook can apply pending updates before the graph reads "
                              "the parameters; waiting in step() (pass DistributedOptimizer(..., model=model), or "
                              "use model = torch.compile(model), to overlap)")
        return self._cross_iteration

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

    # ---- elastic training (commsched.torch.elastic) ----
    def forget_inflight(self):
        """The group broke mid-step: gradients submitted to it will never be reduced, so they are dropped, not
        applied (the state rolls back to its last commit anyway)."""
        self._inflight.clear()
        self._pending_update.clear()
        self._deferred_zero.clear()
        self._group_ready.clear()
        self._synchronized = False
        self._backward_done_sent = False
        self._completed_pass = False
        self._passes_left = [self._passes_per_step] * len(self._params)
        for p in self._params:
            p.grad = None

    def rejoin(self):
        """The group was formed again (a new Context): tells it the model, as the constructor told the first."""
        self.forget_inflight()
        self._context().set_model([p.numel() * p.element_size() for p in self._params])
        self._watch_backward_times(self._context())

    # ---- cross-iteration updates ----
    def _land_from_graph(self, params, positions):
        """The body of compiled.land's op: a module inside a compiled graph is about to read these parameters.
        `params` are the graph's tensors for them: the parameters themselves, or copies (then the results are copied
        in, so the graph reads the updated values)."""
        mine = [self._params[i] for i in positions]
        self._saw_in_forward(mine)
        if self._pending_update:
            self._apply_pending(mine)
        for real, given in zip(mine, params):
            if given.data_ptr() != real.data_ptr():
                given.copy_(real)

    def _saw_in_forward(self, params):
        if self._ran_eagerly is not None:
            self._ran_eagerly.update(params)
        if self._coverage is not None:
            self._coverage.note_covered(params)
        if not self._order_final:
            self._note_forward(params)

    def _apply_pending(self, params):
        """Applies the pending updates of `params` (waiting for their gradients), and with them every other pending
        update whose gradient has already arrived, taken in forward order up to the first still on the wire: one
        call of the wrapped optimizer for all of them (its per-call cost and, where torch picks it, its multi-tensor
        kernels, are shared), not one per module. Each parameter's update is its own, so when it lands changes no
        bit of it, only that it lands before the parameter is read."""
        pending = self._pending_update
        batch = []
        for p in params:
            task = pending.pop(p, None)
            if task is not None:
                self._finish(task)
                batch.append(p)
        order, i = self._pending_order, self._pending_next
        while i < len(order):
            p = order[i]
            task = pending.get(p)
            if task is not None:
                if not task.arrived():
                    break
                del pending[p]
                self._finish(task)
                batch.append(p)
            i += 1
        self._pending_next = i
        if not batch:
            return
        self._step_subset(batch)
        if self._deferred_zero:
            self._zero_deferred(batch)

    def _zero_deferred(self, params):
        for p in params:
            if p in self._deferred_zero:
                set_to_none = self._deferred_zero.pop(p)
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def _step_subset(self, params):
        """Runs the wrapped optimizer's own step() on `params` only: each group narrowed to its members in `params`
        (same hyperparameters, same per-parameter state), so its math is untouched."""
        groups = self.param_groups
        settings = self._hyperparameters or [{} for _ in groups]
        members = [[] for _ in groups]
        for p in params:
            members[self._group_index[p]].append(p)
        narrowed = []
        for g, at_step, mine in zip(groups, settings, members):
            if mine:
                ng = dict(g)
                ng.update(at_step)  # as they were when step() deferred these updates (a scheduler may have moved lr)
                ng["params"] = mine
                narrowed.append(ng)
        self.param_groups = narrowed
        try:
            with torch.no_grad():
                super(self.__class__, self).step()
        finally:
            self.param_groups = groups


class _ForwardCoverage:
    """Without model=: learns from the forwards themselves which module owns which of the optimizer's parameters,
    through process-wide module hooks, and plays the model's root hooks at the outermost module call that holds any
    of them. Decides at the first step() whether overlap is exact: one whole forward seen since the optimizer was
    made, and every parameter that got a gradient a direct parameter of a module that ran in it (a parameter read by
    another module's forward, e.g. F.linear(x, self.fc.weight) without calling self.fc, would be read stale).
    Holds the optimizer weakly: the hooks remove themselves once it is gone."""

    def __init__(self, opt):
        from torch.nn.modules import module as torch_module
        self._opt_ref = weakref.ref(opt)
        self._mine = set(opt._params)
        self._owned = weakref.WeakKeyDictionary()    # module -> its direct parameters that are ours
        self._is_root = weakref.WeakKeyDictionary()  # outermost module -> whether it holds any of ours
        self._covered = set()
        self._depth = 0
        self._whole_forward_seen = False
        self.decided = False
        self.traced = False  # a hook ran inside dynamo's trace (set by the compiled code, after its graph ran)
        # Where torch has the op that lands updates inside a graph: the attribute that tells a traced pre-hook which of
        # a module's direct parameters are ours (set on a torch.compile(model) wrapper's modules, _wrapper_params).
        self._owner = opt._owner
        self._tag = f"_commsched_updates_{opt._owner}"
        self._landed = {}  # what a compiled forward has landed so far (compiled.land); emptied by the outermost call
        compiled.quiet_global_hook_warning()
        self.handles = [torch_module.register_module_forward_pre_hook(self._pre),
                        torch_module.register_module_forward_hook(self._post)]

    def decide(self):
        """(exact, first parameter not covered or None); from then on the hooks only apply updates."""
        opt = self._opt_ref()
        self.decided = True
        if not self._whole_forward_seen:
            return False, None
        uncovered = self._adopt_into_wrappers([p for p in opt._params if p.grad is not None and p not in self._covered])
        return not uncovered, (uncovered[0] if uncovered else None)

    def _adopt_into_wrappers(self, uncovered):
        """Parameters of a torch.compile(model) wrapper's model that no hook inside its graph landed (read by another
        module's forward, e.g. F.linear(x, self.fc.weight)) are landed by the wrapper, before its graph runs, so
        they are never read stale; returns the rest."""
        left = set(uncovered)
        for module, params in list(self._owned.items()):
            if left and compiled.is_compiled_wrapper(module):
                took = [p for p in module.parameters() if p in left and p not in params]
                params.extend(took)
                left.difference_update(took)
        return [p for p in uncovered if p in left]

    def _alive(self):
        opt = self._opt_ref()
        if opt is None:
            for h in self.handles:
                h.remove()
        return opt

    def note_covered(self, params):
        """params were landed by a module's pre-hook inside a compiled graph (the op's body, eagerly)."""
        if not self.decided:
            self._covered.update(params)

    def _params_of(self, module):
        """The parameters whose pending updates land before `module`'s forward: its direct ones, or for a
        torch.compile(model) wrapper those that no hook inside its compiled graph lands (_wrapper_params)."""
        params = self._owned.get(module)
        if params is None:
            if compiled.is_compiled_wrapper(module):
                params = self._wrapper_params(compiled.unwrapped(module))
            else:
                params = [p for p in _direct_parameters(module) if p in self._mine]
            self._owned[module] = params
        return params

    def _wrapper_params(self, model):
        """A torch.compile(model) wrapper is called eagerly, its model inside the compiled graph. Where torch has the
        op that lands updates in a graph, every module of the model holding ours is tagged with which of its direct
        parameters are ours, and its pre-hook, traced, lands them (_pre); the wrapper lands the rest. Elsewhere the
        wrapper lands all of them, before the graph runs."""
        mine = [p for p in model.parameters() if p in self._mine]
        if self._owner is None:
            return mine
        position = {p: i for i, p in enumerate(self._opt_ref()._params)}
        tagged = set()
        for sub in model.modules():
            held = _direct_parameters(sub)
            local = [j for j, p in enumerate(held) if p in self._mine]
            if local:
                setattr(sub, self._tag, (local, [position[held[j]] for j in local]))
                tagged.update(held[j] for j in local)
        return [p for p in mine if p not in tagged]

    def _holds_ours(self, opt, module):
        held = self._is_root.get(module)
        if held is None:
            held = any(p in self._mine for p in module.parameters())
            self._is_root[module] = held
            if held:  # (a torch.compile(model) wrapper's state_dict() calls its model's: the model's covers both)
                opt._register_state_dict_flush(compiled.unwrapped(module))
        return held

    def _pre(self, module, inputs):
        if compiled.is_compiling():
            self.traced = True
            ours = getattr(module, self._tag, None) if self._owner is not None else None
            if ours is not None:
                held = _direct_parameters(module)
                compiled.land(self._landed, [held[j] for j in ours[0]], self._owner, ours[1])
            return
        opt = self._alive()
        if opt is None:
            return
        outermost = self._depth == 0
        if outermost:
            self._landed.clear()
        self._depth += 1
        params = self._params_of(module)
        if not self.decided:
            self._covered.update(params)
            if outermost:
                self._holds_ours(opt, module)
            if not opt._order_final:
                opt._note_forward(params)
        elif opt._pending_update:
            if outermost and self._holds_ours(opt, module):
                opt._root_pre_forward(module, inputs)
            opt._apply_pending(params)

    def _post(self, module, inputs, output):
        if compiled.is_compiling():
            return
        opt = self._alive()
        if opt is None:
            return
        self._depth -= 1
        if self._depth == 0 and self._is_root.get(module):
            self._whole_forward_seen = self._whole_forward_seen or not self.decided
            if opt._pending_update:
                opt._root_post_forward(module, inputs, output)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=ops.Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None, *, model=None, cross_iteration=None):
    """Wraps `optimizer` (any torch.optim.Optimizer) so its gradients are averaged over every worker, scheduled by
    commsched. Horovod's signature, every argument meaning what it means there (optimizer_args.py: process_set,
    groups/num_groups, sparse_as_dense, gradient_predivide_factor); commsched extras (keyword only): model= (learns
    forward order from forward hooks) and cross_iteration= (default: COMMSCHED_CROSS_ITERATION)."""
    horovod = {"process_set": optimizer_args.member_set(process_set), "groups": groups, "num_groups": num_groups,
               "sparse_as_dense": bool(sparse_as_dense)}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, model, cross_iteration, optimizer, horovod)

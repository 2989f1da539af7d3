"""DistributedOptimizer's cross-iteration overlap: updates applied just before the forward that reads them.

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
import warnings
import weakref

import torch

from commsched.torch import compiled


def _direct_parameters(module):
    """The parameters a module's forward reads as its own: its direct parameters and those of parameter containers
    among its children (ParameterList, ParameterDict), which are never called and so run no hooks of their own."""
    params = list(module.parameters(recurse=False))
    for child in module.children():
        if isinstance(child, (torch.nn.ParameterList, torch.nn.ParameterDict)):
            params.extend(child.parameters())
    return params


class CrossIteration:
    """Landing pending updates before the forwards that read them (assembled into the wrapper class)."""

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
        finished = []
        for p in params:
            task = pending.pop(p, None)
            if task is not None:
                finished.append((p, task))
        order, i = self._pending_order, self._pending_next
        while i < len(order):
            p = order[i]
            task = pending.get(p)
            if task is not None:
                if not task.arrived():
                    break
                del pending[p]
                finished.append((p, task))
            i += 1
        self._pending_next = i
        if not finished:
            return
        for _, task in finished:
            self._finish(task)
        batch = [p for p, _ in finished]
        reset = self._lend_averaged_grads(finished)
        self._step_subset(batch)
        for p, grad in reset.items():
            p.grad = grad
        if self._deferred_zero:
            self._zero_deferred(batch)

    @staticmethod
    def _lend_averaged_grads(finished):
        """Where p.grad was reset while its update was pending by something other than optimizer.zero_grad() (a
        torch 2.x model.zero_grad() sets it to None), the update still uses the averaged gradient: it is lent to
        p.grad for the step. Returns what to put back afterwards."""
        reset = {}
        for p, task in finished:
            if not task.held_by(p):
                reset[p] = p.grad
                p.grad = task.grad
        return reset

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


class ForwardCoverage:
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

    def adopt(self, params):
        """Parameters added to the optimizer (add_param_group): ours from now on. The optimizer lands their updates
        when the outermost forward holding any of ours begins (as orphans), so they count as covered, and outermost
        modules once found to hold none of ours are looked at again."""
        self._mine.update(params)
        self._covered.update(params)
        for module in [m for m, held in self._is_root.items() if not held]:
            del self._is_root[module]

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

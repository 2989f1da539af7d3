"""DistributedOptimizer's gradient exchange: every parameter's gradient becomes a commsched task the moment autograd
has accumulated it (a hook on the parameter's gradient accumulator), at the priority of the parameter's position in
forward order (declaration order at first, then the order learned from the first iteration's forward or, without
module hooks, the reverse of its backward order); the engine is told when a backward ends; the reduced results are
turned back into p.grad (compression, predivide and average undone).

Methods of the optimizer class that commsched.torch.optimizer assembles (they share its state).
"""
import time

import torch

from commsched.torch import collectives, compiled, ops, runtime


def _sole_tensor_of_its_storage(t):
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()  # torch 1.13: storage()
    return t.storage_offset() == 0 and storage.nbytes() == t.numel() * t.element_size()


class _GradTask:
    """A gradient in flight: the C++ handle and how to turn the wire result back into p.grad. A sparse gradient's
    task has no handle: `sparse` waits for its all-gathers and returns the combined sparse gradient."""

    def __init__(self, handle, name, work, cctx, grad, sparse=None):
        self.handle, self.name, self.work, self.cctx, self.grad = handle, name, work, cctx, grad
        self.sparse = sparse
        # p.grad's version counter as it went out: an in-place change while on the wire shows as a new version. Only
        # where the gradient is its storage's one tensor: autograd counts versions per storage, and gradients cut
        # from one buffer (torch.cat or torch.stack of parameters in the forward) share it, so averaging one of them
        # would look like a change of the others.
        self.version = grad._version if sparse is None and _sole_tensor_of_its_storage(grad) else None

    def held_by(self, p):
        """Whether p.grad is still this task's gradient (not reset by something other than optimizer.zero_grad())."""
        g = p.grad
        if g is None or g.is_sparse or self.grad.is_sparse:
            return g is self.grad
        return g.data_ptr() == self.grad.data_ptr()

    def arrived(self):
        """Whether the reduced gradient is here (finishing it will not wait); a sparse one is never taken early."""
        return self.sparse is None and (self.handle is None or self.handle.poll())


class GradientExchange:
    """The optimizer's gradient hooks, priorities and submissions (assembled into the wrapper class)."""

    def _register_grad_hooks(self, start=0):
        """Hooks the parameters from position `start` on (later ones: add_param_group)."""
        for i in range(start, len(self._params)):
            p = self._params[i]
            # The AccumulateGrad node of p: its hook runs once p.grad holds this backward's gradient.
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            # Compiled autograd traces backward hooks into its graph: ours talk to the engine, so they stay out of it
            # (a graph break each) and run eagerly, in backward order.
            acc.register_hook(compiled.eager_unless_traced(self._make_grad_hook(i, p)))
            self._keep.append(acc)
            # Runs before accumulation: an update still pending from the previous step must land first.
            self._keep.append(p.register_hook(compiled.eager_unless_traced(self._make_pre_accumulate_hook())))

    def _make_grad_hook(self, i, p):
        # Runs once per tensor per backward: per-parameter counters are kept by position i (a list), since hashing a
        # tensor is a Python call in torch 2.x.
        def hook(*unused):
            runtime.context()  # a clear error when init() was not called
            if not self._order_final:
                self._learn_order(p)
            if self._passes_left[i] <= 0 or p in self._inflight:
                raise RuntimeError(self._computed_again(p))
            if self._ready_times is not None:
                self._ready_times[i] = time.perf_counter()
            self._queue_backward_end()
            self._passes_left[i] -= 1
            if self._passes_left[i] == 0:
                self._ready(p)
                self._completed_pass = True
        return hook

    def _computed_again(self, p):
        # Also what a second optimizer's loss causes when its backward reaches our parameters (a GAN's generator loss
        # through the discriminator): that pass counts as one of ours, and our next backward is then one too many.
        return (f"gradient of '{self._names[p]}' was computed more than backward_passes_per_step="
                f"{self._passes_per_step} times before this optimizer's step() took it: call step() after each "
                "backward (or raise backward_passes_per_step); if another loss's backward reaches these parameters "
                "(e.g. a generator's loss through the discriminator), exclude them from it with "
                "requires_grad_(False) or detach()")

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
        if task.version is not None and task.grad._version != task.version:
            raise RuntimeError(f"the gradient '{task.name}' was changed in place while it was being averaged: clear "
                               "gradients with optimizer.zero_grad() (not model.zero_grad(set_to_none=False)), and "
                               "call optimizer.synchronize() before changing them (clip_grad_norm_, "
                               "GradScaler.unscale_), as in Horovod")
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

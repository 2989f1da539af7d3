"""Horovod's elastic API: training that survives the loss of workers and lets new ones join.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, EPOCHS):
            for state.batch in range(state.batch, BATCHES):
                ...one step...
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0)
    train(state)

Run it with `commsched launch -w 4 -s 0 --min-workers 2 [--restarts N] -- python3 train.py` (see the README,
"Elastic training"). When a worker dies or freezes (COMMSCHED_TIMEOUT), the survivors' step fails with
HorovodInternalError; run() then rolls the state back to its last commit, re-forms the group over the survivors
(commsched._elastic: new ranks, a new rendezvous), broadcasts rank 0's state and calls train(state) again. A joiner
waits in init() and is let in at the survivors' next commit (HostsUpdatedInterrupt). Without an elastic store
(COMMSCHED_ELASTIC_STORE) run() calls the function once and a lost worker ends the job as usual.
"""
import copy
import functools
import sys
import time

import torch

from commsched import _elastic
from commsched.torch import functions, ops, runtime
from commsched.torch.runtime import HorovodInternalError

ElasticError = _elastic.ElasticError


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit() on every rank when workers wait to join: run() re-forms the group with them.
    skip_sync: whether the state need not be broadcast again (never here: a joiner needs it)."""

    def __init__(self, skip_sync=False):
        super().__init__("elastic: workers are waiting to join")
        self.skip_sync = skip_sync


class State:
    """What survives a membership change: subclasses say how to save (commit), restore and sync (from rank 0)."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or functions.broadcast_object
        self._rank = get_rank or runtime.rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called after every membership change (to rescale the learning rate to the new size, ...)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp=None, update_res=None):
        """Horovod's notification hook; commsched learns of joiners at commit() instead."""
        del timestamp, update_res

    def commit(self):
        """Saves the state (the point a failure rolls back to), then lets waiting workers join."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when workers wait to join (rank 0 asks the membership store and
        tells the others, so every rank decides alike)."""
        membership = _elastic.membership()
        if membership is None:
            return
        waiting = torch.tensor([membership.pending_joiners() if runtime.rank() == 0 else 0], dtype=torch.int64)
        ops.broadcast_(waiting, 0, name="elastic.hosts_updated")
        if int(waiting.item()) > 0:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def reset(self):
        """After a membership change, before training resumes (subclasses drop what the old group left behind)."""


class ObjectState(State):
    """Picklable attributes (epoch=0, batch=0, ...), kept as attributes of this object."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._saved_state = dict(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved_state = copy.deepcopy(self._saved_state)

    def save(self):
        self._saved_state = copy.deepcopy({name: getattr(self, name) for name in self._saved_state})

    def restore(self):
        self._restore_attributes()

    def _restore_attributes(self):
        for name, value in copy.deepcopy(self._saved_state).items():
            setattr(self, name, value)

    def sync(self):
        """Rank 0's attributes as of its last commit, everywhere (a subclass's restore() is not called: what it
        restores is synced by the subclass itself)."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, 0, name="elastic.object_state")
            self._restore_attributes()


class TorchState(ObjectState):
    """A model's and an optimizer's state (deep copies at each commit) and any picklable attributes."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model, self.optimizer = model, optimizer
        # Samplers keep their progress (processed indices), not a copy of their dataset.
        self._samplers = {k: kwargs.pop(k) for k in [k for k, v in kwargs.items() if isinstance(v, ElasticSampler)]}
        for name, sampler in self._samplers.items():
            setattr(self, name, sampler)
        super().__init__(**kwargs)
        self._saved_model = self._saved_optimizer = None
        self._saved_samplers = {}
        self._save_modules()

    def _save_modules(self):
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        self._saved_samplers = {name: s.state_dict() for name, s in self._samplers.items()}

    def save(self):
        self._save_modules()
        super().save()

    def restore(self):
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            forget = getattr(self.optimizer, "forget_inflight", None)
            if forget is not None:
                forget()  # gradients of the failed step were never reduced: drop them, not apply them
            self.optimizer.load_state_dict(self._saved_optimizer)
        for name, sampler in self._samplers.items():
            sampler.load_state_dict(self._saved_samplers[name])
        super().restore()

    def sync(self):
        if self.model is not None:
            functions.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            functions.broadcast_optimizer_state(self.optimizer, root_rank=0)
        for name, sampler in self._samplers.items():  # every rank's processed indices, on every rank
            states = functions.allgather_object(sampler.state_dict(), name=f"elastic.sampler.{name}")
            sampler.load_state_dict({"epoch": states[0]["epoch"],
                                     "processed_indices": sorted({i for s in states for i in s["processed_indices"]})})
        super().sync()
        self._save_modules()  # a joiner's rollback point is the state it received

    def reset(self):
        if self.optimizer is not None:
            rejoin = getattr(self.optimizer, "rejoin", None)
            if rejoin is not None:
                rejoin()
        for sampler in self._samplers.values():
            sampler.reset()


_CONNECT_TRIES = 3


def _re_form(membership, why, started):
    """Leaves the broken group, forms the next generation and connects it (a new Context). A member lost while the
    new group connects fails the connection everywhere: the group is formed again without it."""
    before = [m["uid"] for m in membership.members]
    runtime.shutdown()
    for attempt in range(_CONNECT_TRIES):
        membership.reform()
        try:
            runtime.restart_for_membership()
            break
        except RuntimeError as e:
            if attempt == _CONNECT_TRIES - 1:
                raise ElasticError(f"elastic: generation {membership.generation} could not connect "
                                   f"{_CONNECT_TRIES} times; last error: {e}") from e
            print(f"[commsched] elastic: generation {membership.generation} did not connect ({e}); forming the "
                  "next one", file=sys.stderr, flush=True)
    gone = [uid for uid in before if uid not in {m["uid"] for m in membership.members}]
    if gone:
        why += "; gone: " + ", ".join(gone)
    if runtime.rank() == 0:
        print(f"[commsched] elastic: generation {membership.generation} formed with {runtime.size()} worker(s) "
              f"(was {len(before)}; {why}) in {time.monotonic() - started:.2f} s", file=sys.stderr, flush=True)


# A failure that loses nobody (a tensor the workers disagree on, ...) would fail again after every re-forming: after
# this many in a row, the error is raised instead of retried.
_FAILURES_WITHOUT_LOSS = 3


def _recover(membership, state, error, streak):
    """A collective failed: names the lost rank in the store (so the survivors need not wait for it), rolls the state
    back and re-forms. Returns the number of failures in a row that lost nobody."""
    started = time.monotonic()
    before = [m["uid"] for m in membership.members]
    lost = _elastic.lost_rank(str(error))
    membership.mark_lost(lost)
    # The Context goes first: until its shutdown returns, work already ordered may still write into the gradients
    # that the rollback lets go of.
    runtime.shutdown()
    state.restore()
    # The error names a lost rank, or none (a reset connection, a server lost, a mismatch): _re_form adds who left.
    _re_form(membership, f"rank {lost} was lost" if lost is not None else "a communication failed", started)
    unchanged = [m["uid"] for m in membership.members] == before
    streak = streak + 1 if unchanged else 0
    if streak >= _FAILURES_WITHOUT_LOSS:
        raise ElasticError(f"elastic: the training function failed {streak} times in a row without losing a worker; "
                           f"the last error: {error}") from error
    return streak


def run(func):
    """Horovod's @hvd.elastic.run: calls func(state, ...) and, when a worker is lost (HorovodInternalError) or
    workers wait to join (HostsUpdatedInterrupt), re-forms the group, rolls back to the last commit, syncs the state
    from rank 0 and calls func again. Raises ElasticError on every process when fewer than COMMSCHED_MIN_WORKERS
    remain."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        runtime.context()  # a clear error when init() was not called
        membership = _elastic.membership()
        skip_sync = False
        streak = 0  # failures in a row that lost nobody
        while True:
            if not skip_sync:
                state.sync()
            try:
                result = func(state, *args, **kwargs)
                if membership is not None:
                    membership.finish()
                return result
            except HorovodInternalError as e:
                if membership is None:
                    raise
                streak = _recover(membership, state, e, streak)
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                _re_form(membership, "workers joined", time.monotonic())
                skip_sync = e.skip_sync
            state.on_reset()
    return wrapper


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: this rank's share of the indices an epoch has not processed yet, re-sharded over the
    current workers after every membership change. Record progress with record_batch(); put it in the TorchState
    (sampler=...) so processed indices survive a rollback."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_indices = set()
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks batch `batch_idx` (of this sampler's current order) of every rank's share as processed: the ranks
        step together, so a commit after it covers every rank's batch, and a worker lost later takes no record with
        it (with only its own indices, the survivors would process a lost worker's committed batches again)."""
        for share in self._shares:
            self.record_indices(share[batch_idx * batch_size:(batch_idx + 1) * batch_size])

    def record_indices(self, indices):
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx, batch_size):
        return self.indices[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def reset(self):
        """Re-shards the indices left in this epoch over the current workers."""
        rank, size = (runtime.rank(), runtime.size()) if runtime.is_initialized() else (0, 1)
        order = list(range(len(self.dataset)))
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(order), generator=g).tolist()
        remaining = [i for i in order if i not in self.processed_indices]
        per_rank = (len(remaining) + size - 1) // size if remaining else 0
        padded = remaining + remaining[:per_rank * size - len(remaining)]
        self._shares = [padded[r:per_rank * size:size] for r in range(size)]
        self.indices = self._shares[rank]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)

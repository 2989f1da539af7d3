"""The framework-neutral half of Horovod's elastic API: the State base (commit, restore, sync, reset callbacks, host
updates), ObjectState, HostsUpdatedInterrupt and the loop of @hvd.elastic.run (roll back, re-form, sync, call again).

commsched.torch.elastic and commsched.tensorflow.elastic add their states (TorchState, TensorFlowState, ...) and
give run() a Runtime: what differs between the frameworks (how objects are broadcast, how the runtime is shut down
and brought up again for a new generation, which of its exceptions mean a lost peer). The membership itself (who
forms the next generation) is commsched._elastic's.
"""
import copy
import functools
import sys
import time

import numpy as np

from commsched import _elastic
from commsched import _host_collectives as hc
from commsched import _runtime_core as core
from commsched._runtime_core import HorovodInternalError

ElasticError = _elastic.ElasticError


class Runtime:
    """What a framework supplies to the shared elastic code. Subclasses set `caller` (the framework's module, for
    messages) and override broadcast_object and restart, and internal_error where the framework's own exceptions can
    mean a failed collective."""
    caller = "commsched"

    def broadcast_object(self, obj, root_rank, name):
        """Rank root_rank's picklable `obj` on every rank."""
        raise NotImplementedError

    def shutdown(self):
        """Leaves the broken group: the Context stops (the framework's shutdown hooks let go of it first)."""
        core.shutdown()

    def restart(self):
        """Connects the generation commsched._elastic has just put in the environment (a new Context)."""
        raise NotImplementedError

    def internal_error(self, error):
        """`error` as a HorovodInternalError when it means a failed collective (a peer lost, ...), else None."""
        return error if isinstance(error, HorovodInternalError) else None


_runtimes = {}  # framework name (the caller of init()) -> its Runtime


def register(framework, runtime):
    """Called by each framework's elastic module: the Runtime that States use once that framework is initialized."""
    _runtimes[framework] = runtime


def _context():
    if not core.is_initialized():
        raise core.NotInitializedError("elastic: the state is used before init(): call init() of commsched.torch or "
                                       "commsched.tensorflow first")
    return core.context()


def _runtime():
    """The Runtime of the framework that called init() (one per process: there is one Context)."""
    _context()
    return _runtimes[core._framework]


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit() on every rank when workers wait to join: run() re-forms the group with them.
    skip_sync: whether the state need not be broadcast again (never here: a joiner needs it)."""

    def __init__(self, skip_sync=False):
        super().__init__("elastic: workers are waiting to join")
        self.skip_sync = skip_sync


class State:
    """What survives a membership change: subclasses say how to save (commit), restore and sync (from rank 0).
    bcast_object(obj, root_rank, name=...) and get_rank(): default, those of the framework that called init()."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or (lambda obj, root_rank, name: _runtime().broadcast_object(
            obj, root_rank, name))
        self._rank = get_rank or (lambda: _context().rank)
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
        ctx = _context()
        waiting = np.array([membership.pending_joiners() if ctx.rank == 0 else 0], dtype=np.int64)
        if int(hc.broadcast(ctx, waiting, 0, "elastic.hosts_updated").wait()[0]) > 0:
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


_CONNECT_TRIES = 3


def _re_form(runtime, membership, why, started):
    """Leaves the broken group, forms the next generation and connects it (a new Context). A member lost while the
    new group connects fails the connection everywhere: the group is formed again without it."""
    before = [m["uid"] for m in membership.members]
    runtime.shutdown()
    for attempt in range(_CONNECT_TRIES):
        membership.reform()
        try:
            runtime.restart()
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
    ctx = _context()
    if ctx.rank == 0:
        print(f"[commsched] elastic: generation {membership.generation} formed with {ctx.size} worker(s) "
              f"(was {len(before)}; {why}) in {time.monotonic() - started:.2f} s", file=sys.stderr, flush=True)


# A failure that loses nobody (a tensor the workers disagree on, ...) would fail again after every re-forming: after
# this many in a row, the error is raised instead of retried.
_FAILURES_WITHOUT_LOSS = 3


def _recover(runtime, membership, state, error, streak):
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
    _re_form(runtime, membership, f"rank {lost} was lost" if lost is not None else "a communication failed", started)
    unchanged = [m["uid"] for m in membership.members] == before
    streak = streak + 1 if unchanged else 0
    if streak >= _FAILURES_WITHOUT_LOSS:
        raise ElasticError(f"elastic: the training function failed {streak} times in a row without losing a worker; "
                           f"the last error: {error}") from error
    return streak


def run(func, runtime):
    """Horovod's @hvd.elastic.run over `runtime`: calls func(state, ...) and, when a worker is lost (a
    HorovodInternalError, or what runtime.internal_error() says is one) or workers wait to join
    (HostsUpdatedInterrupt), re-forms the group, rolls back to the last commit, syncs the state from rank 0 and calls
    func again. Raises ElasticError on every process when fewer than COMMSCHED_MIN_WORKERS remain."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        core.context(runtime.caller)  # a clear error when init() was not called
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
            except HostsUpdatedInterrupt as e:
                _re_form(runtime, membership, "workers joined", time.monotonic())
                skip_sync = e.skip_sync
            except Exception as e:  # noqa: BLE001 -- only what the runtime calls a failed collective is recovered
                error = runtime.internal_error(e)
                if error is None or membership is None:
                    raise
                streak = _recover(runtime, membership, state, error, streak)
                skip_sync = False
            state.on_reset()
    return wrapper

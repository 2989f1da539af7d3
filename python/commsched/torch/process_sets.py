"""Horovod's process sets: collectives over a subset of the workers.

Design: every process set with more than one member gets its own commsched Context (engine + Gloo backend) over a
sub-cluster of its members, ranks renumbered 0..k-1 in the order of their global ranks. The members meet in the job's
one rendezvous store, which the global Context already has served at root_addr:root_port (rank 0 for Gloo and NCCL,
server 0 for the PS), under the keys pset/<id>/ (cluster field store_scope): they publish their hosts there (for
local_rank / local_size) and bootstrap the set's mesh there, authenticated with the run's secret as every rendezvous
is. So a set's collectives are scheduled like any others (partitions, credit, priorities), on the PS cluster too (the
PS sums over every worker, so a subset cannot use the servers). A one-member set (every set of a one-process run,
which has no store) gets a loopback Context. add_process_set is called by every rank in the same order, as in
Horovod, so every rank numbers the sets alike; only the members meet.

Static sets (init(process_sets=[...])) and add_process_set / remove_process_set at any point where every rank calls
them are supported.
"""
import threading

from commsched import _C
from commsched.torch import runtime

_lock = threading.Lock()
_sets = {}        # process_set_id -> ProcessSet
_next_id = [1]


class ProcessSet:
    """A subset of the global ranks. `ranks` is sorted; process_set_id is set once the set is registered."""

    def __init__(self, ranks_or_comm):
        if not isinstance(ranks_or_comm, (list, tuple, range)):
            raise ValueError("ProcessSet: commsched takes a list of global ranks (it has no MPI communicators)")
        ranks = sorted(int(r) for r in ranks_or_comm)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ProcessSet: duplicate ranks in {list(ranks_or_comm)}")
        self.ranks = ranks
        self.process_set_id = None
        self._ctx = None  # the set's Context on members (global set: the global Context)

    def _check_registered(self):
        if self.process_set_id is None:
            raise ValueError(f"process set {self.ranks} is not registered: pass it to init(process_sets=[...]) or "
                             "add_process_set()")

    def size(self):
        self._check_registered()
        return len(self.ranks)

    def rank(self):
        """This worker's rank within the set (-1 when it is not a member)."""
        self._check_registered()
        me = runtime.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        self._check_registered()
        return runtime.rank() in self.ranks

    def context(self):
        """The Context this set's collectives go through; raises ValueError on a worker outside the set."""
        self._check_registered()
        if self.process_set_id == 0:
            return runtime.context()
        if self._ctx is None:
            raise ValueError(f"rank {runtime.rank()} is not in process set {self.process_set_id} (ranks "
                             f"{self.ranks}): only its members may call its collectives")
        return self._ctx

    def global_rank(self, set_rank):
        return self.ranks[set_rank]

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self):
        return hash(tuple(self.ranks))

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """Every worker; its ranks are known once init() has run."""

    def __init__(self):
        super().__init__([])
        self.process_set_id = 0

    @property
    def ranks(self):
        return list(range(runtime.size())) if runtime.is_initialized() else []

    @ranks.setter
    def ranks(self, value):
        del value

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and (other.process_set_id == 0 or other.ranks == self.ranks)

    def __hash__(self):
        return 0


global_process_set = _GlobalProcessSet()


def resolve(process_set):
    """The registered ProcessSet for an API call's process_set argument (None: the global set)."""
    if process_set is None or process_set is global_process_set:
        return global_process_set
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set: expected a commsched.torch.ProcessSet, got {type(process_set).__name__}")
    process_set._check_registered()
    return process_set


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of global ranks) on every rank; returns the ProcessSet.

    Collective: every global rank must call it, in the same order. Members connect to each other before it returns.
    """
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    size = runtime.size()
    if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= size:
        raise ValueError(f"add_process_set: ranks {ps.ranks} must be non-empty and within [0, {size})")
    with _lock:
        for other in _sets.values():
            if other.ranks == ps.ranks:
                raise ValueError(f"add_process_set: a process set with ranks {ps.ranks} already exists "
                                 f"(id {other.process_set_id})")
        set_id = _next_id[0]
        _next_id[0] += 1
    me = runtime.rank()
    if me in ps.ranks and len(ps.ranks) > 1:
        glob = runtime.context()
        cluster = {"rank": ps.ranks.index(me), "num_workers": len(ps.ranks), "root_addr": glob.root_addr,
                   "root_port": glob.root_port, "store_scope": f"pset/{set_id}/"}
        ps._ctx = _C.Context(engine={"timeline": ""}, backend="gloo", tune=False, cluster=cluster)
    elif me in ps.ranks:
        cluster = {"rank": 0, "num_workers": 1, "local_rank": 0, "local_size": 1}
        ps._ctx = _C.Context(engine={"timeline": ""}, backend="loopback", tune=False, cluster=cluster)
    ps.process_set_id = set_id
    with _lock:
        _sets[set_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregisters a process set (collective, like add_process_set); returns whether it was registered."""
    if process_set is None or process_set.process_set_id in (None, 0):
        return False
    with _lock:
        ps = _sets.pop(process_set.process_set_id, None)
    if ps is None:
        return False
    if ps._ctx is not None:
        ps._ctx.shutdown()
        ps._ctx = None
    ps.process_set_id = None
    return True


def _shutdown_all():
    # Ids start again at 1: after an elastic re-init the survivors and a joiner (a fresh process) number the sets they
    # add from the same start, so a set has one id, and one store scope pset/<id>/, on every member.
    with _lock:
        sets = list(_sets.values())
        _sets.clear()
        _next_id[0] = 1
    for ps in sets:
        if ps._ctx is not None:
            ps._ctx.shutdown()
            ps._ctx = None
        ps.process_set_id = None


runtime.on_shutdown(_shutdown_all)


def setup(process_sets):
    """init(process_sets=...): Horovod's static sets ('dynamic' is accepted: sets may be added later anyway)."""
    if process_sets is None or process_sets == "dynamic":
        return
    for ps in process_sets:
        if ps.ranks == list(range(runtime.size())):
            ps.process_set_id = 0  # a set of every rank is the global set
            continue
        add_process_set(ps)

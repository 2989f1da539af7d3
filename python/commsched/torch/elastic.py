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

State, ObjectState, HostsUpdatedInterrupt and run()'s loop are commsched._elastic_state's, shared with
commsched.tensorflow.elastic; this module adds what needs torch (TorchState, ElasticSampler, how torch's runtime
broadcasts objects and is brought up again).
"""
import copy

import torch

from commsched import _elastic_state
from commsched._elastic_state import ElasticError, HostsUpdatedInterrupt, ObjectState, State  # noqa: F401
from commsched.torch import functions, runtime
from commsched.torch.runtime import HorovodInternalError  # noqa: F401  (Horovod's hvd.elastic has the name)


class _TorchRuntime(_elastic_state.Runtime):
    caller = runtime._CALLER

    def broadcast_object(self, obj, root_rank, name):
        return functions.broadcast_object(obj, root_rank, name=name)

    def restart(self):
        runtime.restart_for_membership()


_RUNTIME = _TorchRuntime()
_elastic_state.register(runtime._CALLER, _RUNTIME)


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


def run(func):
    """Horovod's @hvd.elastic.run: calls func(state, ...) and, when a worker is lost (HorovodInternalError) or
    workers wait to join (HostsUpdatedInterrupt), re-forms the group, rolls back to the last commit, syncs the state
    from rank 0 and calls func again. Raises ElasticError on every process when fewer than COMMSCHED_MIN_WORKERS
    remain."""
    return _elastic_state.run(func, _RUNTIME)


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

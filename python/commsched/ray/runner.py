"""RayExecutor: Horovod's horovod.ray.RayExecutor (same constructor, settings and methods) starting commsched workers.

start() places one actor per worker (a placement group: PACK for num_workers, one bundle per host with STRICT_SPREAD
for num_hosts, or the caller's own group), asks each actor its node, numbers the ranks node by node (so local ranks
are consecutive, rank 0 on the first actor's node), picks the rendezvous port on rank 0's node from inside its actor
and writes each actor's COMMSCHED_* environment. run() waits for every rank; a rank that fails (its function raised,
or its actor died) stops every worker a few seconds later, since the others may wait forever in a collective for it,
and WorkerError names the rank to blame.
"""
import dataclasses
import secrets
import time
import warnings
from typing import Optional

import ray
from ray.util.placement_group import get_current_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from commsched.ray.worker import BaseHorovodWorker

_NAME = "commsched.ray"
# After a rank fails, how long the others may take to finish or fail too before every worker is stopped: when an
# actor dies its peers may report losing it before Ray reports the death, and the dead rank is the one to name.
_SETTLE_S = 5.0


class WorkerError(RuntimeError):
    """A rank's function raised or its actor died; `rank` names it and `cause` is Ray's error (with the remote
    traceback)."""

    def __init__(self, rank, cause, also=()):
        also = f" (then ranks {', '.join(map(str, also))} failed too)" if also else ""
        super().__init__(f"{_NAME}: rank {rank} failed{also}: {cause}")
        self.rank = rank
        self.cause = cause


@dataclasses.dataclass
class MiniSettings:
    """RayExecutor.create_settings()'s object. timeout_s is Horovod's Gloo timeout: the workers' COMMSCHED_TIMEOUT
    (how long a rank waits for the others to reach init(), and a peer's silence in a collective), and the bound on the
    actors' start; placement_group_timeout_s bounds the wait for their resources. The ssh fields are accepted for
    Horovod's signature and unused: Ray starts the processes."""
    timeout_s: int = 30
    ssh_identity_file: Optional[str] = None
    ssh_str: Optional[str] = None
    placement_group_timeout_s: int = 100
    nics: Optional[set] = None
    verbose: int = 1
    elastic: bool = False


def _refuse_servers(env):
    """commsched.ray starts workers only: a parameter server would need server actors and their own contract."""
    role = str(env.get("COMMSCHED_ROLE", "worker"))
    servers = {k: env[k] for k in ("COMMSCHED_NUM_SERVERS", "DMLC_NUM_SERVER") if str(env.get(k, "0")) != "0"}
    backend = str(env.get("COMMSCHED_BACKEND", ""))
    if role != "worker" or servers or backend == "ps":
        asked = servers or ({"COMMSCHED_ROLE": role} if role != "worker" else {"COMMSCHED_BACKEND": backend})
        raise ValueError(f"{_NAME}: extra_env_vars ask for a parameter server ({asked}), but RayExecutor starts "
                         "workers only and runs all-reduce (gloo, or nccl with COMMSCHED_BACKEND=nccl); for servers "
                         "use `commsched launch -w N -s M` or Slurm (README, Running on clusters)")


_SETTINGS_TIMEOUT = object()  # _wait's default: the settings' timeout_s


class RayExecutor:
    """Horovod's RayExecutor: start(), run()/run_remote()/execute()/execute_single(), shutdown()."""

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None, placement_group_timeout_s=100,
                        nics=None):
        return MiniSettings(timeout_s=timeout_s, ssh_identity_file=ssh_identity_file, ssh_str=ssh_str,
                            placement_group_timeout_s=placement_group_timeout_s, nics=nics)

    def __init__(self, settings, num_workers=None, num_hosts=None, num_workers_per_host=1, cpus_per_worker=1,
                 use_gpu=False, gpus_per_worker=None, use_current_placement_group=True, min_workers=None,
                 max_workers=None, reset_limit=None, cooldown_range=None, elastic_timeout=600,
                 override_discovery=True):
        elastic = {k: v for k, v in dict(min_workers=min_workers, max_workers=max_workers, reset_limit=reset_limit,
                                         cooldown_range=cooldown_range).items() if v is not None}
        if elastic:
            _refuse_elastic(", ".join(f"{k}={v}" for k, v in elastic.items()))
        if gpus_per_worker and not use_gpu:
            raise ValueError(f"{_NAME}: gpus_per_worker={gpus_per_worker} needs use_gpu=True")
        if (num_workers is None) == (num_hosts is None):
            raise ValueError(f"{_NAME}: give num_workers, or num_hosts (with num_workers_per_host), not "
                             f"{'both' if num_workers is not None else 'neither'}")
        for name, value in dict(num_workers=num_workers, num_hosts=num_hosts, num_workers_per_host=num_workers_per_host,
                                gpus_per_worker=gpus_per_worker).items():
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{_NAME}: {name} must be a positive integer, got {value!r}")
        self.settings = settings
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.workers = []           # actors in rank order
        self._pg = None             # the placement group start() made (not the caller's)
        self._stopped_because = None

    # ---- start ----

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None, extra_env_vars=None):
        """Starts one actor per worker and sets each one's environment; extra_env_vars are set on every actor last
        (so they may override any COMMSCHED_* variable, e.g. COMMSCHED_BACKEND=nccl)."""
        if self.workers:
            raise RuntimeError(f"{_NAME}: start() was already called; call shutdown() first")
        extra = {k: str(v) for k, v in (extra_env_vars or {}).items()}
        _refuse_servers(extra)
        self._stopped_because = None
        try:
            self.workers = self._create_actors()  # so that a failure below stops them
            self.workers, envs = self._plan(self.workers, extra)
            self._wait("set the workers' environment",
                       [w.update_env_vars.remote({**env, **extra}) for w, env in zip(self.workers, envs)])
            # Unbounded, as Horovod's: an executable may call init() (which waits for every rank as long as the
            # workers' own join timeout), load data or import slowly; a failure still surfaces at once.
            self._wait("make the executable on each worker",
                       [w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                        for w in self.workers], timeout=None)
        except BaseException:
            self.shutdown()
            raise

    def _create_actors(self):
        """Actors in creation order, each in its placement group bundle."""
        n = self.num_workers or self.num_hosts * self.num_workers_per_host
        current = get_current_placement_group() if self.use_current_placement_group else None
        if current is not None:
            bundles, pg = [-1] * n, current   # any bundle of the caller's group
        elif self.num_hosts is not None:
            per_host = self.num_workers_per_host
            pg = self._placement_group([self._resources(per_host)] * self.num_hosts, "STRICT_SPREAD")
            bundles = [i // per_host for i in range(n)]
        else:
            pg = self._placement_group([self._resources(1)] * n, "PACK")
            bundles = list(range(n))
        actor = ray.remote(BaseHorovodWorker)
        return [actor.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                              scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b))
                .remote() for b in bundles]

    def _resources(self, workers):
        res = {"CPU": self.cpus_per_worker * workers}
        if self.gpus_per_worker:
            res["GPU"] = self.gpus_per_worker * workers
        return res

    def _placement_group(self, bundles, strategy):
        self._pg = placement_group(bundles, strategy=strategy)
        timeout = self.settings.placement_group_timeout_s
        try:
            ray.get(self._pg.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"{_NAME}: the cluster did not grant {len(bundles)} x {bundles[0]} ({strategy}) within "
                               f"placement_group_timeout_s={timeout} s; available: {ray.available_resources()}") \
                from None
        return self._pg

    def _plan(self, actors, extra):
        """(actors in rank order, each rank's environment). Ranks go node by node in the order the nodes first
        appear among the actors, so rank 0 is the first actor and each node's ranks are consecutive."""
        nodes = self._wait("start the workers", [a.node_id.remote() for a in actors])
        by_node = [[actors[i] for i in group] for group in group_by_node(nodes)]
        ordered = [a for group in by_node for a in group]
        root = ordered[0]
        root_ip, root_port = self._wait("ask rank 0 for its address and a free port",
                                        [root.node_ip.remote(), root.free_port.remote()])
        common = dict(COMMSCHED_ROLE="worker", COMMSCHED_NUM_SERVERS="0", COMMSCHED_NUM_WORKERS=str(len(ordered)),
                      COMMSCHED_ROOT_ADDR=root_ip, COMMSCHED_ROOT_PORT=str(root_port),
                      COMMSCHED_TIMEOUT=str(self.settings.timeout_s))
        if "COMMSCHED_SECRET" not in extra and "COMMSCHED_KEY_FILE" not in extra:
            common["COMMSCHED_SECRET"] = secrets.token_urlsafe(24)  # the root binds beyond loopback
        common.update(_nic_env(self.settings.nics))
        envs = []
        for group in by_node:
            gpus = self._node_gpus(group)
            for local_rank in range(len(group)):
                env = dict(common, COMMSCHED_RANK=str(len(envs)), COMMSCHED_LOCAL_RANK=str(local_rank),
                           COMMSCHED_LOCAL_SIZE=str(len(group)))
                if gpus is not None:
                    env["CUDA_VISIBLE_DEVICES"] = gpus
                envs.append(env)
        return ordered, envs

    def _node_gpus(self, group):
        """With GPUs: every GPU Ray gave the node's workers, in local-rank order, visible to each of them (as Horovod
        on Ray does), so device local_rank is the worker's own when each has one."""
        if not self.gpus_per_worker:
            return None
        ids = self._wait("ask the workers for their GPUs", [a.get_gpu_ids.remote() for a in group])
        return ",".join(i for worker_ids in ids for i in worker_ids)

    def _wait(self, what, refs, timeout=_SETTINGS_TIMEOUT):
        """ray.get of refs (one per worker, in rank order once ranks are given, else in creation order) within
        timeout_s (None: no bound); a timeout names the workers that did not answer."""
        timeout = self.settings.timeout_s if timeout is _SETTINGS_TIMEOUT else timeout
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            late = [i for i, r in enumerate(refs) if r in pending]
            raise TimeoutError(f"{_NAME}: timed out after timeout_s={timeout} s waiting to {what}: no answer from "
                               f"worker(s) {late} of {len(refs)}")
        return ray.get(refs)

    # ---- run ----

    def run(self, fn, args=None, kwargs=None, callbacks=None):
        """fn(*args, **kwargs) on every worker; its results in rank order."""
        _ignore_callbacks(callbacks)
        return self._gather(self.run_remote(fn, args, kwargs))

    def run_remote(self, fn, args=None, kwargs=None):
        """As run(), but returns the ObjectRefs (rank order) at once; a failure surfaces in ray.get."""
        args, kwargs = list(args or []), dict(kwargs or {})
        return [w.execute.remote(lambda _: fn(*args, **kwargs)) for w in self._started()]

    def execute(self, fn, callbacks=None):
        """fn(executable) on every worker (the object start() made from executable_cls); results in rank order."""
        _ignore_callbacks(callbacks)
        return self._gather([w.execute.remote(fn) for w in self._started()])

    def execute_single(self, fn):
        """fn(executable) on rank 0 only."""
        ref = self._started()[0].execute.remote(fn)
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as err:
            raise WorkerError(0, err) from err

    def _started(self):
        if not self.workers:
            why = f" ({self._stopped_because})" if self._stopped_because else ""
            raise RuntimeError(f"{_NAME}: no workers{why}; call start() first")
        return self.workers

    def _gather(self, refs):
        """Every rank's result. After the first failure the others get _SETTLE_S to finish or fail too; then every
        worker stops (one still running may wait forever for the failed rank) and WorkerError names the rank to
        blame."""
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results = [None] * len(refs)
        failures = {}   # rank -> Ray's error, in the order they arrived
        deadline = None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            if not ready:
                break
            rank = pending.pop(ready[0])
            try:
                results[rank] = ray.get(ready[0])
            except ray.exceptions.RayError as err:
                failures[rank] = err
                deadline = deadline or time.monotonic() + _SETTLE_S
        if failures:
            rank = _to_blame(failures)
            self.shutdown()
            self._stopped_because = f"every worker was stopped after rank {rank} failed"
            raise WorkerError(rank, failures[rank], sorted(set(failures) - {rank})) from failures[rank]
        return results

    # ---- shutdown ----

    def shutdown(self):
        """Stops every worker (their processes end) and frees the placement group start() made."""
        workers, self.workers = self.workers, []
        for w in workers:
            ray.kill(w, no_restart=True)
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None


def group_by_node(nodes):
    """Indices of the actors (nodes[i] is actor i's node) node by node, in the order the nodes first appear: the
    ranks are these indices flattened, a node's local ranks its group's positions."""
    groups = {}
    for index, node in enumerate(nodes):
        groups.setdefault(node, []).append(index)
    return list(groups.values())


def _to_blame(failures):
    """The failed rank to name: one whose actor died, else one whose own code raised, else the first. A rank whose
    collective failed (HorovodInternalError: 'rank 2 lost') usually reports another's failure, and may report it
    before Ray does. By the class's name: importing it would load commsched._C into the driver."""
    ranks = list(failures)
    died = [r for r in ranks if isinstance(failures[r], ray.exceptions.RayActorError)]
    own = [r for r in ranks if type(getattr(failures[r], "cause", None)).__name__ != "HorovodInternalError"]
    return (died or own or ranks)[0]


def _nic_env(nics):
    """settings.nics: commsched's sockets bind the first (sorted) interface; NCCL may use each."""
    if not nics:
        return {}
    names = sorted(nics)
    return {"COMMSCHED_BIND": names[0], "NCCL_SOCKET_IFNAME": ",".join(names)}


def _ignore_callbacks(callbacks):
    if callbacks:
        warnings.warn(f"{_NAME}: callbacks are not called: nothing in a static job logs to them (Horovod's static "
                      "RayExecutor ignores them too)", stacklevel=3)


def _refuse_elastic(asked):
    raise NotImplementedError(f"{_NAME}: elastic training on Ray ({asked}) is not supported yet; use num_workers "
                              "for a fixed-size job, or `commsched launch --min-workers` for elastic training "
                              "(README, Elastic training)")


class ElasticRayExecutor:
    """Horovod's elastic executor on Ray: not supported yet; constructing one says so."""

    @classmethod
    def create_settings(cls, min_num_proc=1, max_num_proc=None, reset_limit=None, elastic_timeout=600, timeout_s=30,
                        **_):
        return MiniSettings(timeout_s=timeout_s, elastic=True)

    def __init__(self, settings, *args, **kwargs):
        _refuse_elastic("ElasticRayExecutor")

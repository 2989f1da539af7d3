"""commsched.ray: Horovod's RayExecutor with only the import changed, on a local Ray (one node, a few CPU workers).
Each worker's function calls commsched.torch.init() with nothing but the environment the executor gave its actor."""
import os
import pathlib

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed for this interpreter (the test venv has it: "
                                        "scripts/test_venv.sh)")
from commsched.ray import ElasticRayExecutor, RayExecutor, WorkerError  # noqa: E402  (was: from horovod.ray ...)
from commsched.ray.runner import group_by_node  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One Ray for the module (its start costs seconds). The actors import this module to unpickle its functions, so
    its folder joins the PYTHONPATH that Ray's processes inherit."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE)] + ([saved] if saved else []))
    # More CPUs than the machine has: each worker asks for one, and they mostly wait on each other.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    if saved is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = saved


def started(num_workers, **start_kwargs):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=num_workers, cpus_per_worker=1,
                           use_gpu=False)
    executor.start(**start_kwargs)
    return executor


def rank_and_sum(scale=1.0):
    import torch
    import commsched.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    total = hvd.allreduce(torch.tensor([scale * (hvd.rank() + 1)]), op=hvd.Sum, name="rank_sum")
    return hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), total.item()


def test_run_gives_every_rank_once_in_order_and_sums_again_after_a_restart():
    executor = started(3)
    try:
        first = executor.run(rank_and_sum, kwargs={"scale": 2.0})
        executor.shutdown()
        executor.start()  # new actors, a new root port and secret
        second = executor.run(rank_and_sum, args=[3.0])
    finally:
        executor.shutdown()
    for results, scale in ((first, 2.0), (second, 3.0)):
        assert [r[:4] for r in results] == [(r, 3, r, 3) for r in range(3)]  # one node: local ranks are the ranks
        assert [r[4] for r in results] == [scale * (1 + 2 + 3)] * 3


def train(steps):
    """A Horovod-style loop: different initial weights per rank, broadcast, DistributedOptimizer."""
    import torch
    import torch.nn.functional as F
    import commsched.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(100 + hvd.rank())  # each rank its own data
    x = torch.randn(64, 8, generator=g)
    y = (x[:, 0] > 0).long()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())
    optimizer.synchronize()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), losses


def test_horovod_style_training_ends_with_equal_parameters():
    executor = started(2)
    try:
        results = executor.run(train, args=[12])
    finally:
        executor.shutdown()
    (params0, losses0), (params1, losses1) = results
    assert params0.equal(params1), (params0 - params1).abs().max()
    assert losses0 == losses1 and losses0[-1] < losses0[0], losses0


class Counter:
    """An executable: made once per worker by start(), handed to every execute()."""

    def __init__(self, start, step=1):
        self.value = start
        self.step = step

    def bump(self):
        self.value += self.step
        return self.value


def test_execute_and_execute_single_reach_the_executable():
    executor = started(2, executable_cls=Counter, executable_args=[10], executable_kwargs={"step": 5})
    try:
        assert executor.execute(lambda c: c.bump()) == [15, 15]
        assert executor.execute_single(lambda c: c.bump()) == 20  # rank 0's only
        assert executor.execute(lambda c: c.value) == [20, 15]
    finally:
        executor.shutdown()


def raise_on_rank_1():
    import torch
    import commsched.torch as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 gives up")
    return hvd.allreduce(torch.ones(1), name="never_completes").item()  # waits for rank 1 forever


def exit_on_rank_2():
    import os
    import torch
    import commsched.torch as hvd
    hvd.init()
    if hvd.rank() == 2:
        os._exit(3)  # the actor's process dies
    return hvd.allreduce(torch.ones(1), name="never_completes").item()


def test_a_failing_rank_is_named_without_a_hang_and_start_again_works():
    executor = started(3)
    try:
        for fn, rank, cause in ((raise_on_rank_1, 1, "ValueError: rank 1 gives up"), (exit_on_rank_2, 2, "died")):
            with pytest.raises(WorkerError, match=f"(?s)rank {rank} failed.*{cause}") as info:
                executor.run(fn)
            assert info.value.rank == rank
            with pytest.raises(RuntimeError, match=f"stopped after rank {rank} failed.*call start"):
                executor.run(rank_and_sum)
            executor.start()
            assert [r[4] for r in executor.run(rank_and_sum)] == [6.0] * 3
    finally:
        executor.shutdown()


def test_refusals_name_the_culprit():
    settings = RayExecutor.create_settings(timeout_s=5)
    with pytest.raises(NotImplementedError, match="min_workers=2"):
        RayExecutor(settings, min_workers=2, max_workers=4)
    with pytest.raises(NotImplementedError, match="ElasticRayExecutor"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2))
    with pytest.raises(ValueError, match="num_workers must be a positive integer, got 0"):
        RayExecutor(settings, num_workers=0)
    with pytest.raises(ValueError, match="num_workers, or num_hosts .* not neither"):
        RayExecutor(settings)
    with pytest.raises(ValueError, match="not both"):
        RayExecutor(settings, num_workers=0, num_hosts=1)
    with pytest.raises(ValueError, match="gpus_per_worker=1 needs use_gpu=True"):
        RayExecutor(settings, num_workers=2, gpus_per_worker=1)
    executor = RayExecutor(settings, num_workers=2)
    with pytest.raises(ValueError, match="COMMSCHED_NUM_SERVERS.*workers only"):
        executor.start(extra_env_vars={"COMMSCHED_NUM_SERVERS": 1})
    assert executor.workers == []
    with pytest.raises(RuntimeError, match="no workers; call start"):
        executor.run(rank_and_sum)


def test_ranks_go_node_by_node_whatever_order_ray_places_the_actors_in():
    """Two nodes whose actors Ray interleaved: each node's ranks are consecutive, rank 0 is the first actor."""
    assert group_by_node(["n2", "n1", "n2", "n3", "n1"]) == [[0, 2], [1, 4], [3]]
    assert group_by_node(["n1"] * 3) == [[0, 1, 2]]


def test_num_hosts_places_each_hosts_workers_together():
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=1, num_workers_per_host=2)
    executor.start()
    try:
        assert executor.run(rank_and_sum) == [(0, 2, 0, 2, 3.0), (1, 2, 1, 2, 3.0)]
    finally:
        executor.shutdown()


def run_inside_a_placement_group():
    """What Ray Tune does: the executor's creator runs in a placement group that holds its workers' bundles too."""
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    executor.start()
    try:
        return executor._pg is None, executor.run(rank_and_sum)
    finally:
        executor.shutdown()


def test_an_enclosing_placement_group_is_used_for_the_workers():
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    pg = placement_group([{"CPU": 1}] * 3)  # the creator's bundle and one per worker
    ray.get(pg.ready(), timeout=60)
    try:
        inside = PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
        no_own_group, results = ray.get(ray.remote(run_inside_a_placement_group)
                                        .options(num_cpus=1, scheduling_strategy=inside).remote(), timeout=120)
    finally:
        remove_placement_group(pg)
    assert no_own_group
    assert results == [(0, 2, 0, 2, 3.0), (1, 2, 1, 2, 3.0)]


def test_more_workers_than_the_cluster_holds_time_out_naming_the_request():
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=2)
    executor = RayExecutor(settings, num_workers=5, cpus_per_worker=1)  # the local Ray has 4 CPUs
    with pytest.raises(TimeoutError, match=r"did not grant 5 x \{'CPU': 1\} \(PACK\) within "
                                           r"placement_group_timeout_s=2 s"):
        executor.start()
    assert executor.workers == [] and executor._pg is None

"""Every public name of horovod.torch 0.28 exists in commsched.torch and behaves as Horovod documents it, on 2 ranks,
on the parameter server and on Gloo (horovod_api_worker.py checks each result against locally computed values)."""
import json

import pytest

from torch_cluster import HERE, launch, run_single

# horovod/torch/__init__.py of Horovod 0.28.1 (horovod is not installable here, so the list is written out).
HOROVOD_TORCH_028 = sorted("""
    elastic Compression allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters
    allreduce allreduce_async allreduce_ allreduce_async_
    grouped_allreduce grouped_allreduce_async grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async
    allgather allgather_async grouped_allgather grouped_allgather_async
    broadcast broadcast_async broadcast_ broadcast_async_ alltoall alltoall_async
    reducescatter reducescatter_async grouped_reducescatter grouped_reducescatter_async
    join barrier poll synchronize init shutdown is_initialized start_timeline stop_timeline
    size local_size cross_size rank local_rank cross_rank
    mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built
    nccl_built ddl_built ccl_built cuda_built rocm_built
    ProcessSet global_process_set add_process_set remove_process_set
    Average Sum Adasum Min Max Product HorovodInternalError DistributedOptimizer SyncBatchNorm
""".split())


def test_every_horovod_name_exists():
    import commsched.torch as hvd
    missing = [n for n in HOROVOD_TORCH_028 if not hasattr(hvd, n)]
    assert not missing, f"commsched.torch lacks {missing}"


@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_every_horovod_name_behaves_on_two_ranks(tmp_path, servers):
    rc, log = launch(2, [HERE / "horovod_api_worker.py", "--out", tmp_path], servers=servers, timeout=120,
                     env={"COMMSCHED_PARTITION_BYTES": "64", "COMMSCHED_CREDIT_BYTES": "256"})
    assert rc == 0, log
    for r in range(2):
        called = set(json.loads((tmp_path / f"called.{r}.json").read_text()))
        unchecked = [n for n in HOROVOD_TORCH_028 if n not in called]
        assert not unchecked, f"rank {r} did not exercise {unchecked}\n{log}"
    assert ("on ps" if servers else "on gloo") in log


@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_gradients_flow_through_every_collective_as_in_horovod(servers):
    """broadcast, allgather, alltoall, reducescatter and the grouped forms are differentiable in horovod.torch; a
    model-parallel or mixture-of-experts layer built on them must train the same here."""
    rc, log = launch(2, [HERE / "collective_grads_worker.py"], servers=servers, timeout=90)
    assert rc == 0, log
    assert log.count("gradients ok") == 2, log


def test_sync_batch_norm_with_unequal_batches_float16_and_an_input_off_the_default_device():
    rc, log = launch(2, [HERE / "sync_batch_norm_worker.py"], servers=0, timeout=90)
    assert rc == 0, log
    assert log.count("sync batch norm ok") == 2, log


@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_a_process_set_runs_without_the_ranks_outside_it(servers):
    rc, log = launch(3, [HERE / "process_set_worker.py"], servers=servers, timeout=90)
    assert rc == 0, log
    assert log.count("process sets ok") == 3, log


@pytest.mark.parametrize("servers", [1, 0], ids=["ps", "gloo"])
def test_join_stands_in_with_zeros_for_uneven_data(servers):
    rc, log = launch(3, [HERE / "join_worker.py"], servers=servers, timeout=90)
    assert rc == 0, log
    assert log.count("join ok (last 2)") == 3, log


def test_process_set_ids_start_again_after_a_shutdown():
    """An elastic re-init shuts down and initializes again; a joiner is a fresh process whose first set is id 1, so
    the survivors must number from 1 again too, or the same set meets under two store scopes (pset/<id>/)."""
    code = ("import commsched.torch as hvd\n"
            "ids = []\n"
            "for _ in range(2):\n"
            "    hvd.init()\n"
            "    ids.append(hvd.add_process_set([0]).process_set_id)\n"
            "    hvd.shutdown()\n"
            "print('set ids', ids)\n")
    rc, log = run_single(["-c", code])
    assert rc == 0, log
    assert "set ids [1, 1]" in log, log

"""One worker of the horovod.torch API test: calls every public name of horovod.torch 0.28 through commsched.torch
and checks each result against what Horovod documents (values computed locally from the known inputs of every
rank). Writes the names it exercised to <out>/called.<rank>.json; any failed check raises (non-zero exit)."""
import argparse
import json
import pathlib

import torch

import commsched.torch as hvd

called = set()


def check(name, cond, what=""):
    called.add(name)
    if not cond:
        raise AssertionError(f"rank {hvd.rank()}: {name}: {what}")


def close(a, b):
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=1e-6)


def rows_of(r):
    """Rank r's allgather input: r+1 rows of [r, r, r] (ranks differ in the first dimension)."""
    return torch.full((r + 1, 3), float(r))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = pathlib.Path(args.out)

    singles = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
    check("ProcessSet", singles[0].ranks == [0])
    hvd.init(process_sets=singles)
    check("init", hvd.is_initialized())
    check("is_initialized", hvd.is_initialized())
    n, me = hvd.size(), hvd.rank()
    check("size", n == 2)
    check("rank", me in (0, 1))
    check("local_rank", hvd.local_rank() == me)
    check("local_size", hvd.local_size() == 2)
    check("cross_rank", hvd.cross_rank() == 0)
    check("cross_size", hvd.cross_size() == 1)
    backend = hvd.context().backend
    for q in ("mpi_built", "mpi_enabled", "mpi_threads_supported", "ddl_built", "ccl_built", "rocm_built"):
        check(q, getattr(hvd, q)() is False, "commsched has no MPI/DDL/oneCCL/ROCm")
    check("gloo_built", hvd.gloo_built() is True, "this build has Gloo")
    check("gloo_enabled", hvd.gloo_enabled() == (backend == "gloo"))
    check("nccl_built", hvd.nccl_built() == bool(hvd._C.build["nccl"]))
    check("cuda_built", hvd.cuda_built() == bool(hvd._C.build["cuda"]))

    mine = torch.arange(4, dtype=torch.float32) + 10 * me
    everyone = [torch.arange(4, dtype=torch.float32) + 10 * r for r in range(n)]
    total = sum(everyone)
    check("Sum", close(hvd.allreduce(mine, op=hvd.Sum), total))
    check("Average", close(hvd.allreduce(mine, op=hvd.Average), total / n))
    check("allreduce", close(hvd.allreduce(mine), total / n) and close(mine, everyone[me]), "input untouched")
    check("Min", close(hvd.allreduce(mine, op=hvd.Min), torch.stack(everyone).amin(0)))
    check("Max", close(hvd.allreduce(mine, op=hvd.Max), torch.stack(everyone).amax(0)))
    check("Product", close(hvd.allreduce(mine + 1, op=hvd.Product), torch.stack(everyone).add(1).prod(0)))
    t = mine.clone()
    check("allreduce_", close(hvd.allreduce_(t, op=hvd.Sum), total) and close(t, total))
    check("allreduce_async", close(hvd.synchronize(hvd.allreduce_async(mine, op=hvd.Max)), everyone[-1]))
    t = mine.clone()
    h = hvd.allreduce_async_(t, op=hvd.Sum)
    check("synchronize", close(hvd.synchronize(h), total))
    check("allreduce_async_", close(t, total))
    h = hvd.allreduce_async(mine)
    while not hvd.poll(h):
        pass
    check("poll", close(hvd.synchronize(h), total / n))
    try:
        hvd.allreduce(mine, op=hvd.Adasum)
        check("Adasum", False, "Adasum must be refused")
    except ValueError as e:
        check("Adasum", "Average" in str(e), f"the error must name what to use instead: {e}")

    ints = torch.tensor([me + 1, 7], dtype=torch.uint8)
    check("allreduce", torch.equal(hvd.allreduce(ints, op=hvd.Sum), torch.tensor([3, 14], dtype=torch.uint8)))

    # grouped_allreduce: all four forms.
    pair = [mine, mine * 2]
    res = hvd.grouped_allreduce(pair, op=hvd.Sum)
    check("grouped_allreduce", close(res[0], total) and close(res[1], total * 2))
    res = hvd.synchronize(hvd.grouped_allreduce_async(pair, op=hvd.Min))
    check("grouped_allreduce_async", close(res[1], everyone[0] * 2))
    ts = [mine.clone(), mine.clone() * 2]
    hvd.grouped_allreduce_(ts, op=hvd.Average)
    check("grouped_allreduce_", close(ts[0], total / n) and close(ts[1], total))
    ts = [mine.clone(), mine.clone()]
    hvd.synchronize(hvd.grouped_allreduce_async_(ts, op=hvd.Sum))
    check("grouped_allreduce_async_", close(ts[0], total) and close(ts[1], total))

    # allgather: different first dimensions.
    gathered = torch.cat([rows_of(r) for r in range(n)])
    check("allgather", close(hvd.allgather(rows_of(me)), gathered))
    check("allgather_async", close(hvd.synchronize(hvd.allgather_async(rows_of(me))), gathered))
    res = hvd.grouped_allgather([rows_of(me), rows_of(me).long()])
    check("grouped_allgather", close(res[0], gathered) and res[1].dtype == torch.int64 and close(res[1], gathered))
    res = hvd.synchronize(hvd.grouped_allgather_async([rows_of(me)]))
    check("grouped_allgather_async", close(res[0], gathered))
    flags = hvd.allgather(torch.tensor([me == 1]))
    check("allgather", flags.tolist() == [False, True], f"bool allgather: {flags}")
    objs = hvd.allgather_object({"rank": me, "tag": "x" * (me + 1)})
    check("allgather_object", objs == [{"rank": r, "tag": "x" * (r + 1)} for r in range(n)], str(objs))
    check("broadcast_object", hvd.broadcast_object({"from": me}, root_rank=1) == {"from": 1})

    # reducescatter: 5 rows over 2 ranks -> rank 0 keeps 3, rank 1 keeps 2 (Horovod's split).
    big = torch.arange(15, dtype=torch.float32).reshape(5, 3) * (me + 1)
    full = torch.arange(15, dtype=torch.float32).reshape(5, 3) * sum(r + 1 for r in range(n))
    block = full[:3] if me == 0 else full[3:]
    check("reducescatter", close(hvd.reducescatter(big, op=hvd.Sum), block))
    check("reducescatter_async", close(hvd.synchronize(hvd.reducescatter_async(big)), block / n))
    res = hvd.grouped_reducescatter([big, big * 2], op=hvd.Sum)
    check("grouped_reducescatter", close(res[0], block) and close(res[1], block * 2))
    res = hvd.synchronize(hvd.grouped_reducescatter_async([big], op=hvd.Sum))
    check("grouped_reducescatter_async", close(res[0], block))

    # alltoall: rank r sends r+1 rows to rank 0 and 1 row to rank 1, each row tagged 10*r + destination.
    splits = torch.tensor([me + 1, 1])
    send = torch.tensor([10 * me + 0.0] * (me + 1) + [10 * me + 1.0]).reshape(-1, 1)
    expect = torch.tensor([10 * r + float(me) for r in range(n) for _ in range(int(r + 1 if me == 0 else 1))])
    got, received = hvd.alltoall(send, splits=splits)
    check("alltoall", close(got.reshape(-1), expect), f"{got.reshape(-1)} vs {expect}")
    check("alltoall", received.tolist() == ([1, 2] if me == 0 else [1, 1]), str(received))
    eq = torch.tensor([[10.0 * me], [10.0 * me + 1]])
    got, received = hvd.synchronize(hvd.alltoall_async(eq))
    check("alltoall_async", close(got.reshape(-1), torch.tensor([10.0 * r + me for r in range(n)])))

    # broadcast family.
    b = torch.full((3,), float(me))
    check("broadcast", close(hvd.broadcast(b, root_rank=1), torch.ones(3)) and close(b, torch.full((3,), float(me))))
    check("broadcast_async", close(hvd.synchronize(hvd.broadcast_async(b, 0)), torch.zeros(3)))
    hvd.broadcast_(b, root_rank=1)
    check("broadcast_", close(b, torch.ones(3)))
    b = torch.full((3,), float(me))
    hvd.synchronize(hvd.broadcast_async_(b, 0))
    check("broadcast_async_", close(b, torch.zeros(3)))

    # sparse all-reduce: the sum of every rank's sparse tensor.
    sp = torch.sparse_coo_tensor(torch.tensor([[me]]), torch.tensor([float(me + 1)]), (3,))
    dense = hvd.sparse_allreduce_async(sp, "sparse", hvd.Sum)().to_dense()
    check("sparse_allreduce_async", close(dense, torch.tensor([1.0, 2.0, 0.0])), str(dense))

    # Process sets: the two static singletons, and a dynamic set of both ranks (its own Gloo engine).
    own = singles[me]
    check("global_process_set", hvd.global_process_set.size() == n and hvd.global_process_set.rank() == me)
    check("ProcessSet", own.included() and own.size() == 1 and not singles[1 - me].included())
    check("ProcessSet", close(hvd.allreduce(mine, op=hvd.Sum, process_set=own), mine))
    both = hvd.add_process_set([0, 1])
    check("add_process_set", both.size() == 2 and both.rank() == me)
    check("add_process_set", close(hvd.allreduce(mine, op=hvd.Sum, process_set=both), total))
    check("add_process_set", close(hvd.allgather(rows_of(me), process_set=both), gathered))
    check("add_process_set", close(hvd.broadcast(b + me, root_rank=1, process_set=both), torch.ones(3)))
    try:
        hvd.allreduce(mine, process_set=singles[1 - me])
        check("ProcessSet", False, "a non-member's call must be refused")
    except ValueError as e:
        check("ProcessSet", "not in process set" in str(e), str(e))
    check("remove_process_set", hvd.remove_process_set(both) and not hvd.remove_process_set(both))

    # Optimizer, parameters, SyncBatchNorm: SyncBatchNorm over each rank's half batch equals BatchNorm over the
    # whole batch, forward and backward.
    torch.manual_seed(0)
    x = torch.randn(8, 3, 4)
    sbn, bn = hvd.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        sbn.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
        bn.weight.copy_(sbn.weight)
    part = x[4 * me:4 * me + 4].clone().requires_grad_()
    whole = x.clone().requires_grad_()
    y_part, y_whole = sbn(part), bn(whole)
    (y_part * torch.arange(4.0).reshape(1, 1, 4)).sum().backward()
    (y_whole * torch.arange(4.0).reshape(1, 1, 4)).sum().backward()
    check("SyncBatchNorm", close(y_part, y_whole[4 * me:4 * me + 4]), "forward")
    check("SyncBatchNorm", torch.allclose(part.grad, whole.grad[4 * me:4 * me + 4], atol=1e-5), "input gradient")
    check("SyncBatchNorm", torch.allclose(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), bn.weight.grad, atol=1e-5),
          "weight gradient (summed over ranks)")
    check("SyncBatchNorm", close(sbn.running_mean, bn.running_mean) and
          torch.allclose(sbn.running_var, bn.running_var, atol=1e-5), "running statistics")

    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(float(me))
    hvd.broadcast_parameters(model.state_dict(), root_rank=1)
    check("broadcast_parameters", torch.equal(model.weight, torch.ones(2, 3)))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.none)
    check("Compression", hvd.Compression.none is not None)
    model(torch.full((1, 3), float(me))).sum().backward()
    opt.step()
    opt.flush()  # cross-iteration mode (the default) applies the update before the next forward; now, here
    # Gradient of weight row: the input, averaged over ranks -> 0.5; weight 1 - 0.1 * 0.5.
    check("DistributedOptimizer", torch.allclose(model.weight, torch.full((2, 3), 0.95)), str(model.weight))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    check("broadcast_optimizer_state", True)

    # Traces, errors, unsupported features, barrier, join.
    hvd.start_timeline(str(out / "trace.json"))
    hvd.allreduce(mine, name="traced")
    hvd.stop_timeline()
    trace = json.loads((out / f"trace.rank{me}.json").read_text())
    check("start_timeline", any(e.get("name") == "traced" for e in trace), "the traced allreduce is in the file")
    check("stop_timeline", trace[-1].get("name") != "untraced")
    hvd.allreduce(mine, name="untraced")
    trace = json.loads((out / f"trace.rank{me}.json").read_text())
    check("stop_timeline", not any(e.get("name") == "untraced" for e in trace), "nothing recorded after stop")
    check("HorovodInternalError", issubclass(hvd.HorovodInternalError, RuntimeError))
    # Without an elastic store (`commsched launch --min-workers`) the function runs once, on synced state.
    elastic_state = hvd.elastic.ObjectState(epoch=10 + me)
    check("elastic", hvd.elastic.run(lambda state, k: state.epoch + k)(elastic_state, 1) == 11, "rank 0's state")
    hvd.barrier()
    check("barrier", True)
    last = hvd.join()
    check("join", last in (0, 1), str(last))
    hvd.shutdown()
    check("shutdown", not hvd.is_initialized())
    (out / f"called.{me}.json").write_text(json.dumps(sorted(called)))
    print(f"rank {me}: {len(called)} names checked on {backend}", flush=True)


if __name__ == "__main__":
    main()

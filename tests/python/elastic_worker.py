"""An elastic training script (Horovod's API) for tests/python/test_elastic.py, run under `commsched launch
--min-workers`. Trains a small model on a fixed global batch per step (each rank its slice of the current size) and
commits after every step; a victim (the worker whose launcher id is ELASTIC_VICTIM) dies (ELASTIC_FAULT=kill) or
freezes (ELASTIC_FAULT=stop), or kills this run's parameter servers (ELASTIC_FAULT=kill-servers), or every worker sums
a tensor whose size differs by rank (ELASTIC_FAULT=mismatch), in the middle of step ELASTIC_FAULT_STEP, after its backward, while the others wait for
its gradients. Each worker that finishes writes OUT/model.<id>.pt and prints its final rank and size.

For bench/torch/elastic_recovery.py: rank 0 prints "first step at T" (wall clock) when each call of the training
function starts its first step; ELASTIC_SAVE_AT=k makes rank 0 save the state committed after step k to
OUT/commit.pt, and ELASTIC_RESUME=FILE starts from such a file (a plain restart from the same commit).
"""
import argparse
import os
import signal
import time

import torch

import commsched.torch as hvd
from commsched._elastic import ElasticError
from elastic_common import wait_for_joiners

EPOCHS, BATCHES, GLOBAL_BATCH = 2, 12, 24


def batch_of(epoch, batch):
    gen = torch.Generator().manual_seed(1000 * epoch + batch)
    x = torch.randn(GLOBAL_BATCH, 4, generator=gen)
    return x, x.sum(1, keepdim=True)


_servers_killed = []


def fault_here(state):
    if state.step != int(os.environ.get("ELASTIC_FAULT_STEP", "-1")):
        return
    if os.environ.get("ELASTIC_FAULT") == "mismatch":  # every rank: a tensor whose size differs by rank
        hvd.allreduce(torch.ones(1 + hvd.rank()), name="elastic.mismatch")
    if os.environ.get("COMMSCHED_ELASTIC_ID") != os.environ.get("ELASTIC_VICTIM"):
        return
    print(f"worker {os.environ['COMMSCHED_ELASTIC_ID']}: {os.environ['ELASTIC_FAULT']} at step {state.step} "
          f"({time.time():.3f})", flush=True)
    if os.environ["ELASTIC_FAULT"] == "kill-servers":  # this run's parameter servers, found by their store address
        # Once: the victim survives, rolls back to the commit before this step and comes here again; killing the
        # next generation's servers too would be a failure that loses no worker, every time (given up after three).
        if not _servers_killed:
            _servers_killed.append(True)
            kill_servers()
        return
    if os.environ["ELASTIC_FAULT"] == "kill-launcher":  # a whole node lost: its workers die with their launcher
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)
    if os.environ["ELASTIC_FAULT"] == "stop":  # the test resumes it (SIGCONT) once the others have finished
        with open(os.path.join(os.environ["ELASTIC_OUT"], "frozen.pid"), "w") as f:
            f.write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL if os.environ["ELASTIC_FAULT"] == "kill" else signal.SIGSTOP)


def kill_servers():
    mine = ("COMMSCHED_ELASTIC_STORE=" + os.environ["COMMSCHED_ELASTIC_STORE"]).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if mine in env and b"COMMSCHED_ROLE=server" in env:
            os.kill(int(pid), signal.SIGKILL)


def main(out):
    os.environ["ELASTIC_OUT"] = out
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(time.time())])
    step_s = float(os.environ.get("ELASTIC_STEP_S", "0.05"))

    resume = os.environ.get("ELASTIC_RESUME")
    if resume and hvd.rank() == 0:  # the others receive it with the state's first sync
        saved = torch.load(resume)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state.step = saved["step"]
        state.save()
    save_at = int(os.environ.get("ELASTIC_SAVE_AT", "-1"))

    @hvd.elastic.run
    def train(state):
        if hvd.rank() == 0:
            print(f"first step at {time.time():.3f}", flush=True)
        while state.step < EPOCHS * BATCHES:  # the step counter is committed after it advanced: no step runs twice
            if state.step == EPOCHS * BATCHES - 1:
                wait_for_joiners(state, hvd.size)
            x, y = batch_of(state.step // BATCHES, state.step % BATCHES)
            n, r = hvd.size(), hvd.rank()
            per = GLOBAL_BATCH // n
            mine = slice(per * r, per * (r + 1)) if r < n - 1 else slice(per * r, GLOBAL_BATCH)
            opt.zero_grad()
            # Summed over the rank's slice and scaled so that the average over ranks is the global batch's mean:
            # the same gradient at any size (up to rounding).
            loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine], reduction="sum") * n / GLOBAL_BATCH
            loss.backward()
            fault_here(state)
            opt.step()
            time.sleep(step_s)
            state.step += 1
            state.commit()
            if state.step == save_at and hvd.rank() == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": state.step},
                           os.path.join(out, "commit.pt"))

    ident = os.environ.get("COMMSCHED_ELASTIC_ID", str(hvd.rank()))
    try:
        train(state)
    except ElasticError as e:
        # Written to a file of its own: two survivors' tracebacks interleave on the shared stderr.
        with open(os.path.join(out, f"stopped.{ident}.txt"), "w") as f:
            f.write(str(e))
        raise
    torch.save({"model": model.state_dict(), "size": hvd.size(), "rank": hvd.rank(), "steps": state.step},
               os.path.join(out, f"model.{ident}.pt"))
    print(f"worker {ident}: finished as rank {hvd.rank()} of {hvd.size()} after {state.step} steps, "
          f"{len(resets)} reset(s) at {[f'{t:.3f}' for t in resets]}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    main(ap.parse_args().out)

"""A script for torchrun --max-restarts (tests/python/test_elastic.py): trains STEPS steps on Gloo, rank 0 saving a
checkpoint after each; in the first attempt (TORCHELASTIC_RESTART_COUNT=0) rank 1 dies in step 4, torchrun starts
every worker again, and the new attempt (a new generation of commsched's rendezvous) resumes from the checkpoint.
Each rank writes OUT/model.RANK.pt at the end."""
import argparse
import os
import signal

import torch

import commsched.torch as hvd
from commsched import _C

STEPS = 10


def main(out):
    torch.set_num_threads(1)
    hvd.init()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ckpt = os.path.join(out, "ckpt.pt")
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    if hvd.rank() == 0 and os.path.exists(ckpt):
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        state.step = saved["step"]
        state.save()

    @hvd.elastic.run  # no elastic store under torchrun: called once, on rank 0's state
    def train(state):
        while state.step < STEPS:
            if attempt == 0 and hvd.rank() == 1 and state.step == 4:
                os.kill(os.getpid(), signal.SIGKILL)
            gen = torch.Generator().manual_seed(state.step)
            x = torch.randn(8, 4, generator=gen)
            mine = x[4 * hvd.rank():4 * (hvd.rank() + 1)]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(mine), mine.sum(1, keepdim=True)).backward()
            opt.step()
            state.step += 1
            if hvd.rank() == 0:
                torch.save({"model": model.state_dict(), "step": state.step}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)

    train(state)
    torch.save(model.state_dict(), os.path.join(out, f"model.{hvd.rank()}.pt"))
    print(f"rank {hvd.rank()} of {hvd.size()}: attempt {attempt}, generation {_C.cluster_env()['generation']}, "
          f"finished at step {state.step}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    main(ap.parse_args().out)

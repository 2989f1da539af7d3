"""A worker of the multi-node launch test. ok: one all-reduce, prints the result; fail: rank 1 exits 3 after the
rendezvous while the others wait; wait: every rank sleeps (the test interrupts a launcher)."""
import sys
import time

import torch

import commsched.torch as hvd

mode = sys.argv[1]
hvd.init()
if mode == "ok":
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    print(f"rank {hvd.rank()} of {hvd.size()} local {hvd.local_rank()}/{hvd.local_size()} cross {hvd.cross_rank()}: "
          f"sum {total.item()}", flush=True)
elif mode == "fail" and hvd.rank() == 1:
    sys.exit(3)
else:
    print(f"rank {hvd.rank()} waiting", flush=True)
    time.sleep(60)
hvd.shutdown()

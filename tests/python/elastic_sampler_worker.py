"""Elastic training over a DataLoader with Horovod's ElasticSampler, for tests/python/test_elastic.py: 3 workers take
batches of 2 from a shuffled dataset of 36 samples and commit after every step; the worker whose launcher id is 2
dies at the start of its batch KILL_AT of epoch 0, after its earlier batches were committed. Each worker appends
[epoch, samples] to OUT/samples.<id>.jsonl once a step is committed, so the test can count how often every sample
was trained on."""
import json
import os
import signal
import sys

import torch

import commsched.torch as hvd

SAMPLES, BATCH, EPOCHS, KILL_AT = 36, 2, 2, 2


def main(out):
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    dataset = torch.utils.data.TensorDataset(torch.arange(SAMPLES, dtype=torch.float32).unsqueeze(1))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=0)
    ident = os.environ["COMMSCHED_ELASTIC_ID"]
    log = open(os.path.join(out, f"samples.{ident}.jsonl"), "a")

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, EPOCHS):
            for idx, (x,) in enumerate(loader):
                if ident == "2" and state.epoch == 0 and idx == KILL_AT:
                    os.kill(os.getpid(), signal.SIGKILL)
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                sampler.record_batch(idx, BATCH)
                state.commit()
                log.write(json.dumps([state.epoch, x.squeeze(1).long().tolist()]) + "\n")
                log.flush()
            sampler.set_epoch(state.epoch + 1)

    train(state)
    print(f"worker {ident}: finished as rank {hvd.rank()} of {hvd.size()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])

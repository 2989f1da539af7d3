"""Ray Train's TorchTrainer runs launcher_train.train() in 4 workers on a local Ray: Ray sets torchrun's variables
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) in each worker, and commsched.torch.init()
derives its rendezvous from them (on MASTER_PORT + 1: Ray's torch process group holds MASTER_PORT)."""
import argparse

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import launcher_train


def loop(config):
    launcher_train.train(config["out"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    # More CPUs than this machine has: each worker asks for one, and they mostly wait on each other.
    ray.init(num_cpus=2 * args.workers, include_dashboard=False)
    trainer = TorchTrainer(loop, train_loop_config={"out": args.out},
                           scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
                           run_config=RunConfig(storage_path=args.out, name="ray"))
    trainer.fit()
    ray.shutdown()


if __name__ == "__main__":
    main()

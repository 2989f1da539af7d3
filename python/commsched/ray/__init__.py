"""Horovod's Ray API on commsched: `from commsched.ray import RayExecutor` where a script had `from horovod.ray import
RayExecutor`. Each worker is a Ray actor whose environment describes its place in the job (COMMSCHED_RANK, the sizes,
the root on rank 0's node), so `commsched.torch.init()` / `commsched.tensorflow.init()` inside the function it runs
needs no launcher. All-reduce (Gloo unless COMMSCHED_BACKEND says otherwise), as Horovod on Ray."""
from commsched.ray.runner import ElasticRayExecutor, MiniSettings, RayExecutor, WorkerError
from commsched.ray.worker import BaseHorovodWorker

__all__ = ["RayExecutor", "ElasticRayExecutor", "BaseHorovodWorker", "MiniSettings", "WorkerError"]

"""The Ray actor behind one rank of a RayExecutor."""
import os
import socket

import ray


class BaseHorovodWorker:
    """One rank: answers where it runs, takes the environment the executor computes for it, holds the executable
    object that execute() hands to functions."""
    executable = None

    def node_id(self):
        return ray.get_runtime_context().get_node_id()

    def node_ip(self):
        return ray.util.get_node_ip_address()

    def hostname(self):
        return socket.gethostname()

    def get_gpu_ids(self):
        """The GPUs Ray gave this actor (CUDA_VISIBLE_DEVICES ids, as strings)."""
        return [str(i) for i in ray.get_gpu_ids()]

    def free_port(self):
        """A port P on this node with P + 1 free too (both checked while held): the root's rendezvous listens on P and
        the hierarchical mode's on P + 1 unless told otherwise."""
        for _ in range(100):
            with socket.socket() as a, socket.socket() as b:
                a.bind(("", 0))
                port = a.getsockname()[1]
                if port >= 65535:
                    continue
                try:
                    b.bind(("", port + 1))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"commsched.ray: no two adjacent free ports on {self.hostname()}")

    def update_env_vars(self, env_vars):
        os.environ.update({k: str(v) for k, v in env_vars.items()})

    def env_vars(self):
        return dict(os.environ)

    def start_executable(self, executable_cls=None, executable_args=None, executable_kwargs=None):
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or []), **(executable_kwargs or {}))

    def execute(self, func):
        """func(executable): the object start() made from executable_cls, or None."""
        return func(self.executable)

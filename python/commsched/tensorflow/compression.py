"""Gradient compression with Horovod's names, done by the engine's compression stage (C++) per partition, on the
wire only: the tensor handed to the engine is the gradient itself, each partition is encoded on a stage node and
decoded back in place. Top-k and signSGD keep an error-feedback residual per tensor on this worker; on an
all-reduce backend (Gloo, NCCL) only fp16 and bf16 are allowed (the engine refuses the others, naming the scheme)."""
from commsched._compression import topk_spec


class Compressor:
    """`engine_spec` names the engine's scheme ('fp16', 'bf16', 'topk:R', 'signsgd'); None: the run's default
    (COMMSCHED_COMPRESSION)."""

    def __init__(self, engine_spec=None):
        self.engine_spec = engine_spec

    def __repr__(self):
        return f"Compression({self.engine_spec or 'none'})"


class Compression:
    """Horovod's compressors (none, fp16) plus the engine's bf16, top-k and signSGD."""
    none = Compressor(None)
    fp16 = Compressor("fp16")
    bf16 = Compressor("bf16")
    signsgd = Compressor("signsgd")

    @staticmethod
    def topk(ratio=0.01):
        """Sends the ceil(ratio * n) largest-magnitude elements of each partition (with error feedback)."""
        return Compressor(topk_spec(ratio))

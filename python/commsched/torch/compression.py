"""Gradient compression, with horovod.torch.Compression's names.

`Compression.fp16`, `.bf16`, `.topk(ratio)` and `.signsgd` are done by the engine's compression stage (C++), per
partition, on the wire only: the tensor handed to the engine is the gradient itself, each partition is encoded on a
stage node (overlapping other partitions' communication) and the result is decoded back in place. Top-k and signSGD
keep an error-feedback residual per tensor on this worker. On an all-reduce backend (Gloo, NCCL) only fp16 and bf16
are allowed; the engine refuses the others, naming the scheme and the backend.

`Compression.fp16_torch` is the old PyTorch-side cast (a float16 copy before submitting), kept for comparison.
"""
import torch

from commsched._compression import topk_spec


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor. `engine_spec` names the
    engine's scheme for what is submitted (None: the engine's configured default, COMMSCHED_COMPRESSION)."""
    engine_spec = None

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is (zero-copy), unless COMMSCHED_COMPRESSION sets a default for the run."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class EngineCompressor(Compressor):
    """A scheme of the engine's compression stage; the tensor itself goes to the engine."""

    def __init__(self, spec):
        self.engine_spec = spec

    def compress(self, tensor):
        return tensor, None

    def decompress(self, tensor, ctx):
        return tensor

    def __repr__(self):
        return f"Compression({self.engine_spec})"


class FP16Compressor(Compressor):
    """Casts floating-point tensors to float16 in PyTorch before submitting (half the bytes); others unchanged."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """Horovod's names for the compressors, plus the engine's top-k and signSGD."""
    none = NoneCompressor
    fp16 = EngineCompressor("fp16")
    bf16 = EngineCompressor("bf16")
    signsgd = EngineCompressor("signsgd")
    fp16_torch = FP16Compressor

    @staticmethod
    def topk(ratio=0.01):
        """Sends the ceil(ratio * n) largest-magnitude elements of each partition (with error feedback)."""
        return EngineCompressor(topk_spec(ratio))

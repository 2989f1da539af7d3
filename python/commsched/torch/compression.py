"""Gradient compression, as horovod.torch.Compression: compress before the wire, decompress after."""
import torch


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is (zero-copy)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes); other dtypes unchanged."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """Horovod's names for the compressors."""
    none = NoneCompressor
    fp16 = FP16Compressor

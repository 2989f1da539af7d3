"""Shared by every Python test module."""
# torch before anything loads commsched._C: the extension links the NCCL it was built with, and once that is loaded a
# CUDA build of torch that needs a newer NCCL (its wheel brings its own libnccl.so.2) fails to import ("undefined
# symbol: ncclCommResume"). commsched.torch imports torch first for that reason; a test module that imports
# commsched._C directly (commsched._host_collectives, the stats binding) would otherwise decide, by the order pytest
# collects modules in, whether the torch tests after it can import torch at all.
try:
    import torch  # noqa: F401
except ImportError:  # a framework-free environment: nothing to protect
    pass

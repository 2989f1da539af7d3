"""commsched: a communication scheduler for data-parallel training (ByteScheduler line).

Frameworks: ``commsched.torch`` (Horovod-compatible). The C++ engine is ``commsched._C``.
"""
__version__ = "0.1.0"

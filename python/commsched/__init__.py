"""commsched: a communication scheduler for data-parallel training (ByteScheduler line).

Frameworks: ``commsched.torch``, ``commsched.tensorflow`` and ``commsched.keras`` (Horovod-compatible). The C++
engine is ``commsched._C``.
"""
__version__ = "0.1.0"

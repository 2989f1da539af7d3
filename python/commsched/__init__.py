"""commsched: a communication scheduler for data-parallel training (ByteScheduler line).

Frameworks: ``commsched.torch``, ``commsched.tensorflow`` and ``commsched.keras`` (Horovod-compatible); on Ray,
``commsched.ray`` (Horovod's RayExecutor). The C++ engine is ``commsched._C``.
"""
__version__ = "0.1.0"

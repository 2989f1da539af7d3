"""Horovod elastic training is not supported by commsched: the cluster is fixed at start.

Every name raises NotImplementedError saying what to use instead: restart the job from a checkpoint with
`commsched launch` (a dead worker tears the whole cluster down with a clear error, so a supervisor can restart it).
"""

_INSTEAD = ("horovod elastic training is not supported by commsched (the worker set is fixed at start): save "
            "checkpoints and restart the job with `commsched launch` or torchrun when a worker fails")


def _unsupported(*args, **kwargs):
    del args, kwargs
    raise NotImplementedError(_INSTEAD)


def run(func):
    """Horovod's @hvd.elastic.run decorator: raises NotImplementedError when the decorated function is called."""
    del func
    return _unsupported


class _Unsupported:
    def __init__(self, *args, **kwargs):
        _unsupported()


class State(_Unsupported):
    pass


class ObjectState(_Unsupported):
    pass


class TorchState(_Unsupported):
    pass


class ElasticSampler(_Unsupported):
    pass

"""Horovod elastic training is not supported by commsched: the worker set is fixed at start. Every name raises
NotImplementedError saying what to do instead."""

_INSTEAD = ("horovod elastic training is not supported by commsched (the worker set is fixed at start): save "
            "checkpoints (model.save / tf.train.Checkpoint) and restart the job with `commsched launch` when a "
            "worker fails")


def _unsupported(*args, **kwargs):
    del args, kwargs
    raise NotImplementedError(_INSTEAD)


def run(func):
    """Horovod's @hvd.elastic.run: raises NotImplementedError when the decorated function is called."""
    del func
    return _unsupported


class _Unsupported:
    def __init__(self, *args, **kwargs):
        _unsupported()


class State(_Unsupported):
    pass


class ObjectState(_Unsupported):
    pass


class TensorFlowState(_Unsupported):
    pass


class TensorFlowKerasState(_Unsupported):
    pass


class KerasState(_Unsupported):
    pass


class CommitStateCallback(_Unsupported):
    pass


class UpdateBatchStateCallback(_Unsupported):
    pass


class UpdateEpochStateCallback(_Unsupported):
    pass

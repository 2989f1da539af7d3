"""DistributedOptimizer for Keras 3 (TensorFlow backend): wraps any Keras optimizer so model.fit() trains
data-parallel.

Keras's train step computes every gradient with a tf.GradientTape and hands them to optimizer.apply(); the wrapper
averages them over every worker first (commsched.tensorflow.gradients: one scheduler task per variable, priority from
the model's variable order, the first layers most urgent), then runs the wrapped optimizer's own apply(), so its
math is untouched. The wrapper is the same optimizer object with its class swapped for a subclass that overrides
apply(): its variables, state and learning-rate schedule stay as they were.

Cross-iteration overlap (commsched.torch applies each layer's update just before that layer's next forward) is not
done here: Keras runs the update and the next forward inside one compiled train function per step, with no hook
between layers, so the update cannot be deferred into the next step's forward without changing what that forward
reads. Within a step, communication still overlaps the backward inside tf.function (see gradients.py).
"""
from commsched.tensorflow import gradients, ops


def _make_apply(base):
    def apply(self, grads, trainable_variables=None):
        variables = (list(trainable_variables) if trainable_variables is not None
                     else list(self._trainable_variables))
        settings = self._commsched
        reduced = gradients.reduce_gradients(list(grads), variables, settings["op"], settings["compression"],
                                             settings["gradient_predivide_factor"], prefix="keras.grad")
        return base.apply(self, reduced, trainable_variables)
    return apply


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=ops.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """Horovod's signature. Returns `optimizer` itself, now averaging its gradients over every worker before each
    update. backward_passes_per_step > 1 (local accumulation) is not supported: raise the batch size instead."""
    del name, device_dense, device_sparse, sparse_as_dense, average_aggregated_gradients, num_groups, groups
    del scale_local_gradients
    ops.check_process_set(process_set)
    if backward_passes_per_step != 1:
        raise ValueError(f"backward_passes_per_step={backward_passes_per_step}: commsched.keras reduces every step "
                         "(only 1 is supported; accumulate by raising the batch size)")
    if not hasattr(optimizer, "apply") or not hasattr(optimizer, "get_config"):
        raise TypeError(f"DistributedOptimizer needs a Keras 3 optimizer, got {type(optimizer).__name__}")
    op = ops.resolve_op(None, op)
    base = type(optimizer)
    if not getattr(base, "_commsched_wrapped", False):
        cls = type(base.__name__, (base,), {"apply": _make_apply(base), "_commsched_wrapped": True,
                                            "__module__": base.__module__, "__qualname__": base.__qualname__})
        optimizer.__class__ = cls
    optimizer._commsched = {"op": op, "compression": compression,
                            "gradient_predivide_factor": gradient_predivide_factor}
    return optimizer

"""DistributedOptimizer for Keras 3 (TensorFlow backend): wraps any Keras optimizer so model.fit() trains
data-parallel.

Keras's train step computes every gradient with a tf.GradientTape and hands them to optimizer.apply(); the wrapper
averages them over every worker first (commsched.tensorflow.gradients: one scheduler task per variable, priority from
the model's variable order, the first layers most urgent), then runs the wrapped optimizer's own apply(), so its
math is untouched. The wrapper is the same optimizer object with its class swapped for a subclass that overrides
apply(): its variables, state and learning-rate schedule stay as they were.

Cross-iteration overlap (the default, as in commsched.torch): apply() puts the gradients on the wire and returns;
the next forward applies each variable's update just before reading it (deferred.py says how that stays exact and
where it falls back to waiting in apply()). Within a step, communication overlaps the backward (gradients.py).
"""
import itertools

import keras
import tensorflow as tf

from commsched.keras import deferred
from commsched.tensorflow import gradients, ops


def _make_apply(base):
    def apply(self, grads, trainable_variables=None):
        variables = (list(trainable_variables) if trainable_variables is not None
                     else list(self._trainable_variables))
        settings = self._commsched
        state = settings.get("deferred")
        if state is not None and not settings["local"] and state.covers(variables) and state.hook_is_before():
            with tf.control_dependencies([state.apply_pending()]):  # a no-op when the forward applied them
                return state.defer(grads)
        if state is not None:
            state.deferring = False
            state.apply_pending()  # the synchronous update below must follow the pending one
        reduced = gradients.reduce_shared_gradients(list(grads), variables, settings["local"], settings["scale_local"],
                                                    settings["op"], settings["compression"],
                                                    settings["gradient_predivide_factor"], prefix="keras.grad")
        return base.apply(self, reduced, trainable_variables)
    return apply


def _make_build(base):
    def build(self, variables):
        base.build(self, variables)
        settings = self._commsched
        if settings["cross_iteration"] and settings.get("deferred") is None:
            settings["deferred"] = deferred.DeferredUpdates(self, base, variables, settings)
    return build


def _flush(self):
    """Applies the update still pending from the last step (cross-iteration mode): call it after the last step of a
    custom training loop before reading the weights (Model.fit, get_weights and save do it themselves)."""
    state = self._commsched.get("deferred")
    if state is not None:
        state.apply_pending()


def _register_local_var(self, variable):
    """Horovod's: `variable`'s gradient is not reduced (a worker-local layer), and is divided by size() with
    scale_local_gradients (the default). Register them before the first step: with local variables every update
    waits in apply() (the deferred update of cross-iteration overlap reduces every variable)."""
    self._commsched["local"].add(gradients.variable_key(variable))


def _forget_inflight(self):
    """An elastic job's group broke mid-step: the update still pending is dropped (its gradients were never
    averaged), as commsched.torch's optimizer does."""
    state = self._commsched.get("deferred")
    if state is not None:
        state.forget()


def _cross_iteration_active(self):
    """Whether the last update was deferred to the next forward (cross-iteration overlap in effect)."""
    state = self._commsched.get("deferred")
    return state is not None and state.deferring


_loss_scale_ids = itertools.count()  # one per LossScaleOptimizer, in construction order


def _loss_scale_name(optimizer):
    """The collective name of this LossScaleOptimizer's overflow check: its own, so that two of them in one step (a
    GAN's generator and discriminator) never pair one's check on a rank with the other's on another rank, whatever
    order TensorFlow runs them in. Numbered in construction order (the same on every rank that builds the same
    model); one built before commsched.keras wrapped anything gets its number at its first check."""
    if getattr(optimizer, "_commsched_loss_scale_id", None) is None:
        optimizer._commsched_loss_scale_id = next(_loss_scale_ids)
    return f"keras.loss_scale.{optimizer._commsched_loss_scale_id}.overflowed"


def _numbering_init(init):
    def wrapper(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _loss_scale_name(self)
    wrapper.__wrapped__ = init
    return wrapper


def _agreeing_check_finite(check_finite):
    """LossScaleOptimizer.check_finite over every worker when the optimizer it wraps is distributed (mixed_float16
    wraps the compiled optimizer itself): it decides on each rank's own gradients whether to call the inner apply(),
    where the gradients are averaged, so a rank that alone overflowed would skip the averaging the others wait in.
    Every rank now skips the step when any rank overflowed, as when the averaged gradient is checked."""
    def wrapper(self, grads):
        finite = check_finite(self, grads)
        if not getattr(type(self.inner_optimizer), "_commsched_wrapped", False):
            return finite
        overflowed = ops.allreduce(tf.cast(tf.logical_not(finite), tf.int32), op=ops.Sum,
                                   name=_loss_scale_name(self))
        return tf.equal(overflowed, 0)
    wrapper.__wrapped__ = check_finite
    return wrapper


def _install_loss_scale_agreement():
    lso = keras.optimizers.LossScaleOptimizer
    if not hasattr(lso.check_finite, "__wrapped__"):
        lso.check_finite = _agreeing_check_finite(lso.check_finite)
        lso.__init__ = _numbering_init(lso.__init__)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=ops.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True, cross_iteration=None):
    """Horovod's signature. Returns `optimizer` itself, now averaging its gradients over every worker before each
    update. backward_passes_per_step > 1 is refused: Keras's own gradient_accumulation_steps accumulates locally.
    cross_iteration: defer each update to the next forward (None: COMMSCHED_CROSS_ITERATION, default on)."""
    del name, device_dense, device_sparse, sparse_as_dense, average_aggregated_gradients, num_groups, groups
    ops.check_process_set(process_set)
    if backward_passes_per_step != 1:
        raise ValueError(f"backward_passes_per_step={backward_passes_per_step}: commsched.keras reduces every step "
                         "(only 1 is supported); to accumulate locally give the Keras optimizer "
                         f"gradient_accumulation_steps={backward_passes_per_step} (it applies the mean of the "
                         "accumulated gradients, as average_aggregated_gradients=True does) or raise the batch size")
    if not hasattr(optimizer, "apply") or not hasattr(optimizer, "get_config"):
        raise TypeError(f"DistributedOptimizer needs a Keras 3 optimizer, got {type(optimizer).__name__}")
    op = ops.resolve_op(None, op)
    _install_loss_scale_agreement()
    base = type(optimizer)
    if getattr(base, "_commsched_wrapped", False):
        base = base.__bases__[0]
    else:
        cls = type(base.__name__, (base,), {"apply": _make_apply(base), "build": _make_build(base), "flush": _flush,
                                            "forget_inflight": _forget_inflight,
                                            "cross_iteration_active": _cross_iteration_active,
                                            "register_local_var": _register_local_var,
                                            "_commsched_wrapped": True,
                                            "__module__": base.__module__, "__qualname__": base.__qualname__})
        optimizer.__class__ = cls
    optimizer._commsched = {"op": op, "compression": compression, "local": set(), "scale_local": scale_local_gradients,
                            "gradient_predivide_factor": gradient_predivide_factor,
                            "cross_iteration": deferred.enabled(optimizer, cross_iteration)}
    if optimizer.built and optimizer._commsched["cross_iteration"]:  # a loaded model's optimizer
        optimizer._commsched["deferred"] = deferred.DeferredUpdates(optimizer, base, optimizer._trainable_variables,
                                                                    optimizer._commsched)
    return optimizer


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,
                                sparse_as_dense=False, gradient_predivide_factor=1.0, op=ops.Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False, groups=None,
                                process_set=None, local_layers=None, scale_local_gradients=True):
    """Horovod's: DistributedOptimizer whose local_layers' (a Keras layer or a list of them) trainable weights keep
    their local gradients (register_local_var)."""
    layers = gradients.keras_layers(local_layers, "PartialDistributedOptimizer")
    optimizer = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                     gradient_predivide_factor, op, backward_passes_per_step,
                                     average_aggregated_gradients, 0, groups, process_set, scale_local_gradients)
    for variable in (v for layer in layers for v in layer.trainable_weights):
        optimizer.register_local_var(variable)
    return optimizer

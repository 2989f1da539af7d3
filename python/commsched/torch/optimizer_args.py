"""Horovod's DistributedOptimizer arguments, checked and turned into what the optimizer uses. Each means what it
means in horovod.torch, or raises: none is accepted and ignored.

- process_set=: gradients are averaged over the set's members only, through the set's own Context; a rank outside
  the set is refused (Horovod lets it construct an optimizer that never communicates; here that is an error, so a
  script that forgot a rank does not train it silently alone).
- groups= (an int, or a list of lists of parameters) / num_groups= (Horovod's older name for an int): a group's
  gradients are submitted together, once every member's gradient of the step is ready, as in Horovod. The scheduler
  then partitions and orders them by priority like any other gradients (they are not copied into one buffer); the
  results are the same as without groups.
- sparse_as_dense=: a sparse gradient (nn.Embedding(sparse=True)) is made dense and reduced like any other;
  without it, it takes Horovod's sparse path (indices and values all-gathered, duplicates summed).
- gradient_predivide_factor=: gradients are divided by it before the sum and the sum by size/factor after, as in
  Horovod; only with op=Average (Horovod raises too).
"""
import torch

from commsched.torch import ops, process_sets, runtime


def check_predivide(factor, op):
    if factor <= 0:
        raise ValueError(f"gradient_predivide_factor={factor}: must be > 0")
    if factor != 1.0 and op != ops.Average:
        raise ValueError(f"gradient_predivide_factor={factor} needs op=Average (got op={op!r}), as in Horovod")


def member_set(process_set):
    """The registered ProcessSet to average over; raises on a rank that is not one of its members."""
    ps = process_sets.resolve(process_set)
    if not ps.included():
        raise ValueError(f"DistributedOptimizer(process_set={ps!r}): rank {runtime.rank()} is not a member; only "
                         f"ranks {ps.ranks} may train with this optimizer")
    return ps


def _split(params, n):
    """n contiguous groups, sizes differing by at most one (the first ones larger); empty groups dropped."""
    base, extra = divmod(len(params), n)
    bounds = [i * base + min(i, extra) for i in range(n + 1)]
    return [tuple(params[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def _explicit_groups(groups, params):
    mine = set(params)
    seen = set()
    out = []
    for gi, group in enumerate(groups):
        if not isinstance(group, (list, tuple)):
            raise ValueError(f"groups[{gi}]: expected a list of parameters, got {type(group).__name__}")
        for pi, p in enumerate(group):
            if not isinstance(p, torch.Tensor):
                raise ValueError(f"groups[{gi}][{pi}]: expected a parameter (torch.Tensor), got {type(p).__name__}")
            if p not in mine:
                raise ValueError(f"groups[{gi}][{pi}]: not a parameter of this optimizer that requires grad")
            if p in seen:
                raise ValueError(f"groups[{gi}][{pi}]: the parameter is in more than one group")
            seen.add(p)
        if group:
            out.append(tuple(group))
    return out


def resolve_groups(groups, num_groups, params):
    """{parameter: its group (a tuple)} for Horovod's groups=/num_groups=; parameters in no group are absent."""
    if groups is not None and num_groups:
        raise ValueError("give groups= or num_groups= (its older name), not both")
    if groups is None:
        groups = num_groups
    if isinstance(groups, bool) or not isinstance(groups, (int, list, tuple)):
        raise ValueError(f"groups={groups!r}: expected a non-negative int or a list of lists of parameters")
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError(f"groups={groups}: must be >= 0")
        split = _split(list(params), groups) if groups else []
    else:
        split = _explicit_groups(groups, params)
    return {p: group for group in split for p in group}


def parameter_names(param_groups, named_parameters):
    """Horovod's named_parameters=: each parameter's name (param.I by position when not given); refuses entries
    that are not (name, parameter) pairs, duplicate names and parameters left out."""
    all_params = [p for g in param_groups for p in g["params"]]
    if named_parameters is None:
        return {p: f"param.{i}" for i, p in enumerate(all_params)}
    named = list(named_parameters)
    if any(not (isinstance(t, tuple) and len(t) == 2) for t in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"named_parameters contains duplicate names: {', '.join(dups)}")
    by_param = {p: n for n, p in named}
    unnamed = [i for i, p in enumerate(all_params) if p not in by_param]
    if unnamed:
        raise ValueError(f"the optimizer has {len(unnamed)} parameter(s) missing from named_parameters "
                         f"(positions {unnamed[:5]} in its param groups)")
    return by_param

"""Horovod's helpers for the start of training: broadcast_parameters, broadcast_optimizer_state, broadcast_object."""
import io
import pickle

import torch

from commsched.torch import ops, runtime


def broadcast_parameters(params, root_rank):
    """Copies root_rank's parameters (a state_dict, named_parameters() or a list of (name, tensor)) to every worker."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError("broadcast_parameters: expected a dict or (name, tensor) pairs, got "
                                 f"{type(item).__name__}")
    else:
        raise ValueError(f"broadcast_parameters: invalid params of type {type(params).__name__}")
    handles = []
    for name, p in items:
        if p is None or not torch.is_tensor(p):
            continue
        handles.append(ops.broadcast_async_(p, root_rank, name=f"broadcast.param.{name}"))
    for h in handles:
        ops.synchronize(h)



def broadcast_object(obj, root_rank=0, name=None):
    """Returns root_rank's `obj` (any picklable object) on every worker."""
    name = name or "broadcast_object"
    # Successive broadcasts of the same name are told apart by the engine's per-name round.
    if runtime.rank() == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        payload = buf.getvalue()
        length = torch.tensor([len(payload)], dtype=torch.int64)
    else:
        payload = b""
        length = torch.zeros(1, dtype=torch.int64)
    ops.broadcast_(length, root_rank, name=f"{name}.length")
    n = int(length.item())
    words = (n + 3) // 4
    data = torch.zeros(words, dtype=torch.int32)
    if runtime.rank() == root_rank:
        data.view(torch.uint8)[:n] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    ops.broadcast_(data, root_rank, name=f"{name}.data")
    if runtime.rank() == root_rank:
        return obj
    raw = bytes(data.view(torch.uint8)[:n].numpy())
    try:
        return torch.load(io.BytesIO(raw))
    except (pickle.UnpicklingError, EOFError, RuntimeError) as e:
        raise RuntimeError(f"broadcast_object '{name}': could not decode root {root_rank}'s object: {e}") from e


def allgather_object(obj, name=None, process_set=None):
    """Every member's `obj` (any picklable object), as a list in rank order."""
    from commsched.torch import collectives
    name = ops._auto_name("allgather_object", name, process_set)
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    sizes = collectives.allgather(torch.tensor([payload.numel()], dtype=torch.int64), f"{name}.sizes", process_set)
    data = collectives.allgather(payload, f"{name}.data", process_set)
    out, offset = [], 0
    for r, n in enumerate(sizes.tolist()):
        raw = bytes(data[offset:offset + n].numpy())
        offset += n
        try:
            out.append(torch.load(io.BytesIO(raw)))
        except (pickle.UnpicklingError, EOFError, RuntimeError) as e:
            raise RuntimeError(f"allgather_object '{name}': could not decode rank {r}'s object: {e}") from e
    return out


def broadcast_optimizer_state(optimizer, root_rank):
    """Makes every worker's optimizer state (hyperparameters and per-parameter buffers) equal to root_rank's.

    Unlike Horovod, this does not run a dummy step to create missing state: the root's state_dict is sent whole
    (parameters are not touched), and the others load it.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state: LBFGS is not supported (its state is not per parameter)")
    flush = getattr(optimizer, "flush", None)
    if flush is not None:
        flush()
    state = optimizer.state_dict() if runtime.rank() == root_rank else None
    state = broadcast_object(state, root_rank, name="broadcast.optimizer_state")
    if runtime.rank() != root_rank:
        optimizer.load_state_dict(state)

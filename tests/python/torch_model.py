"""The small model and generated data shared by the torch plugin's tests and their worker script."""
import torch
from torch import nn

IMAGE = 8
CLASSES = 10


def make_model(seed=0, width=4):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, width, 3), nn.ReLU(),
        nn.Conv2d(width, 8, 3), nn.ReLU(), nn.Flatten(),
        nn.Linear(8 * (IMAGE - 4) ** 2, 32), nn.ReLU(),
        nn.Linear(32, CLASSES))


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    raise ValueError(f"unknown optimizer {kind!r}")


def global_batch(step, total):
    """The combined batch of one step: identical on every worker (a generator seeded by the step)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(total, 1, IMAGE, IMAGE, generator=g)
    y = torch.randint(0, CLASSES, (total,), generator=g)
    return x, y


def train_reference(kind, steps, total):
    """Single-process training on the combined batch: what every distributed run must reproduce."""
    model = make_model()
    opt = make_optimizer(kind, model.parameters())
    for step in range(steps):
        x, y = global_batch(step, total)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}

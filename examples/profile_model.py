"""A torch model built from a model profile (workload/profiles/*.json): the profiled model's real gradient tensors, one
module per profiled layer in forward order, and its compute emulated by sleeping (the GIL released) for each
layer's profiled forward and backward time. It trains through the real plugin, launcher and parameter server, so a
2-core machine can show what scheduling does for a ResNet-50- or VGG-16-sized model without computing one."""
import json
import os
import time

import torch
from torch import nn

PROFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workload", "profiles")
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}


def load_profile(name_or_path):
    path = name_or_path if name_or_path.endswith(".json") else os.path.join(PROFILES, name_or_path + ".json")
    with open(path) as f:
        return json.load(f)


class _Compute(torch.autograd.Function):
    """Sleeps for the layer's forward time; in backward, for its backward time, and gives each parameter a
    gradient (a constant tensor, cheap to make, different per step and per worker through grad_out)."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s, *params):
        ctx.backward_s = backward_s
        ctx.shapes = [(p.shape, p.dtype) for p in params]
        time.sleep(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad_out):
        time.sleep(ctx.backward_s)
        g = float(grad_out.mean())
        return (grad_out, None, None) + tuple(torch.full(s, g, dtype=d) for s, d in ctx.shapes)


class ProfiledLayer(nn.Module):
    def __init__(self, tensors, compute_scale):
        super().__init__()
        self.forward_s = compute_scale * sum(t["forward_ms"] for t in tensors) / 1e3
        self.backward_s = compute_scale * sum(t["backward_ms"] for t in tensors) / 1e3
        self.weights = nn.ParameterList(
            nn.Parameter(torch.zeros(t["elements"], dtype=DTYPES[t.get("dtype", "f32")])) for t in tensors)

    def forward(self, x):
        return _Compute.apply(x, self.forward_s, self.backward_s, *self.weights)


class ProfileModel(nn.Sequential):
    """Input: any float tensor (its values drive the gradients); output: the same shape."""

    def __init__(self, profile, compute_scale=1.0):
        layers = {}
        for t in profile["tensors"]:
            layers.setdefault(t["layer"], []).append(t)
        super().__init__(*(ProfiledLayer(layers[k], compute_scale) for k in sorted(layers)))
        self.profile_name = profile["name"]
        self.gradient_bytes = sum(p.numel() * p.element_size() for p in self.parameters())
        self.compute_s = sum(m.forward_s + m.backward_s for m in self)

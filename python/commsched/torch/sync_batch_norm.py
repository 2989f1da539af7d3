"""Horovod's SyncBatchNorm: batch normalization with statistics over the whole global batch.

In training, each rank's per-channel count and sum, then the sum of squared deviations from the global mean, are
summed over every worker with the differentiable allreduce, so autograd produces the synchronized backward pass (the
gradient of those sums is itself summed over the workers). Two passes (mean, then variance around it) instead of
sum-of-squares minus the squared mean keep the variance accurate. In eval mode, or with one worker, it is
torch.nn.BatchNorm with the running statistics.
"""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from commsched.torch import ops, runtime


class SyncBatchNorm(_BatchNorm):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected at least 2D input (N, C, ...), got {input.dim()}D")

    def _momentum(self):
        if self.momentum is not None:
            return self.momentum
        return 1.0 / float(self.num_batches_tracked)  # cumulative moving average, as torch's BatchNorm

    def forward(self, input):
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        if not self.training or runtime.size() == 1:
            use_batch = self.training or not self.track_running_stats
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, use_batch,
                                self._momentum() if self.training else 0.0, self.eps)
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        # Statistics in float32 for half-precision inputs, as torch's BatchNorm keeps them: a float16 count or sum
        # overflows past 65504 (one channel of 8 x 100 x 100 already). On the input's device (CUDA), not the default.
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        local = torch.cat([x.new_full((1,), x.numel() / x.shape[1]), x.sum(dim=dims)])
        first = ops.allreduce(local, op=ops.Sum, name=None)
        count, mean = first[0], first[1:] / first[0]
        centered = x - mean.reshape(shape)
        var = ops.allreduce((centered * centered).sum(dim=dims), op=ops.Sum) / count
        out = centered * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        if self.track_running_stats:
            with torch.no_grad():
                m = self._momentum()
                n = float(count.item())
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(var.detach() * (n / max(n - 1.0, 1.0)), alpha=m)
        return out.to(input.dtype)

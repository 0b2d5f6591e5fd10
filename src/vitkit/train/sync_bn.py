"""BatchNorm with batch statistics shared across the processes of a data-parallel run.

Under DDP each process sees only its share of the global batch. Plain BatchNorm normalises with the
statistics of that share, so a run of N processes trains a different model from one process with the
same global batch: the more processes, the noisier each share's mean and variance. Sharing the
statistics makes the two runs the same computation again, up to the order of floating-point sums.

On CUDA torch's ``nn.SyncBatchNorm`` does this. It refuses CPU tensors, so CPU runs (gloo) use
``AllReduceBatchNorm2d``: each process computes its per-channel count, mean and sum of squared
deviations, one differentiable all-reduce combines them into the global mean and variance, and the
backward pass all-reduces their gradients the same way. Outside training it is plain BatchNorm2d.

Either module keeps BatchNorm2d's parameters, buffers and state_dict keys (the same tensors, so the
optimizer and the EMA built before the swap hold them still): checkpoints are ordinary vitkit
checkpoints, and ``vitkit.load`` gives a model with plain BatchNorm2d.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .distributed import check_served


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.BatchNorm2d) for m in model.modules())


def wants_sync_bn(setting: bool | None, model: nn.Module, processes: int, device: torch.device) -> bool:
    """Whether a run shares BatchNorm statistics: ``setting`` (RunConfig.sync_bn) where there is something
    to share (several processes, a model with BatchNorm). None: on CUDA only. On the CPU the extra
    all-reduces cost the demo 27% more CPU time per step for no accuracy (98.85% against 98.90%)."""
    if processes < 2 or not has_batchnorm(model):
        return False
    return device.type == "cuda" if setting is None else setting


class SumAcrossProcesses(torch.autograd.Function):
    """A differentiable all-reduce (sum): every process's loss depends on every process's share of the
    sum, so the gradient of a share is the sum of the gradients of the total, all-reduced in turn."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        out = grad.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out


class AllReduceBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training-mode statistics are those of the batch across all processes.

    The per-process statistics are taken in float32 (``var_mean``, numerically stable) and combined in
    float64: with per-process counts n_i, means m_i and sums of squared deviations M2_i, the all-reduced
    sums n = sum n_i, S = sum n_i m_i and Q = sum (M2_i + n_i m_i^2) give mean = S / n and the biased
    variance Q / n - mean^2, as one process holding the whole batch would compute them. The running
    statistics follow BatchNorm2d: the unbiased variance, ``momentum`` (None: a cumulative average).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        self._check_input_dim(x)
        n, mean, var = self.global_moments(x)
        if self.track_running_stats:
            self.update_running_stats(n, mean, var)
        scale = torch.rsqrt(var + self.eps)
        shift = -mean * scale
        if self.affine:
            scale, shift = scale * self.weight, shift * self.weight + self.bias
        return (x.float() * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)).to(x.dtype)

    @staticmethod
    def global_moments(x: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        """The element count per channel, mean and biased variance (float32) of ``x`` across all processes."""
        local_n = x.numel() // x.shape[1]
        var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
        m64 = mean.double()
        local = torch.cat([local_n * m64, local_n * (var.double() + m64 * m64),
                           torch.tensor([float(local_n)], dtype=torch.float64, device=x.device)])
        check_served(local, "all_reduce")
        total = SumAcrossProcesses.apply(local)
        c = x.shape[1]
        n = total[-1].item()
        g_mean = total[:c] / n
        g_var = (total[c:2 * c] / n - g_mean * g_mean).clamp_min(0)
        return int(n), g_mean.float(), g_var.float()

    @torch.no_grad()
    def update_running_stats(self, n: int, mean: torch.Tensor, var: torch.Tensor) -> None:
        """BatchNorm's update: running = (1 - momentum) * running + momentum * batch, unbiased variance."""
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * (n / max(n - 1, 1))
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)


def convert_batchnorm(module: nn.Module) -> nn.Module:
    """``module`` with every BatchNorm2d (itself included) replaced by an ``AllReduceBatchNorm2d`` that
    holds the same parameters and buffers; converted in place below the root, as
    ``nn.SyncBatchNorm.convert_sync_batchnorm`` does. Returns the root (new if it was a BatchNorm2d)."""
    if type(module) is nn.BatchNorm2d:
        out = AllReduceBatchNorm2d(module.num_features, module.eps, module.momentum, module.affine,
                                   module.track_running_stats, device="meta")  # its own tensors replaced below
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            setattr(out, name, getattr(module, name))  # the same tensors, under the same keys
        out.train(module.training)
        return out
    for name, child in module.named_children():
        new = convert_batchnorm(child)
        if new is not child:
            setattr(module, name, new)
    return module


def sync_batchnorm(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` with its BatchNorm statistics shared across the process group: ``nn.SyncBatchNorm`` on
    CUDA, ``AllReduceBatchNorm2d`` elsewhere. Converted in place below the root; returns the root."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return convert_batchnorm(model)


__all__ = ["AllReduceBatchNorm2d", "SumAcrossProcesses", "convert_batchnorm", "sync_batchnorm", "wants_sync_bn", "has_batchnorm"]

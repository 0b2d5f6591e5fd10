"""Optimizer (AdamW, SGD or Lion) with parameter groups: no weight decay on biases, norms, position embeddings and the
class token, and optional layer-wise learning-rate decay (BEiT / MAE fine-tuning).

Each group carries ``lr_scale``; the schedule sets ``group["lr"] = lr(step) * group["lr_scale"]``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..io.checkpoint import unwrap
from .config import OptimConfig


def layer_id(name: str, depth: int) -> int:
    """Depth index of a parameter for layer-wise decay: the stem and embeddings 0, block i -> i + 1,
    everything after the blocks (final norm, head) depth + 1."""
    if name.startswith(("patch_embed.", "cls_token", "pos_embed", "reg_token")):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return depth + 1


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """Parameter groups keyed by (decay or not, layer); each has ``weight_decay`` and ``lr_scale``."""
    model = unwrap(model)
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    depth = len(getattr(model, "blocks", []))
    groups: dict[tuple[bool, int], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or name in skip or name.endswith(".bias")
        lid = layer_id(name, depth) if layer_decay is not None else 0
        scale = layer_decay ** (depth + 1 - lid) if layer_decay is not None else 1.0
        key = (no_decay, lid)
        if key not in groups:
            groups[key] = dict(params=[], names=[], weight_decay=0.0 if no_decay else weight_decay, lr_scale=scale)
        groups[key]["params"].append(p)
        groups[key]["names"].append(name)
    return [groups[k] for k in sorted(groups)]


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): each step moves every
    weight by lr times the sign of an interpolation of its momentum and gradient, with decoupled weight
    decay; one state tensor per parameter (AdamW keeps two).

        update = sign(beta1 * m + (1 - beta1) * g);  p -= lr * (update + weight_decay * p)
        m = beta2 * m + (1 - beta2) * g
    """

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
                m.lerp_(p.grad, 1 - beta2)  # m = beta2 * m + (1 - beta2) * g
        return loss


def build_optimizer(model: nn.Module, cfg: OptimConfig, device_type: str = "cpu") -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay)
    for g in groups:
        g["lr"] = cfg.lr * g["lr_scale"]
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if cfg.name == "lion":
        return Lion(groups, lr=cfg.lr, betas=cfg.betas)
    # foreach kernels: one launch for all tensors of a group (the default on CUDA; faster on CPU too)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, foreach=True)


@torch.no_grad()
def follow_param_layout(optimizer: torch.optim.Optimizer) -> None:
    """Lay each per-parameter state tensor (AdamW's moments, Lion's and SGD's momentum) out in memory as its
    parameter is. A state created by a step follows its parameter's layout (channels-last conv weights give
    channels-last moments), but one loaded from trainer.pt, which holds contiguous tensors, does not: laid
    out again, a resumed run computes its steps exactly as the run it continues."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if torch.is_tensor(value) and value.shape == p.shape and value.stride() != p.stride():
                    state[key] = torch.empty_like(p, dtype=value.dtype).copy_(value)


__all__ = ["param_groups", "build_optimizer", "layer_id", "Lion", "follow_param_layout"]

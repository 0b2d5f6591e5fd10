"""Optimizer (AdamW, Adam, SGD, Lion, or Muon for the blocks' matrices with AdamW for the rest) with parameter groups: no weight decay on biases, norms, position embeddings and the
class token, and optional layer-wise learning-rate decay (BEiT / MAE fine-tuning).

Each group carries ``lr_scale``; the schedule sets ``group["lr"] = lr(step) * group["lr_scale"]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None,
                 bn_lr_scale: float = 1.0) -> list[dict]:
    """Parameter groups keyed by (decay or not, layer, BatchNorm or not); each has ``weight_decay``, ``lr_scale``
    and ``decay`` (whether its parameters are of the kind weight decay applies to: weights, not biases, norms or
    embeddings, whatever ``weight_decay`` is, 0 included). ``bn_lr_scale`` multiplies the BatchNorm layers'
    ``lr_scale`` (OptimConfig.bn_lr_scale)."""
    model = unwrap(model)
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    depth = len(getattr(model, "blocks", []))
    bn = {f"{mn}.{pn}" for mn, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
          for pn, _ in m.named_parameters(recurse=False)} if bn_lr_scale != 1.0 else set()
    groups: dict[tuple[bool, int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or name in skip or name.endswith(".bias")
        lid = layer_id(name, depth) if layer_decay is not None else 0
        scale = layer_decay ** (depth + 1 - lid) if layer_decay is not None else 1.0
        scale = scale * bn_lr_scale if name in bn else scale
        key = (no_decay, lid, name in bn)
        if key not in groups:
            groups[key] = dict(params=[], names=[], weight_decay=0.0 if no_decay else weight_decay, lr_scale=scale,
                               decay=not no_decay)
        groups[key]["params"].append(p)
        groups[key]["names"].append(name)
    return [groups[k] for k in sorted(groups)]


class _PerParameter(torch.optim.Optimizer):
    """An optimizer whose step updates each parameter that has a gradient on its own (``update``)."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.update(p, group)
        self.finish()
        return loss

    def update(self, p: torch.Tensor, group: dict) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """What the step does once every parameter's ``update`` has run (nothing, unless overridden)."""


class Lion(_PerParameter):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): each step moves every
    weight by lr times the sign of an interpolation of its momentum and gradient, with decoupled weight
    decay; one state tensor per parameter (AdamW keeps two).

        update = sign(beta1 * m + (1 - beta1) * g);  p -= lr * (update + weight_decay * p)
        m = beta2 * m + (1 - beta2) * g
    """

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    def update(self, p: torch.Tensor, group: dict) -> None:
        beta1, beta2 = group["betas"]
        state = self.state[p]
        if not state:
            state["exp_avg"] = torch.zeros_like(p)
        m = state["exp_avg"]
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(torch.sign(m * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
        m.lerp_(p.grad, 1 - beta2)  # m = beta2 * m + (1 - beta2) * g


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic Newton-Schulz iteration of Muon (Jordan et al. 2024)


def orthogonalize(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32, eps: float = 1e-7) -> torch.Tensor:
    """An approximate orthogonalisation of the matrix ``g`` (U S' V^T with S' near 1 where g = U S V^T): the
    quintic Newton-Schulz iteration, in ``dtype`` (float32 on a CPU, where bf16 matmuls may be slower)."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(g.dtype)


class MuonAdamW(_PerParameter):
    """Muon (Jordan et al. 2024) for the parameter groups marked ``muon`` (the blocks' weight matrices, and
    with ``optim.muon_convs`` the stem's conv filters, flattened), AdamW for the others (embeddings, norms,
    biases, the head), in one optimizer, so that the schedule,
    checkpoints and resume treat it as any other.

    Muon: momentum m = mu * m + (1 - mu) * g; the Nesterov update g + mu * (m - g) orthogonalised
    (``orthogonalize``) and scaled by 0.2 * sqrt(max(rows, cols)), so that its RMS matches AdamW's (Liu et al.
    2025, "Muon is scalable"): both kinds take the same learning rate and decoupled weight decay. Data-parallel
    processes share the orthogonalisations out between them (``share_work``).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 momentum: float = 0.95, ns_steps: int = 5, ns_dtype: torch.dtype = torch.float32):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0, momentum=momentum,
                                      ns_steps=ns_steps, muon=False))
        self.ns_dtype = ns_dtype
        self.rank, self.world, self.sum = 0, 1, None  # one process orthogonalises every matrix (share_work)
        self.pending: list[tuple[torch.Tensor, dict]] = []  # the step's Muon parameters, until ``finish``

    def share_work(self, rank: int, world: int, sum_: Callable[[torch.Tensor], object]) -> None:
        """Split the orthogonalisations between ``world`` processes whose gradients are the same (data-parallel,
        after their all-reduce): this one (``rank``) computes its share of the matrices' updates, and ``sum_``
        (an in-place all-reduce sum over the processes) gives every process all of them, each computed once.
        The updates are those one process computes alone, bit for bit (every other process adds zeros)."""
        self.rank, self.world, self.sum = rank, world, sum_

    def update(self, p: torch.Tensor, group: dict) -> None:
        if group["muon"]:
            self.pending.append((p, group))  # all of the step's matrices together, in ``finish``
        else:
            self._adamw(p, group)

    def finish(self) -> None:
        pairs, self.pending = self.pending, []
        if pairs:
            self._muon(pairs)

    def _muon(self, pairs: list[tuple[torch.Tensor, dict]]) -> None:
        """Muon's step for these (parameter, group) pairs: each process its share of the orthogonalisations
        (``owners``), then the updates summed over the processes, when the work is shared."""
        shapes = [matrix_shape(p) for p, _ in pairs]
        owner = owners(shapes, self.world)
        updates = []
        for (p, group), who in zip(pairs, owner):
            state = self.state[p]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf, mu = state["momentum_buffer"], group["momentum"]
            buf.lerp_(p.grad, 1 - mu)
            if who == self.rank:
                matrix = p.grad.lerp(buf, mu).flatten(1)  # a conv's filters as (out, in * kh * kw)
                updates.append(orthogonalize(matrix, group["ns_steps"], self.ns_dtype).reshape(-1))
            else:
                updates.append(torch.zeros(p.numel(), dtype=p.dtype, device=p.device))
        if self.world > 1:
            flat = torch.cat(updates)
            self.sum(flat)
            updates = list(flat.split([p.numel() for p, _ in pairs]))
        for (p, group), update, (rows, cols) in zip(pairs, updates, shapes):
            p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(update.view(p.shape), alpha=-group["lr"] * 0.2 * math.sqrt(max(rows, cols)))

    def _adamw(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state.update(step=torch.zeros(()), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        state["step"] += 1
        t = state["step"].item()
        (b1, b2), m, v = group["betas"], state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(p.grad, 1 - b1)
        v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
        denom = (v / (1 - b2 ** t)).sqrt_().add_(group["eps"])
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.addcdiv_(m, denom, value=-group["lr"] / (1 - b1 ** t))


def matrix_shape(p: torch.Tensor) -> tuple[int, int]:
    """(rows, cols) of ``p`` as Muon orthogonalises it, a conv's filters as (out, in * kh * kw), without the copy
    that flattening a channels-last tensor makes."""
    return p.shape[0], p.numel() // max(p.shape[0], 1)


def owners(shapes: list[tuple[int, int]], world: int) -> list[int]:
    """Which of ``world`` processes orthogonalises each matrix of these shapes: the largest first, each to the
    process with the least work so far (a Newton-Schulz iteration of an (m, n) matrix costs about
    min(m, n)^2 * max(m, n)); the same answer on every process."""
    load = [0] * world
    out = [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda k: (-min(shapes[k]) ** 2 * max(shapes[k]), k)):
        out[i] = min(range(world), key=lambda r: (load[r], r))
        load[out[i]] += min(shapes[i]) ** 2 * max(shapes[i])
    return out


def muon_groups(groups: list[dict], convs: bool = False) -> list[dict]:
    """``groups`` (``param_groups``') with the blocks' weight matrices (2-D, of a ``decay`` group) split off into
    groups marked ``muon``; ``convs``: the conv filters (4-D, of a ``decay`` group: the stem's, each as an
    (out, in * kh * kw) matrix) too. Which they are does not depend on the weight decay's value: at 0 they still
    take Muon."""
    out = []
    for g in groups:
        pairs = list(zip(g["names"], g["params"]))
        matrix = {n for n, p in pairs if g["decay"]
                  and ((n.startswith("blocks.") and p.ndim == 2) or (convs and p.ndim == 4))}
        muon = [(n, p) for n, p in pairs if n in matrix]
        rest = [(n, p) for n, p in pairs if n not in matrix]
        for part, flag in ((rest, False), (muon, True)):
            if part:
                out.append({**g, "names": [n for n, _ in part], "params": [p for _, p in part], "muon": flag})
    return out


def build_optimizer(model: nn.Module, cfg: OptimConfig, device_type: str = "cpu") -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay, cfg.bn_lr_scale)
    for g in groups:
        g["lr"] = cfg.lr * g["lr_scale"]
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if cfg.name == "adam":  # weight decay as an L2 term in the gradient, per group (none on biases and norms)
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, foreach=True)
    if cfg.name == "lion":
        return Lion(groups, lr=cfg.lr, betas=cfg.betas)
    if cfg.name == "muon":
        ns_dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
        return MuonAdamW(muon_groups(groups, cfg.muon_convs), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, momentum=cfg.muon_momentum,
                         ns_dtype=ns_dtype)
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


__all__ = ["param_groups", "build_optimizer", "layer_id", "Lion", "MuonAdamW", "muon_groups", "orthogonalize",
           "follow_param_layout", "owners", "matrix_shape"]

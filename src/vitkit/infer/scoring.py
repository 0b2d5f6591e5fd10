"""Scoring a classifier batch by batch: the running totals of its loss and hits (``Tally``), which the
training run's validation and ``vitkit eval`` share."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class Tally:
    """Running totals over the batches: the loss and top-1 hits; with ``confusion`` also the confusion
    matrix; with ``detail`` that, the top-k hits and every mistake (its probability, dataset index and
    predicted class)."""

    num_classes: int
    detail: bool = False
    confusion: bool = False
    n: int = 0
    loss_sum: float = 0.0
    top1: int = 0
    top5: int = 0
    conf: torch.Tensor = field(init=False)  # (K, K) counts, rows: true class, columns: predicted
    wrong_prob: list = field(default_factory=list)
    wrong_idx: list = field(default_factory=list)
    wrong_pred: list = field(default_factory=list)

    def __post_init__(self):
        self.conf = torch.zeros(self.num_classes, self.num_classes, dtype=torch.long)

    @property
    def k5(self) -> int:
        """The "top-5" k: min(5, classes)."""
        return min(5, self.num_classes)

    def add(self, logits: torch.Tensor, y: torch.Tensor, idx: torch.Tensor | None = None) -> None:
        """Count one batch: float logits (B, K), labels ``y`` and (with ``detail``) the dataset indices ``idx``
        of the batch's images."""
        self.loss_sum += float(F.cross_entropy(logits, y.to(logits.device), reduction="sum"))
        self.n += len(y)
        if not self.detail:
            pred = logits.argmax(-1)
            self.top1 += int((pred == y.to(logits.device)).sum())
            if self.confusion:
                K = self.num_classes
                self.conf += torch.bincount((y.cpu() * K + pred.cpu()), minlength=K * K).reshape(K, K)
            return
        K = self.num_classes
        y = y.cpu()
        probs = logits.softmax(-1).cpu()
        top = probs.topk(self.k5, dim=-1).indices
        pred = top[:, 0]
        self.top1 += int((pred == y).sum())
        self.top5 += int((top == y[:, None]).any(1).sum())
        self.conf += torch.bincount(y * K + pred, minlength=K * K).reshape(K, K)
        bad = pred != y
        self.wrong_prob.append(probs[bad].gather(1, pred[bad][:, None])[:, 0])
        self.wrong_idx.append(idx[bad])
        self.wrong_pred.append(pred[bad])

    def sums(self) -> torch.Tensor:
        """(loss sum, top-1 hits, images) as float64, to add up over processes."""
        return torch.tensor([self.loss_sum, self.top1, self.n], dtype=torch.float64)


__all__ = ["Tally"]

"""The Transformer's position-wise MLP: Linear -> activation -> dropout -> Linear -> dropout."""

from __future__ import annotations

from torch import nn

ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),  # exact (erf) GELU, as the paper and timm
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
}


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str = "gelu", drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = ACTIVATIONS[act]()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

"""The demo: a small model trained on the built-in digits, shipped in the package, reading test digits.

``DEMO_MODEL`` is a vitkit checkpoint (``data/demo/model``: vitkit.json + vitkit.safetensors) of
``vit_hybrid_mini_patch4_28`` (0.13M parameters) that ``vitkit train --max-minutes 2`` trained on the
8,000 training digits of the demo set; ``demo`` draws test digits it never saw in the terminal, in
shades of ASCII, each beside the model's top-3.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.datasets import DEMO_DIR, open_dataset
from ..data.images import to_model_input
from ..io.checkpoint import load

DEMO_MODEL = DEMO_DIR / "model"
SHADES = " .:-=+*#%@"  # dark to bright: one character a cell


def load_demo_model(path: str | Path = DEMO_MODEL):
    """The shipped demo model, in eval mode on the CPU."""
    return load(path)


def demo_digits(n: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Test digits ``start`` .. ``start + n`` of the built-in demo set: uint8 (n, 1, 28, 28) and labels (n,)."""
    test = open_dataset(None, val_fraction=0).test
    idx = torch.arange(start, min(start + n, len(test)))
    return test.get_batch(idx)


@torch.no_grad()
def classify(model, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """Class probabilities (n, classes) of uint8 images (n, C, H, W), by the model's own preprocessing."""
    out = []
    for chunk in images.split(batch):
        x = torch.stack([to_model_input(img, model.cfg.img_size, model.preprocess) for img in chunk])
        out.append(model(x).softmax(-1))
    return torch.cat(out)


def ascii_art(image: torch.Tensor) -> list[str]:
    """A uint8 (1, H, W) image as H/2 lines of W characters (two rows a line: a terminal cell is about
    twice as tall as wide), brighter pixels as denser characters."""
    x = image.float().mean(0)  # (H, W), grey
    if x.shape[0] % 2:
        x = torch.cat([x, x[-1:]])
    x = (x[0::2] + x[1::2]) / 2  # (H/2, W)
    levels = (x / 256 * len(SHADES)).long().clamp(0, len(SHADES) - 1)
    return ["".join(SHADES[int(v)] for v in row).rstrip() for row in levels]


def describe(image: torch.Tensor, label: str, probs: torch.Tensor, names: list[str]) -> list[str]:
    """One digit: its drawing, and beside it the true label and the model's top-3."""
    top = probs.topk(min(3, probs.numel()))
    side = [f"true: {label}"] + [f"{names[int(i)]:>6} {p:6.1%}" for p, i in zip(top.values.tolist(),
                                                                                 top.indices.tolist())]
    art = ascii_art(image)
    while len(art) > len(side) and not art[0].strip():  # the blank rows above and below the digit
        art = art[1:]
    while len(art) > len(side) and not art[-1].strip():
        art = art[:-1]
    width = max(len(line) for line in art)
    pad = (len(art) - len(side)) // 2
    side = [""] * pad + side
    return [f"{line:<{width}}   {side[i] if i < len(side) else ''}".rstrip() for i, line in enumerate(art)]


def demo(n: int = 3, start: int = 0, model=None) -> list[str]:
    """The lines ``vitkit demo`` prints: ``n`` test digits from ``start``, each drawn with its top-3."""
    model = load_demo_model() if model is None else model
    images, labels = demo_digits(n, start)
    probs = classify(model, images)
    names = model.labels or [str(i) for i in range(probs.shape[1])]
    lines = [f"A {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M-parameter ViT, trained for 2 minutes on "
             f"the built-in digits, reads {len(images)} test digit{'s' if len(images) > 1 else ''} it never saw:", ""]
    for img, y, p in zip(images, labels.tolist(), probs):
        lines += describe(img, names[y], p, names) + [""]
    lines.append("Train your own: `vitkit train` (the demo digits, a few minutes on a CPU), "
                 "or `vitkit train --data FOLDER` on your images.")
    return lines

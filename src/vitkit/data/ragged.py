"""Images of different sizes held in memory: one flat uint8 buffer and each image's shape.

A folder of photos decoded at a short side (``decode_array(..., short_side=S)``) keeps every image's
aspect ratio, so the images cannot share one (N, C, H, W) tensor. ``RaggedImages`` stores them back to
back, channels first: image i is ``pixels[offsets[i]:offsets[i + 1]]`` viewed as (C, h_i, w_i). Taking
images is a view per image (no copy); a subset or a join copies the pixels once.
"""

from __future__ import annotations

import numpy as np
import torch


class RaggedImages:
    """``len(shapes)`` uint8 images: ``pixels`` (flat) and ``shapes`` int64 (N, 3) of (C, h, w)."""

    def __init__(self, pixels: torch.Tensor, shapes: torch.Tensor):
        self.pixels = pixels.reshape(-1)
        self.shapes = shapes.to(torch.int64).reshape(-1, 3)
        counts = self.shapes.prod(1)
        self.offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=self.offsets[1:])
        if int(self.offsets[-1]) != self.pixels.numel():
            raise ValueError(f"RaggedImages: shapes hold {int(self.offsets[-1])} pixels, the buffer {self.pixels.numel()}")

    @classmethod
    def from_arrays(cls, arrays: list[np.ndarray]) -> "RaggedImages":
        """uint8 (h, w, C) arrays (as ``decode_array`` returns them) -> one channels-first store."""
        shapes = torch.tensor([(a.shape[2], a.shape[0], a.shape[1]) for a in arrays], dtype=torch.int64)
        pixels = torch.empty(int(shapes.prod(1).sum()), dtype=torch.uint8)
        at = 0
        for a in arrays:
            n = a.size
            pixels[at : at + n].view(a.shape[2], a.shape[0], a.shape[1]).copy_(torch.from_numpy(a).permute(2, 0, 1))
            at += n
        return cls(pixels, shapes)

    def __len__(self) -> int:
        return int(self.shapes.shape[0])

    def __getitem__(self, i: int) -> torch.Tensor:
        """Image i as a uint8 (C, h, w) view."""
        c, h, w = self.shapes[i].tolist()
        start = int(self.offsets[i])
        return self.pixels[start : start + c * h * w].view(c, h, w)

    def take(self, idx) -> list[torch.Tensor]:
        """Images ``idx`` as a list of (C, h, w) views."""
        return [self[int(i)] for i in torch.as_tensor(idx).reshape(-1)]

    def subset(self, idx) -> "RaggedImages":
        """A new store of the images ``idx`` (in that order; pixels copied)."""
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        parts = self.take(idx)
        pixels = torch.cat([p.reshape(-1) for p in parts]) if parts else torch.empty(0, dtype=torch.uint8)
        return RaggedImages(pixels, self.shapes[idx].clone())

    @staticmethod
    def join(parts: list["RaggedImages"]) -> "RaggedImages":
        """One store of ``parts`` in turn."""
        return RaggedImages(torch.cat([p.pixels for p in parts]), torch.cat([p.shapes for p in parts]))

    @property
    def nbytes(self) -> int:
        return self.pixels.numel()

    def __repr__(self) -> str:
        return f"RaggedImages({len(self)} images, {self.nbytes / 2**20:.1f} MiB)"


__all__ = ["RaggedImages"]

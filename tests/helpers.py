"""What the tests share: tiny models, random weights, a logits comparison, tiny datasets and images.

Test files import these by name (``from helpers import tiny_model``). tests/ is not a package, so pytest
puts it on ``sys.path`` (its default "prepend" import mode) and the module imports as ``helpers``; the
scripts some tests start in a subprocess put it there themselves. Fixtures (per-test setup and teardown)
live in conftest.py; plain functions live here, where a subprocess can import them too.

Everything is small, seeded and offline: a model builds and runs in milliseconds on one CPU thread,
and the same call gives the same tensors, images and files every time.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

import vitkit
from vitkit import ViTConfig, VisionTransformer
from vitkit.data import DataSplits, ImageSet
from vitkit.train import RunConfig

# ================================================================================================ models
TINY_MODEL = "vit_test"  # 32x32 RGB, patch 8, width 32, depth 2, 2 heads, MLP 64, 10 classes


def tiny_model(name: str = TINY_MODEL, *, seed: int = 0, head_std: float | None = None,
               head_seed: int | None = None, labels: Sequence[str] | None = None, **overrides) -> VisionTransformer:
    """A named model with config fields overridden, initialised from ``seed`` as ``vitkit.create_model``
    does (torch's global RNG is left as it was), in eval mode.

    The paper's zero-initialised head makes every logit 0: ``head_std`` fills the head's weight from
    N(0, head_std) (a generator seeded ``head_seed``, else ``seed``), so that outputs tell inputs apart.
    ``labels`` become the model's class names (saved with it).
    """
    model = vitkit.create_model(name, seed=seed, **overrides)
    if head_std is not None and isinstance(model.head, torch.nn.Linear):
        g = torch.Generator().manual_seed(seed if head_seed is None else head_seed)
        with torch.no_grad():
            model.head.weight.normal_(0, head_std, generator=g)
    if labels is not None:
        model.labels = list(labels)
    return model.eval()


def _is_scale(module: torch.nn.Module, name: str) -> bool:
    """A multiplicative parameter or buffer whose natural value is 1: a norm layer's weight or running
    variance, a LayerScale (timm and vitkit name it ``gamma``)."""
    norms = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)
    return name == "gamma" or (isinstance(module, norms) and name in ("weight", "running_var"))


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter, then every floating-point buffer, from one generator seeded ``seed``:
    scales (norm weights, running variances, LayerScale) around 1 (1 + 0.1 N(0, 1)), the rest 0.2 N(0, 1).

    Nothing keeps its initial value, so a zero-initialised head or class token, a swapped key or a
    missing transpose changes the logits. Works on any torch module (vitkit, timm, transformers). Returns
    the model in eval mode.
    """
    g = torch.Generator().manual_seed(seed)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for full_name, t in tensors:
        if not t.is_floating_point():
            continue  # e.g. BatchNorm's num_batches_tracked
        owner, _, name = full_name.rpartition(".")
        r = torch.randn(t.shape, generator=g)
        t.copy_(1 + 0.1 * r if _is_scale(model.get_submodule(owner), name) else 0.2 * r)
    return model.eval()


def random_model(name: str = TINY_MODEL, *, seed: int = 0, **overrides) -> VisionTransformer:
    """``tiny_model(name, **overrides)`` with every weight random (``randomize(model, seed)``)."""
    return randomize(tiny_model(name, seed=seed, **overrides), seed)


# ================================================================================= comparing outputs
def run_docs_lines(tmp_path: Path, dest: str, to: str, lines: Sequence[str]) -> tuple[VisionTransformer, dict]:
    """A vit_tiny_patch16_224 (10 classes, random weights) saved as run/best in ``tmp_path`` (the working
    folder), converted by `vitkit convert run/best DEST --to TO`, then ``lines`` run there, which
    docs/convert.md and the README must show as they are: (the vitkit model, the namespace the lines ran in)."""
    from vitkit.cli.main import main

    model = randomize(vitkit.create_model("vit_tiny_patch16_224", num_classes=10), seed=4)
    vitkit.save(model, tmp_path / "run" / "best")
    assert main(["convert", "run/best", dest, "--to", to]) == 0
    code = "\n".join(lines)
    root = Path(__file__).resolve().parents[1]
    for doc in (root / "docs" / "convert.md", root / "README.md"):  # the lines both show
        assert code in doc.read_text(), doc
    scope: dict = {}
    exec(code, scope)
    return model, scope


def random_images(cfg: ViTConfig, n: int = 2, seed: int = 1) -> torch.Tensor:
    """A float batch (n, C, H, W) of N(0, 1) values that fits ``cfg``, from a generator seeded ``seed``."""
    return torch.randn(n, cfg.in_chans, *cfg.img_size, generator=torch.Generator().manual_seed(seed))


Output = torch.Tensor | Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def assert_same_logits(a: Output, b: Output, x: torch.Tensor | None = None, *, tol: float = 0.0) -> float:
    """Assert that two outputs agree within ``tol`` (max abs difference); return that difference.

    ``a`` and ``b`` are tensors, or models (any callable) run on ``x``; without ``x`` the input is
    ``random_images`` of ``a``'s config. ``tol=0`` (the default) asks for bitwise equality
    (``torch.equal``): a conversion that only moves weights must give exactly the same numbers.
    """
    if x is None and not isinstance(a, torch.Tensor):
        x = random_images(a.cfg)
    ya = a if isinstance(a, torch.Tensor) else a(x)
    yb = b if isinstance(b, torch.Tensor) else b(x)
    assert ya.shape == yb.shape, f"shapes differ: {tuple(ya.shape)} vs {tuple(yb.shape)}"
    diff = (ya - yb).abs().max().item()
    if tol == 0:
        assert torch.equal(ya, yb), f"not bitwise equal: max abs diff {diff}"
    else:
        assert diff <= tol, f"max abs diff {diff} > {tol}"
    return diff


def run_weights(run: str | os.PathLike, name: str = "last") -> dict[str, torch.Tensor]:
    """The weights of a run directory's checkpoint ``name`` (last/ by default)."""
    return load_file(Path(run) / name / "vitkit.safetensors")


def assert_same_weights(a: str | os.PathLike, b: str | os.PathLike) -> None:
    """Two run directories end with bitwise equal weights in last/ (same keys, ``torch.equal`` values)."""
    wa, wb = run_weights(a), run_weights(b)
    assert wa.keys() == wb.keys()
    bad = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not bad, f"{len(bad)} tensors differ, e.g. {bad[:3]}"


def step_losses(run: str | os.PathLike) -> list[float]:
    """The loss of every training step a run logged in metrics.jsonl, in order."""
    rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["type"] == "step"]


# the fields of metrics.jsonl records that time the run (or name its directory, or say whether the
# decoded-image cache served its data): all that may differ between a run and its replay
TIMING_FIELDS = frozenset({"seconds", "img_per_s", "train_seconds", "total_seconds", "cpu_seconds", "run_dir",
                           "data_seconds", "data_cache", "end_seconds", "end_estimate_seconds"})


def timeless_records(run: str | os.PathLike) -> list[dict]:
    """A run's metrics.jsonl records without their ``TIMING_FIELDS``."""
    rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]


def same_files(a: str | os.PathLike, b: str | os.PathLike, name: str) -> bool:
    """Whether two run directories' checkpoint ``name`` hold byte-equal vitkit.safetensors files."""
    return (Path(a) / name / "vitkit.safetensors").read_bytes() == (Path(b) / name / "vitkit.safetensors").read_bytes()


# ============================================================================================ training
# A run of vit_test on tiny_splits(): 32 training images, batch 8, two epochs (8 steps) on one CPU thread.
TINY_RUN = dict(model=TINY_MODEL, epochs=2, plots=False, batch_size=8, log_every=1, precision="fp32", device="cpu",
                augment=dict(crop="pad", pad=2, hflip=0.5, label_smoothing=0.1),
                optim=dict(lr=3e-3), schedule=dict(warmup_steps=2, warmup_fraction=0.0))

# `vitkit train` flags for a tiny run on an image_folder(): vit_test, batch 8, one thread, fp32 on the CPU
FAST_TRAIN_ARGS = ["--model", TINY_MODEL, "--batch-size", "8", "--threads", "1", "--quiet", "--device", "cpu",
                   "--precision", "fp32", "--set", "plots=false"]


def tiny_run_config(**overrides) -> RunConfig:
    """``TINY_RUN`` with top-level fields replaced (a whole section, such as ``augment``, at a time)."""
    return RunConfig.from_dict({**TINY_RUN, **overrides})


def free_port() -> int:
    """A TCP port of this machine that is free now (for MASTER_PORT or a rendezvous endpoint)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_set(n: int, classes: Sequence[str] = ("a", "b"), seed: int = 0) -> ImageSet:
    """``n`` in-memory 32x32 RGB images, labels cycling through ``classes``; each class has its own
    brightness under seeded noise, so the task is easy to learn."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % len(classes)
    base = (labels * 200 // max(len(classes) - 1, 1)).to(torch.uint8).view(n, 1, 1, 1)
    noise = torch.randint(0, 40, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    images = (base.expand(n, 3, 32, 32) // 2 + noise).to(torch.uint8)
    return ImageSet(labels=labels, classes=list(classes), images=images, paths=None, size=(32, 32), channels=3)


def tiny_splits(classes: Sequence[str] = ("a", "b")) -> DataSplits:
    """Train (32 images), val and test (16 each) from ``tiny_set``, each split with its own seed."""
    return DataSplits(train=tiny_set(32, classes), val=tiny_set(16, classes, 1), test=tiny_set(16, classes, 2),
                      classes=list(classes), format="folder")


# ================================================================================== files on disk
def image_folder(root: Path, classes: Sequence[str] = ("cat", "dog"), n: int = 12, test: int = 4,
                 size: int = 32) -> Path:
    """A split-folder dataset: root/train/<class>/<i>.png (``n`` a class) and root/test/<class>/ (``test``
    a class), ``size`` x ``size`` RGB. Each class is a brightness level (0 to 150) under seeded noise."""
    g = torch.Generator().manual_seed(0)
    for part, count in (("train", n), ("test", test)):
        for c, name in enumerate(classes):
            d = root / part / name
            d.mkdir(parents=True)
            level = 150 * c // max(len(classes) - 1, 1)
            for i in range(count):
                px = (torch.randint(0, 60, (size, size, 3), generator=g) + level).to(torch.uint8)
                Image.fromarray(px.numpy()).save(d / f"{i}.png")
    return root


def noise_image(h: int, w: int, seed: int = 0, channels: int = 3) -> Image.Image:
    """An h x w image of uniform noise (RGB, or grey with ``channels=1``), seeded."""
    a = np.random.default_rng(seed).integers(0, 256, (h, w, channels), dtype=np.uint8)
    return Image.fromarray(a if channels == 3 else a[:, :, 0])


def png_header_only(path: Path, w: int, h: int) -> Path:
    """A PNG whose header claims w x h pixels, with almost no data (a cheap decompression-bomb stand-in)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                     + chunk(b"IEND", b""))
    return path


def idx_bytes(arr, magic: int | None = None) -> bytes:
    """An MNIST IDX file of unsigned bytes: the magic number (0x800 + rank unless given), the shape, the data."""
    arr = np.asarray(arr).astype(np.uint8)
    magic = 0x800 + arr.ndim if magic is None else magic
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in arr.shape) + arr.tobytes()


class Payload:
    """Code in a pickle: unpickling this object calls ``open(marker, "w")``, which creates the file
    ``marker``, so a loader that lets pickled code run leaves the file behind. Its pickle imports the
    global ``builtins.open``."""

    def __init__(self, marker: str | os.PathLike):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))

"""Does the data path of an image folder keep up with training? Images/s of decoding + cropping +
augmenting, as a run does it, against the images/s ViT-Ti/16 trains at, at the same batch size.

    .venv/bin/python benchmarks/data_path.py [--images 320] [--batch-size 32] [--threads 2] [--passes 2]
        [--steps 3] [--workers N] [--randaugment] [--out benchmarks/results/data_path.json]

It writes its own folder of 224-px JPEGs to a temporary directory (``--images`` of them, two classes,
short side 224 and three aspect ratios: 224x224, 224x298 and 298x224; smooth random colour fields
with noise, so that they compress about as photos do) and opens it as `vitkit train` would for
vit_tiny_patch16_224: whole images kept at a short side of 224 / 0.875 = 256 (never enlarged, so these
stay at 224), streamed (``in_memory=False``: every batch is decoded again, the path of a dataset too
large for memory), in DataLoader workers (``data.workers``' default: one per usable CPU), then the
pretrain recipe's augmentation (random resized crop from the whole image, scale 0.08-1, flip; with
``--randaugment`` RandAugment 2/9 too) in the training process. It also times the in-memory path
(decoded once, crops and augmentation only). The training side is ViT-Ti/16's full step (forward,
backward, AdamW) on a batch of the same size, with ``--threads`` threads.

The two are timed in turn within one run (data pass, training steps, data pass, ...), so that load
from other work on a shared machine hits both alike; the ratio data images/s : training images/s is
what to read (>= 1: the data path is not the bottleneck). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

import vitkit
from vitkit.core.hardware import usable_cpus
from vitkit.data import AugmentConfig, BatchAugment, open_dataset
from vitkit.io.atomic import atomic_write_text
from vitkit.data.splits import decode_short_side
from vitkit.train.loader import BatchLoader, loader_workers

MODEL = "vit_tiny_patch16_224"
SHAPES = [(224, 224), (224, 298), (298, 224)]


def make_folder(root: Path, n: int, seed: int = 0) -> Path:
    """``n`` JPEGs in root/a and root/b: a random 8x8 colour field, smoothly enlarged, plus noise."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        h, w = SHAPES[i % len(SHAPES)]
        field = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
        a = np.asarray(field, dtype=np.int16) + rng.integers(-12, 13, (h, w, 3))
        d = root / "ab"[i % 2]
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(a.clip(0, 255).astype(np.uint8)).save(d / f"{i:04d}.jpg", quality=90)
    return root


def data_pass(loader: BatchLoader, aug: BatchAugment, epoch: int) -> tuple[float, int]:
    """(seconds, images) of one pass over the data: batches as the trainer gets them, then augmented."""
    g = torch.Generator()
    t0, n = time.perf_counter(), 0
    for step, images, labels in loader.epoch(epoch):
        g.manual_seed(step)
        x, _ = aug(images, labels, g)
        n += x.shape[0]
    return time.perf_counter() - t0, n


def train_steps(model, opt, batch: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` full training steps of ``model`` on random input of ``batch`` images."""
    x = torch.randn(batch, 3, 224, 224)
    y = torch.randint(0, model.cfg.num_classes, (batch,))
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=320)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the training step")
    ap.add_argument("--passes", type=int, default=2, help="timed passes over the data, each followed by --steps steps")
    ap.add_argument("--steps", type=int, default=3, help="training steps timed after each data pass")
    ap.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: as a run picks them)")
    ap.add_argument("--randaugment", action="store_true", help="add RandAugment 2/9 to the augmentation")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "data_path.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model = vitkit.create_model(MODEL, num_classes=2).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    short = decode_short_side(model.cfg.img_size, 0.875)
    extra = dict(auto="randaugment", ra_ops=2, ra_magnitude=9) if args.randaugment else {}
    aug = BatchAugment(AugmentConfig(crop="rrc", rrc_scale=(0.08, 1.0), hflip=0.5, **extra), model.cfg.img_size,
                       model.preprocess, 2)
    workers = loader_workers(args.workers)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_folder(Path(tmp) / "jpegs", args.images)
        streamed = open_dataset(root, val_fraction=0, short_side=short, in_memory=False).train
        t0 = time.perf_counter()
        held = open_dataset(root, val_fraction=0, short_side=short, in_memory=True, num_workers=workers).train
        decode_once = time.perf_counter() - t0
        stream_loader = BatchLoader(streamed, args.batch_size, workers=workers)
        memory_loader = BatchLoader(held, args.batch_size)
        train_steps(model, opt, args.batch_size, 1)  # warm-up
        data_pass(stream_loader, aug, 0)
        stream, memory, steps = [], [], []
        for p in range(args.passes):
            stream.append(data_pass(stream_loader, aug, p + 1))
            memory.append(data_pass(memory_loader, aug, p + 1))
            steps += train_steps(model, opt, args.batch_size, args.steps)

    rate = lambda runs: max(n / s for s, n in runs)  # noqa: E731 - the best pass: the least disturbed by other work
    train_rate = args.batch_size / statistics.median(steps)
    res = {
        "model": MODEL, "batch_size": args.batch_size, "images": args.images, "shapes": SHAPES, "short_side": short,
        "threads": args.threads, "workers": workers, "usable_cpus": usable_cpus(), "randaugment": args.randaugment,
        "streamed_img_per_s": round(rate(stream), 1), "in_memory_img_per_s": round(rate(memory), 1),
        "decode_once_img_per_s": round(args.images / decode_once, 1),
        "train_img_per_s": round(train_rate, 2), "train_step_s": round(statistics.median(steps), 3),
        "ratio_streamed": round(rate(stream) / train_rate, 2), "ratio_in_memory": round(rate(memory) / train_rate, 2),
        "torch": torch.__version__, "machine": platform.machine(),
    }
    print(f"{MODEL}, batch {args.batch_size}, {args.threads} thread(s); data: {workers} DataLoader worker(s), "
          f"{args.images} JPEGs ({', '.join(f'{h}x{w}' for h, w in SHAPES)}), short side {short}")
    print(f"{'path':<44} {'img/s':>8} {'x training':>11}")
    print(f"{'data, streamed (decode + crop + augment)':<44} {res['streamed_img_per_s']:>8.1f} {res['ratio_streamed']:>10.2f}x")
    print(f"{'data, in memory (crop + augment)':<44} {res['in_memory_img_per_s']:>8.1f} {res['ratio_in_memory']:>10.2f}x")
    print(f"{'training step (fwd + bwd + AdamW)':<44} {train_rate:>8.1f} {1:>10.2f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

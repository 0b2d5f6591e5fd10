"""Is the data path fast enough? Batch augmentation time against a small ViT's training step, and
the time to decode a folder of JPEGs.

    .venv/bin/python benchmarks/bench_data.py [--device cpu] [--threads 2] [--batch-size 256]
        [--cifar-dir /tmp/cifar10/train] [--kornia]

For each image setting (28x28 grey with vit_mini_patch4_28, 32x32 RGB with vit_mini_patch4_32 and
vit_hybrid_tiny_patch4_32) and each augmentation setting (basic = crop + flip; + RandAugment;
+ RandAugment + mixup/cutmix + label smoothing + random erasing), it times BatchAugment on a uint8 batch
and the model's forward + backward on the same batch, in alternation (so that load on a shared machine
hits both alike), and prints the medians and the data share of the step time. With --kornia it times
kornia's equivalent pipeline on the same batches too (kornia is not a dependency of vitkit). With
--cifar-dir (a folder of class folders of JPEGs, e.g. the CIFAR-10 train tarball unpacked) it times
open_dataset decoding the folder with 1 and with N worker processes. JSON goes to
benchmarks/results/bench_data_<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import vitkit
from vitkit.data import AugmentConfig, BatchAugment, open_dataset
from vitkit.io.atomic import atomic_write_text

AUGS = {
    "basic": dict(crop="rrc", rrc_scale=(0.35, 1.0)),
    "randaugment": dict(crop="rrc", rrc_scale=(0.35, 1.0), auto="randaugment", ra_ops=2, ra_magnitude=9),
    "ra+mix": dict(crop="rrc", rrc_scale=(0.35, 1.0), auto="randaugment", mixup_alpha=0.8, cutmix_alpha=1.0,
                   label_smoothing=0.1, erase_prob=0.25),
    "demo": dict(crop="pad", pad=2, label_smoothing=0.1),  # the demo recipe's (configs/demo.toml)
}
SETTINGS = [  # (name, channels, size, model)
    ("28x28 grey", 1, 28, "vit_mini_patch4_28"),
    ("32x32 RGB", 3, 32, "vit_mini_patch4_32"),
    ("32x32 RGB", 3, 32, "vit_hybrid_tiny_patch4_32"),
    ("28x28 grey", 1, 28, "vit_hybrid_mini_patch4_28"),  # the demo model
]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def kornia_pipeline(name: str, channels: int, size: int, pre):
    """kornia's version of the same settings, for comparison (geometry, RandAugment, normalise, mix, erase)."""
    import kornia.augmentation as K
    from kornia.augmentation.auto import RandAugment

    grey_rgb = channels == 1 and name != "basic"  # kornia's colour ops need 3 channels: run grey as RGB
    p = pre.for_channels(3 if grey_rgb else channels)
    ops = [K.RandomResizedCrop((size, size), scale=(0.35, 1.0)), K.RandomHorizontalFlip(p=0.5 if channels == 3 else 0.0)]
    if name != "basic":
        ops.append(RandAugment(n=2, m=9))
    ops.append(K.Normalize(mean=torch.tensor(p.mean), std=torch.tensor(p.std)))
    if name == "ra+mix":
        ops.append(K.RandomErasing(p=0.25))
    seq = K.AugmentationSequential(*ops)
    mix = K.RandomMixUpV2(p=1.0) if name == "ra+mix" else None

    def run(x_u8, y):
        x = x_u8.float() / 255
        if grey_rgb:
            x = x.expand(-1, 3, -1, -1)
        x = seq(x)
        if mix is not None:
            out = mix(x, y)
            x = out[0] if isinstance(out, (tuple, list)) else out
        return x[:, :1] if grey_rgb else x

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--kornia", action="store_true", help="also time kornia's equivalent pipeline")
    ap.add_argument("--cifar-dir", default=None, help="class-folder tree of JPEGs to time decoding")
    ap.add_argument("--decode-workers", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--models", nargs="*", help="only these models (default: every setting)")
    ap.add_argument("--augs", nargs="*", help=f"only these augmentations, of {list(AUGS)} (default: all but demo)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = args.device
    pre = vitkit.Preprocess()
    rows = []
    print(f"device {dev}, {args.threads} threads, batch {args.batch_size}, medians of {args.repeats} repeats")
    print(f"{'images':<11} {'model':<26} {'augment':<12} {'aug ms':>8} {'step ms':>8} {'data share':>10}"
          + (f" {'kornia ms':>10}" if args.kornia else ""))
    for setting, c, s, model_name in SETTINGS:
        if args.models and model_name not in args.models:
            continue
        model = vitkit.create_model(model_name, seed=0).to(dev).train()
        g0 = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (args.batch_size, c, s, s), generator=g0, dtype=torch.uint8).to(dev)
        y = torch.randint(0, 10, (args.batch_size,), generator=g0).to(dev)
        for aug_name, kw in AUGS.items():
            if (args.augs and aug_name not in args.augs) or (not args.augs and aug_name == "demo"):
                continue
            cfg = AugmentConfig(hflip=0.5 if c == 3 else 0.0, **kw)
            aug = BatchAugment(cfg, (s, s), pre, 10)
            gen = torch.Generator(dev).manual_seed(1)
            xa, ta = aug(x, y, gen)

            def step():
                out = model(xa)
                loss = F.cross_entropy(out, ta)
                loss.backward()
                model.zero_grad(set_to_none=True)

            def augment():
                aug(x, y, gen)

            fns = {"aug": augment, "step": step}
            if args.kornia:
                try:
                    kp = kornia_pipeline(aug_name, c, s, pre)
                    kp(x, y)
                    fns["kornia"] = lambda: kp(x, y)
                except Exception as e:  # noqa: BLE001 - report and go on without kornia
                    print(f"  kornia failed for {aug_name}: {type(e).__name__}: {e}")
            for fn in fns.values():  # warm-up
                fn()
            times = {k: [] for k in fns}
            for _ in range(args.repeats):
                for k, fn in fns.items():
                    sync(dev)
                    t0 = time.perf_counter()
                    fn()
                    sync(dev)
                    times[k].append((time.perf_counter() - t0) * 1000)
            med = {k: statistics.median(v) for k, v in times.items()}
            share = med["aug"] / (med["aug"] + med["step"])
            row = dict(images=setting, channels=c, size=s, model=model_name, augment=aug_name, config=cfg.to_dict(),
                       aug_ms=round(med["aug"], 2), step_ms=round(med["step"], 2), data_share=round(share, 3))
            if "kornia" in med:
                row["kornia_ms"] = round(med["kornia"], 2)
            rows.append(row)
            print(f"{setting:<11} {model_name:<26} {aug_name:<12} {med['aug']:8.1f} {med['step']:8.1f} {share:10.1%}"
                  + (f" {med.get('kornia', float('nan')):10.1f}" if args.kornia else ""))

    decode = []
    if args.cifar_dir:
        import resource

        def cpu_seconds() -> float:  # user + system time of this process and its (finished) children
            me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

        for w in sorted({1, args.decode_workers}):
            t0, c0 = time.perf_counter(), cpu_seconds()
            d = open_dataset(args.cifar_dir, val_fraction=0, num_workers=w)
            sec, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            n = len(d.train)
            decode.append(dict(folder=str(args.cifar_dir), images=n, workers=w, seconds=round(sec, 2),
                               cpu_seconds=round(cpu, 2), images_per_s=round(n / sec), skipped=len(d.skipped)))
            print(f"decode {n} images ({d.summary()}) with {w} worker process(es): {sec:.1f} s wall, "
                  f"{cpu:.1f} s CPU, {n / sec:.0f} images/s")
            del d

    res = dict(device=dev, threads=args.threads, batch_size=args.batch_size, repeats=args.repeats,
               torch=torch.__version__, cpu=platform.processor() or platform.machine(),
               cuda=torch.cuda.get_device_name() if dev == "cuda" else None, augment=rows, decode=decode)
    out = Path(args.out or f"benchmarks/results/bench_data_{dev}.json")
    atomic_write_text(out, json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

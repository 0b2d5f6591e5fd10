"""Forward (inference) and training-step speed of vitkit against timm, side by side, as ratios.

Run in an environment with timm (see benchmarks/parity.sh for one):
    .venv-ref/bin/python benchmarks/model_vs_timm.py [--models vit_tiny_patch16_224,vit_small_patch16_224]
    python benchmarks/model_vs_timm.py --device cuda --dtypes bf16 --models vit_base_patch16_224 --batch-size 64

Both models get the same weights (identity key map). The two are timed in alternation, repeat after
repeat, so that load on a shared machine hits both alike; the table gives medians and the ratio
vitkit/timm of images per second (> 1: vitkit faster). JSON goes to benchmarks/results/model_vs_timm.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import vitkit


def timed(fn, n: int, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n


def main() -> None:
    import timm

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="vit_tiny_patch16_224,vit_small_patch16_224")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated of fp32, bf16 (autocast)")
    ap.add_argument("--out", default="benchmarks/results/model_vs_timm.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []
    for name in args.models.split(","):
        ours = vitkit.create_model(name, seed=0)
        ref = timm.create_model(name, pretrained=False)
        ref.load_state_dict(ours.state_dict())
        ours, ref = ours.to(device), ref.to(device)
        x = torch.randn(args.batch_size, 3, *ours.cfg.img_size, device=device)
        for dtype in args.dtypes.split(","):
            for mode in ("infer", "train"):
                def step(m, mode=mode, dtype=dtype):
                    ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")
                    if mode == "infer":
                        m.eval()
                        with torch.inference_mode(), ctx:
                            m(x)
                    else:
                        m.train()
                        with ctx:
                            loss = m(x).float().logsumexp(-1).mean()
                        loss.backward()
                        m.zero_grad(set_to_none=True)

                for m in (ours, ref):  # warm-up
                    step(m)
                t_ours, t_ref = [], []
                for _ in range(args.repeats):
                    t_ours.append(timed(lambda: step(ours), args.iters, device))
                    t_ref.append(timed(lambda: step(ref), args.iters, device))
                a, b = statistics.median(t_ours), statistics.median(t_ref)
                ratios = sorted(r / o for o, r in zip(t_ours, t_ref))
                rows.append(dict(model=name, dtype=dtype, mode=mode, batch=args.batch_size,
                                 vitkit_img_s=args.batch_size / a, timm_img_s=args.batch_size / b,
                                 ratio=b / a, ratio_min=ratios[0], ratio_max=ratios[-1]))
                r = rows[-1]
                print(f"{name:24s} {dtype:4s} {mode:5s}  vitkit {r['vitkit_img_s']:8.1f} img/s  timm "
                      f"{r['timm_img_s']:8.1f} img/s  ratio {r['ratio']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]",
                      flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(torch=torch.__version__, timm=timm.__version__, threads=args.threads,
                                   device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                                   rows=rows),
                              indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""The numbers of each fast path against fp32 eager, on a trained model and real test images.

    PYTHONPATH=src python benchmarks/path_agreement.py runs/demo                  # the demo's test digits
    PYTHONPATH=src python benchmarks/path_agreement.py RUN --data DIR --split val --seed S  # e.g. a CIFAR-10 carve

For every test image: the top-1 class of fp32 eager against bf16 autocast, bf16 on the packed bf16 copy
(``vitkit.infer.packed``, where oneDNN runs bf16; its residual stream in float32, and in bf16: "bf16_stream") and
int8 (``vitkit.infer.quantize``, on each of its kernels that runs here: "int8_onednn", "int8_fbgemm") (the share
that agree), and the largest logit difference of the fp32 paths (channels-last, for a conv
stem) from eager. One JSON line to stdout, appended to benchmarks/results/path_agreement.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from vitkit.data import eval_batch, open_dataset
from vitkit.infer.fastpath import FastPath
from vitkit.infer.packed import onednn_bf16_available
from vitkit.infer.paths import apply_path, autocast
from vitkit.infer.quantize import fbgemm_available, onednn_int8_available
from vitkit.tools.loading import load_model


def logits_of(net, x: torch.Tensor, precision: str = "fp32", batch: int = 250) -> torch.Tensor:
    cpu = torch.device("cpu")
    with torch.inference_mode(), autocast(cpu, precision):
        return torch.cat([net(x[i:i + batch]).float() for i in range(0, len(x), batch)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a checkpoint or run directory")
    ap.add_argument("--data", default=None, help="dataset folder (default: the built-in demo set)")
    ap.add_argument("--split", default="test", choices=("test", "val"))
    ap.add_argument("--limit", type=int, default=None, help="score the first N images only")
    ap.add_argument("--seed", type=int, default=0, help="the seed of the validation carve (as the run's --seed)")
    ap.add_argument("--about", default=None, help="what the model is (e.g. its run command and accuracy), recorded")
    ap.add_argument("--out", default="benchmarks/results/path_agreement.jsonl")
    args = ap.parse_args()
    model = load_model(args.model)
    c = model.cfg
    splits = open_dataset(args.data, channels=c.in_chans, img_size=c.img_size, seed=args.seed)
    ds = getattr(splits, args.split)
    n = len(ds) if args.limit is None else min(args.limit, len(ds))
    imgs, _ = ds.get_batch(torch.arange(n))
    x = eval_batch(imgs, c.img_size, model.preprocess)
    ref = logits_of(model, x)
    top = ref.argmax(-1)
    res = dict(command=" ".join(sys.argv), model=str(args.model) + (f": {args.about}" if args.about else ""), data=args.data or "demo", split=args.split,
               images=n, torch=torch.__version__)
    paths = {"bf16": FastPath("bf16")}
    if onednn_int8_available():
        paths["int8_onednn"] = FastPath("int8", int8_kernel="onednn")
    if fbgemm_available():
        paths["int8_fbgemm"] = FastPath("int8", int8_kernel="fbgemm")
    if onednn_bf16_available():
        paths["bf16_packed"] = FastPath("bf16", packed=True)
        paths["bf16_stream"] = FastPath("bf16", packed=True, stream="bfloat16")
    for name, path in paths.items():
        got = logits_of(apply_path(model, path), x, path.precision)
        res[f"{name}_top1_agreement"] = (got.argmax(-1) == top).float().mean().item()
        res[f"{name}_max_abs_logit_diff"] = (got - ref).abs().max().item()
    if c.stem == "conv":
        cl = apply_path(load_model(args.model), FastPath("fp32", channels_last=True))
        res["fp32_channels_last_max_abs_logit_diff"] = (logits_of(cl, x) - ref).abs().max().item()
    print(json.dumps(res))
    with Path(args.out).open("a") as f:
        f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()

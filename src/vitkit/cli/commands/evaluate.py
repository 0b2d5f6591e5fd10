"""`vitkit eval CKPT --data DIR`: loss, top-1/top-5, per-class metrics, confusion matrix, worst mistakes.

The images scored are the data's test part, else its val part, else all of it; `--split` chooses
otherwise. Without --data, a run directory is scored on its own data as the run split it (its
validation carve included), a checkpoint on the built-in demo set. The first line says which images."""

from __future__ import annotations

import argparse

from . import add_precision_flag, add_progress_flags, max_pixels, pixels


def register(p):
    p.add_argument("checkpoint", help="a vitkit checkpoint or run directory, timm, HF or JAX weights, or a name: "
                   "hf-hub:ORG/NAME, or a vitkit model name with published weights (downloaded with vitkit[hub])")
    p.add_argument("--data", default=None, help="dataset folder (default: a run directory's own data, as the run "
                   "split it; for a checkpoint, the built-in demo set)")
    p.add_argument("--data-format", default=None,
                   choices=("folder", "split-folder", "mnist", "cifar10", "cifar100"),
                   help="dataset layout (default: detected)")
    p.add_argument("--split", choices=("test", "val", "train", "all"), default=None,
                   help="which part: test, val, train or all of them (default: test if the data has one, else val, "
                        "else all; without --data, a run's own test part or validation carve). val on data without "
                        "a val part: a 10%% carve of the training images, seeded with the run's seed (else 0)")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass (default 256)")
    p.add_argument("--out", default=None, help="folder for metrics.json, confusion.json/.png and worst.png")
    p.add_argument("--worst", type=int, default=16, help="how many confidently wrong images to list (default 16)")
    p.add_argument("--strict", action="store_true", help="stop at the first unreadable image (exit 1)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto: a GPU if there is one)")
    p.add_argument("--max-pixels", type=pixels, default=None, metavar="N",
                   help="refuse images larger than N pixels as decompression bombs (0: no limit; default: Pillow's 89,478,485)")
    p.add_argument("--tta", action=argparse.BooleanOptionalAction, default=None, help="test-time flip augmentation: "
                   "score the mean of the logits of each image and its left-right mirror (two forward passes; "
                   "default: as the run scored, for a run directory or a checkpoint in one; else off)")
    p.add_argument("--tta-shift", type=int, default=None, metavar="PX", help="with --tta, also score two copies of "
                   "each image moved PX px diagonally, each flip-averaged (six forward passes; default: as the run "
                   "scored, else 0)")
    p.add_argument("--tta-flip", action=argparse.BooleanOptionalAction, default=None, help="with --tta, score each "
                   "view's mirror image too; --no-tta-flip: without them, for data whose mirror images change class "
                   "(default: as the run scored, else with them)")
    add_precision_flag(p)
    p.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    add_progress_flags(p)


def tta_words(tta: bool, shift: int, flip: bool = True) -> str:
    """The test-time views scored, as the summary line's tail: '' without TTA (or without flips and shifts)."""
    if not tta or not (flip or shift):
        return ""
    return (f", flip TTA with {shift}-px shifts" if flip else f", TTA of {shift}-px shifts") if shift else ", flip TTA"


def run(args) -> int:
    import sys

    from ...data.images import show_path
    from ...tools.evaluate import evaluate
    from . import cli_progress, json_line, printable

    res = evaluate(args.checkpoint, data=args.data, data_format=args.data_format, split=args.split,
                   batch_size=args.batch_size, out=args.out, device=args.device, num_worst=args.worst,
                   strict=args.strict, max_pixels=max_pixels(args), tta=args.tta,
                   tta_shift=args.tta_shift, tta_flip=args.tta_flip, precision=args.precision,
                   engine=args.engine, progress=cli_progress(args.quiet, args.progress_every))
    for item in res["skipped"]:  # the library shows its paths already (data.images.show_path)
        print(f"vitkit: warning: skipped {printable(item['path'])}: {printable(item['reason'])}", file=sys.stderr)
    if args.json:
        print(json_line(res))
        return 0
    print(f"{res['data']} ({res['format']}), {res['scored']}" + tta_words(res["tta"], res["tta_shift"], res["tta_flip"])
          + (f" ({res['skipped_files']} unreadable file(s) skipped)" if res["skipped_files"] else ""))
    print(f"ran {res['fast_path']}")
    print(f"loss {res['loss']:.4f}   top-1 {100 * res['top1']:.2f}%   top-{res['top5_k']} {100 * res['top5']:.2f}%   "
          f"macro F1 {res['macro_f1']:.4f}")
    w = max(len(c["name"]) for c in res["per_class"])
    w = max(w, 5)
    print(f"{'class':<{w}}  precision  recall      F1  support")
    for c in res["per_class"]:
        print(f"{c['name']:<{w}}  {c['precision']:>9.4f}  {c['recall']:>6.4f}  {c['f1']:>6.4f}  {c['support']:>7}")
    if res["worst"]:
        print("most confidently wrong:")
        for item in res["worst"][:5]:
            where = show_path(item["path"]) if "path" in item else f"#{item['index']}"
            print(f"  {where}: true {item['true']}, predicted {item['pred']} ({item['prob']:.3f})")
    for name, path in res["files"].items():
        print(f"wrote {path}")
    return 0

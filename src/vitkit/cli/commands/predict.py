"""`vitkit predict CKPT PATH...`: top-k labels with probabilities for images, folders or globs."""

from __future__ import annotations

from . import add_precision_flag, add_progress_flags, max_pixels, pixels


def register(p):
    p.add_argument("checkpoint", help="a vitkit checkpoint or run directory, timm, HF or JAX weights, or a name: "
                   "hf-hub:ORG/NAME, or a vitkit model name with published weights (downloaded with vitkit[hub])")
    p.add_argument("paths", nargs="+", metavar="PATH", help="image files, folders (searched recursively) or globs")
    p.add_argument("--top-k", type=int, default=5, help="classes per image (default 5)")
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass (default 32)")
    p.add_argument("--strict", action="store_true", help="stop at the first unreadable file (exit 1)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto: a GPU if there is one)")
    p.add_argument("--max-pixels", type=pixels, default=None, metavar="N",
                   help="refuse images larger than N pixels as decompression bombs (0: no limit; default: Pillow's 89,478,485)")
    add_precision_flag(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    out.add_argument("--csv", action="store_true", help="print CSV: path,rank,index,label,prob")
    add_progress_flags(p)


def run(args) -> int:
    import csv
    import sys

    from ...data.images import show_path
    from ...tools.predict import predict
    from . import cli_progress, json_line

    res = predict(args.checkpoint, args.paths, top_k=args.top_k, batch_size=args.batch_size, strict=args.strict,
                  max_pixels=max_pixels(args), device=args.device, precision=args.precision, engine=args.engine,
                  progress=cli_progress(args.quiet, args.progress_every))
    failed = bool(res["errors"]) and not res["predictions"]  # nothing classified: the failure is the result
    if not (failed and len(res["errors"]) == 1):
        for e in res["errors"]:
            print(f"vitkit: warning: skipped {e['error']}", file=sys.stderr)
    if failed:
        if args.json:
            print(json_line(shown_paths(res)))
        n = len(res["errors"])
        why = res["errors"][0]["error"] if n == 1 else f"no image could be classified ({n} skipped)"
        print(f"vitkit: error: {why}", file=sys.stderr)
        return 1
    if args.json:  # file names as messages show them (show_path), so that a name that is not UTF-8 reads back
        print(json_line(shown_paths(res)))
    elif args.csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(["path", "rank", "index", "label", "prob"])
        for p in res["predictions"]:
            for rank, t in enumerate(p["top"], 1):
                w.writerow([show_path(p["path"]), rank, t["index"], t["label"], f"{t['prob']:.6f}"])
    else:
        # undecodable bytes in file names are shown as \xNN: printing them raw fails on a UTF-8 terminal
        rows = [dict(p, path=show_path(p["path"])) for p in res["predictions"]]
        cells = [[f"{show_path(t['label'])} {t['prob']:.3f}" for t in p["top"]] for p in rows]  # one line each
        width = max([len(p["path"]) for p in rows] + [4])
        cw = [max([len(c[i]) for c in cells if i < len(c)] + [5]) for i in range(res["top_k"])]
        print("  ".join([f"{'path':<{width}}"] + [f"{f'top-{i + 1}':<{cw[i]}}" for i in range(res["top_k"])]).rstrip())
        for p, c in zip(rows, cells):
            print("  ".join([f"{p['path']:<{width}}"] + [f"{x:<{cw[i]}}" for i, x in enumerate(c)]).rstrip())
        n_err = len(res["errors"])
        print(f"ran {res['fast_path']}")
        print(f"{len(rows)} image(s) classified" + (f", {n_err} skipped (see above)" if n_err else ""))
    return 0


def shown_paths(res: dict) -> dict:
    """``predict``'s result with each prediction's and error's path as ``show_path`` shows it."""
    from ...data.images import show_path

    return dict(res, predictions=[dict(p, path=show_path(p["path"])) for p in res["predictions"]],
                errors=[dict(e, path=show_path(e["path"])) for e in res["errors"]])

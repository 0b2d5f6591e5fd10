"""`vitkit explain CKPT IMAGE --out FILE.png [--class NAME|INDEX]`: attention rollout, class-token attention
and the gradient-weighted rollout of one class over the image."""

from __future__ import annotations

from . import image_size, json_line, max_pixels, pixels


def register(p):
    p.add_argument("checkpoint", help="a vitkit checkpoint or run directory, timm, HF or JAX weights, or a name: "
                   "hf-hub:ORG/NAME, or a vitkit model name with published weights (downloaded with vitkit[hub])")
    p.add_argument("image", help="an image file")
    p.add_argument("--out", required=True, help="the PNG to write (input | overlays side by side)")
    p.add_argument("--method", choices=("rollout", "cls", "grad", "both", "all"), default="all",
                   help="attention rollout, last-block class-token attention, gradient-weighted rollout for a class "
                        "(grad), rollout and cls (both), or all three (default; grad where the model has a class score)")
    p.add_argument("--class", dest="target", metavar="NAME|INDEX", default=None,
                   help="the class the grad map explains: a class name or an index (default: the predicted class)")
    p.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean",
                   help="how heads are combined (rollout, cls; grad takes the mean)")
    p.add_argument("--discard-ratio", type=float, default=0.0,
                   help="rollout: zero this fraction of the weakest attention weights per block (default 0)")
    p.add_argument("--img-size", type=image_size, default=None,
                   help="N or HxW to run at (default: the model's size; a dynamic-size model keeps the image's aspect)")
    p.add_argument("--alpha", type=float, default=0.5, help="heatmap opacity (default 0.5)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto: a GPU if there is one)")
    p.add_argument("--max-pixels", type=pixels, default=None, metavar="N",
                   help="refuse images larger than N pixels as decompression bombs (0: no limit; default: Pillow's 89,478,485)")
    p.add_argument("--json", action="store_true", help="print a JSON object (maps as nested lists) as the last line")


def run(args) -> int:
    from ...tools.explain import MAPS, explain

    res = explain(args.checkpoint, args.image, out=args.out, method=args.method, head_fusion=args.head_fusion,
                  discard_ratio=args.discard_ratio, img_size=args.img_size, alpha=args.alpha,
                  max_pixels=max_pixels(args), target=args.target, device=args.device)
    if args.json:
        out = dict(res)
        for k in MAPS:
            out[k] = None if res[k] is None else [[round(float(v), 6) for v in row] for row in res[k]]
        print(json_line(out))
        return 0
    h, w = res["input_size"]
    gh, gw = res["grid"]
    pred = res["pred"]
    print(f"{res['source']}: ran at {h}x{w}, attention grid {gh}x{gw}"
          + (f", predicted {pred['label']} ({pred['prob']:.3f})" if pred else ""))
    for k in MAPS:
        m = res[k]
        if m is None:
            continue
        r, c = divmod(int(m.argmax()), m.shape[1])
        where = f"strongest patch at row {r}, column {c} (weight {float(m.max()):.4f}, mean {float(m.mean()):.4f})"
        if k == "grad":
            t = res["target"]
            where = f"gradient-weighted rollout for class {t['label']} ({t['prob']:.3f}): {where}"
        print(f"  {k:<7}: {where}")
    if res["note"]:
        print(f"  note: {res['note']}")
    print(f"wrote {res['out']}")
    return 0

"""`vitkit export CKPT --format onnx|torchscript|exported-program --out FILE`: export, checked against eager."""

from __future__ import annotations

FORMATS = ("onnx", "torchscript", "exported-program")


def register(p):
    p.add_argument("checkpoint", help="a vitkit checkpoint or run directory, timm, HF or JAX weights, or a name: "
                   "hf-hub:ORG/NAME, or a vitkit model name with published weights (downloaded with vitkit[hub])")
    p.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    p.add_argument("--out", required=True, help="output file (e.g. model.onnx, model.pt, model.pt2)")
    p.add_argument("--opset", type=int, default=18, help="ONNX opset version (default 18)")
    p.add_argument("--dynamic-size", action="store_true",
                   help="also make height and width dynamic (needs a model with dynamic_img_size=True)")
    p.add_argument("--atol", type=float, default=1e-4, help="largest |export - eager| accepted (default 1e-4)")
    p.add_argument("--no-check", action="store_true", help="skip the comparison with the eager model")
    p.add_argument("--json", action="store_true", help="print a JSON object as the last line")


def run(args) -> int:
    from ...tools.export import export
    from . import json_line

    res = export(args.checkpoint, args.out, args.format, opset=args.opset, dynamic_size=args.dynamic_size,
                 check=not args.no_check, atol=args.atol)
    if args.json:
        print(json_line(res))
        return 0
    print(f"wrote {res['out']} ({res['format']}, {res['bytes'] / 1e6:.2f} MB, dynamic batch"
          f"{', dynamic height/width' if res['dynamic_size'] else ''})")
    if res["check"]:
        for row in res["check"]["checks"]:
            print(f"  input {'x'.join(map(str, row['shape'])):<14} max |export - eager| = {row['max_abs_diff']:.2e}")
        print(f"check passed (atol {res['check']['atol']:g})")
    return 0

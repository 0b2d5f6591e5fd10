"""`vitkit convert SRC DEST --from timm|hf|jax` / `--to timm|hf`: weight conversion. Without --from, the
format of SRC is told by its container (``io.convert.detect_format``)."""

from __future__ import annotations

from . import image_size


def register(p):
    p.add_argument("src", help="the weights to read: a vitkit checkpoint, a timm .pth/.safetensors file or Hub "
                               "folder, an HF model directory, a JAX .npz file, or a name: hf-hub:ORG/NAME, or a "
                               "vitkit model name with published weights (downloaded with vitkit[hub])")
    p.add_argument("dest", help="where to write: a vitkit checkpoint directory, a timm .safetensors/.pth file or "
                                "an HF model directory")
    p.add_argument("--from", dest="src_format", choices=["timm", "hf", "jax"], default=None,
                   help="format of SRC (default: told by the container: a vitkit checkpoint or run folder, an HF "
                        "folder, a JAX .npz file, a timm .pth/.bin/.safetensors file)")
    p.add_argument("--to", dest="dest_format", choices=["timm", "hf"], default=None,
                   help="format of DEST (default: a vitkit checkpoint)")
    p.add_argument("--model", dest="model_name", metavar="NAME", default=None,
                   help="a vitkit model name (`vitkit list`) that supplies what the weights do not show "
                        "(heads, eps, pooling, a non-square image size)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set a ViTConfig field the weights do not show, e.g. global_pool=avg, norm_eps=1e-12, "
                        "img_size=[224,320], or the preprocessing: preprocess.crop_pct=0.9, "
                        "preprocess.mean=[0.485,0.456,0.406] (repeatable; wins over everything else)")
    p.add_argument("--img-size", type=image_size, default=None, metavar="N|HxW",
                   help="convert at another resolution: resample the position embeddings to this image size")
    p.add_argument("--interpolation", choices=["bicubic", "bilinear", "nearest"], default="bicubic",
                   help="position-embedding resampling for --img-size (default bicubic, no antialias, as HF)")
    p.add_argument("--antialias", action="store_true", help="resample with antialias=True, as timm does (this kernel differs from the "
                        "default when upsampling too)")
    p.add_argument("--force", action="store_true", help="write DEST even where it holds a checkpoint or a training "
                   "run (whose files the conversion replaces, or whose best/ it shadows); refused without it")
    p.add_argument("--json", action="store_true", help="print a JSON report as the last line")
    p.set_defaults(_convert_parser=p)


def run(args) -> int:
    from ...io.convert import convert, describe
    from . import json_line

    parser = args._convert_parser
    src_format = args.src_format or source_format(args.src)
    if src_format == "vitkit" and args.dest_format is None:
        parser.error("give --from FORMAT (SRC is timm, hf or jax) or --to FORMAT (DEST is timm or hf)")
    if src_format == "vitkit" and (args.model_name or args.overrides):
        parser.error("--model and --set describe foreign weights; use them with --from")
    dest_format = args.dest_format or "vitkit"
    report = convert(args.src, args.dest, src_format, dest_format, model_name=args.model_name,
                     overrides=args.overrides, img_size=args.img_size, interpolation=args.interpolation,
                     antialias=args.antialias, force=args.force)
    for line in describe(report):
        print(line)
    if report["resampled"]:
        r = report["resampled"]
        print(f"resampled position embeddings {'x'.join(map(str, r['from']))} -> {'x'.join(map(str, r['to']))} "
              f"({r['interpolation']}{', antialias' if r['antialias'] else ''})")
    print(f"wrote {dest_format}: {', '.join(report['files'])}")
    if dest_format == "timm":
        from ...io.timm import timm_source
        from ...model.config import ViTConfig

        cfg = ViTConfig.from_dict(report["config"])
        where = " (conv_stem: docs/convert.md)" if cfg.stem == "conv" else ""
        print(f"timm builds it as: {timm_source(cfg)}{where}")
    if args.json:
        print(json_line(report))
    return 0


def source_format(src: str) -> str:
    """The format SRC's container tells; 'vitkit' where it tells none (the vitkit reader then says what
    is wrong with it)."""
    from ...core.errors import CheckpointError
    from ...io.convert import detect_format
    from ...io.hub import hub_source

    if hub_source(src):
        return detect_format(src)  # a name that cannot be had is that error, not a question of format
    try:
        return detect_format(src)
    except CheckpointError:
        return "vitkit"

"""`vitkit finetune SOURCE --data DIR [--img-size 384]`: fine-tune pretrained weights on new data: a new
head for the data's classes, position embeddings resampled to the new resolution, the fine-tuning recipe
(SGD + momentum, no weight decay, warmup + cosine).

SOURCE is a vitkit checkpoint or run directory (its best model), or timm, HF or JAX weights: the
container tells the format (``io.convert.detect_format``) and the architecture is read from the weights
as `vitkit convert` reads it; what they do not show comes from --model NAME and --set model_args.KEY=VALUE,
else from defaults, and the run prints what it assumed. SOURCE may be a name (``hf-hub:ORG/NAME``, or a model
name with published weights: ``io.hub``). The preprocessing is the source's own (a timm tag's pretrained_cfg,
an HF model's preprocessor_config.json; assumed and printed for a bare file); --set preprocess.KEY=VALUE
changes it."""

from __future__ import annotations

from .train import add_common, execute


def register(p):
    p.add_argument("checkpoint", metavar="SOURCE", help="a vitkit checkpoint or run directory, an HF model folder, "
                   "a JAX .npz file, a timm .pth/.bin/.safetensors file or Hub folder, or a name: hf-hub:ORG/NAME, "
                   "or a vitkit model name with published weights (downloaded with vitkit[hub])")
    p.add_argument("--model", dest="init_model", metavar="NAME",
                   help="timm, HF or JAX weights: a named model (`vitkit list`) that supplies what the weights do not "
                        "show (heads, eps, pooling); single fields: --set model_args.KEY=VALUE")
    p.add_argument("--layer-decay", type=float, metavar="D",
                   help="layer-wise lr decay: block i of L gets lr * D^(L - i) (default: off)")
    p.add_argument("--tune", choices=["auto", "full", "last", "probe"], help="what trains: the whole model, the "
                   "last --tune-blocks blocks and the head, or the head alone on the frozen backbone (default: auto, "
                   "chosen from the budget and the model's size; the run's first lines say which and why)")
    p.add_argument("--tune-blocks", type=int, metavar="K", help="the blocks --tune last trains (default: 2)")
    add_common(p, finetune=True)


def run(args) -> int:
    from ...core.errors import ConfigError

    if not args.resume and not args.data:
        raise ConfigError("--data: fine-tuning needs a dataset (a folder, MNIST or CIFAR directory)")
    extra = {"init_model": args.init_model, "optim.layer_decay": args.layer_decay, "tune": args.tune,
             "tune_blocks": args.tune_blocks}
    return execute(args, weights=args.checkpoint, extra_flags=extra)

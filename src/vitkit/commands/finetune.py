"""`vitkit finetune CKPT --data DIR [--img-size 384]`: fine-tune a checkpoint (or a run directory's
best model) on new data: a new head for the data's classes, position embeddings resampled to the new
resolution, the fine-tuning recipe (SGD + momentum, no weight decay, warmup + cosine)."""

from __future__ import annotations

from .train import add_common, execute


def register(p):
    p.add_argument("checkpoint", metavar="CKPT", help="a vitkit checkpoint directory or a training run directory")
    p.add_argument("--img-size", type=int, metavar="PX",
                   help="fine-tune at this resolution (default: the checkpoint's); position embeddings are resampled")
    p.add_argument("--layer-decay", type=float, metavar="D",
                   help="layer-wise lr decay: block i of L gets lr * D^(L - i) (default: off)")
    add_common(p, finetune=True)


def run(args) -> int:
    from ..errors import ConfigError
    from ..train.config import FINETUNE_DEFAULTS

    if not args.resume and not args.data:
        raise ConfigError("--data: fine-tuning needs a dataset (a folder, MNIST or CIFAR directory)")
    extra = {"init_from": args.checkpoint, "img_size": args.img_size, "optim.layer_decay": args.layer_decay}
    return execute(args, base=FINETUNE_DEFAULTS, extra_flags=extra)

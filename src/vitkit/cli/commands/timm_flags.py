"""timm's train.py flags on `vitkit train` and `vitkit finetune`: the ones users type most, as aliases of
vitkit's config keys, and a table of the others that says what vitkit takes instead, so that an unknown
timm flag is never matched to an unrelated setting. docs/train.md holds the same table for readers.

Where a name is shared but the meaning differs, the help says so: above all the batch (``-b`` /
``--batch-size``: the global batch here, per process in timm).
"""

from __future__ import annotations

import argparse
import re

# timm --opt name -> (optim.name, optim.nesterov): timm's 'sgd' is Nesterov momentum, 'momentum' is plain
OPTIMIZERS = {"sgd": ("sgd", True), "nesterov": ("sgd", True), "momentum": ("sgd", False), "adam": ("adam", None),
              "adamw": ("adamw", None), "lion": ("lion", None), "muon": ("muon", None)}
# timm --opt names vitkit has no optimizer for -> the nearest --opt it has
NEAREST_OPTIMIZERS = {
    **dict.fromkeys(("lamb", "lambc", "nadamw", "adamp", "adan", "adanw", "adopt", "laprop", "mars", "adafactor",
                     "adafactorbv", "novograd", "nvnovograd", "madgradw", "kron"), "adamw"),
    **dict.fromkeys(("nadam", "radam", "adamax", "adabelief", "radabelief", "rmsprop", "rmsproptf", "adagrad",
                     "adadelta"), "adam"),
    **dict.fromkeys(("sgdp", "sgdw", "lars", "larc", "nlars", "nlarc", "madgrad"), "sgd"),
}
SCHEDULES = ("cosine", "linear", "constant", "step")  # schedule.decay ('step': --decay-epochs, --decay-rate)
# timm --sched names vitkit has no schedule for -> the nearest it has, and how it differs
NEAREST_SCHEDULES = {"tanh": "cosine", "poly": "linear (poly of power 1)",
                     "multistep": "step (a decay every --decay-epochs, not at milestones)",
                     "plateau": "step (decays at fixed epochs, not when the metric stalls)"}
RA_LEVELS = 10  # timm's RandAugment magnitudes run 0..10 (its _LEVEL_DENOM); vitkit's ra_magnitude 0..30
RA_PROB = 0.5  # timm's RandAugment applies each op it draws with this probability (its 'p' part)
EMA_DECAY = 0.9998  # --model-ema without --model-ema-decay: timm's default decay

# timm flags vitkit has no alias for -> what to use instead (a flag, an override, or why there is none)
TIMM_FORMS = {
    "--momentum": "--set optim.momentum=M",
    "--opt-eps": "--set optim.eps=EPS",
    "--opt-betas": "--set optim.betas=[B1,B2]",
    "--min-lr": "--set schedule.min_lr_ratio=R (a share of --lr, not a rate)",
    "--warmup-lr": "none: warmup starts from 0 (--set schedule.warmup_steps=N or --warmup-epochs)",
    "--lr-base": "--lr (the peak rate itself; vitkit does not scale it by the batch)",
    "--drop": "--set model_args.drop_rate=P",
    "--hflip": "--set augment.hflip=P",
    "--scale": "--set augment.rrc_scale=[LO,HI]",
    "--ratio": "--set augment.rrc_ratio=[LO,HI]",
    "--mixup-prob": "--set augment.mix_prob=P",
    "--crop-pct": "--set data.crop_pct=P",
    "--input-size": "--img-size PX (the channels come from the data)",
    "--in-chans": "none: the channels come from the data",
    "--mean": "none: the mean and std are measured on the training images",
    "--std": "none: the mean and std are measured on the training images",
    "--data-dir": "--data PATH",
    "--dataset": "--data-format FMT",
    "--output": "--out RUN_DIR",
    "--experiment": "--out RUN_DIR",
    "--grad-accum-steps": "--accum-steps N",
    "--log-interval": "--set log_every=N",
    "--log-wandb": "--log wandb",
    "--torchcompile": "--compile",
    "--amp-dtype": "--precision bf16 or fp16",
    "--layer-decay": "--set optim.layer_decay=D (a flag of vitkit finetune)",
    "--cooldown-epochs": "none: the schedules are warmup then cosine, linear, constant or step (--sched)",
    "--color-jitter": "none: vitkit has no colour jitter (--aa rand-mM-nN for RandAugment)",
    "--train-split": "--set data.val_fraction=F (or a folder with train/ and val/)",
    "--val-split": "--set data.val_fraction=F (or a folder with train/ and val/)",
}


def add_timm_aliases(p: argparse.ArgumentParser) -> None:
    """The timm train.py flags that vitkit takes, in a group of their own."""
    g = p.add_argument_group("timm's train.py flags (aliases; docs/train.md compares every shared name)")
    g.add_argument("-b", dest="batch_size", type=int, metavar="B", help="as --batch-size: the GLOBAL batch (all "
                   "processes); in timm -b is per process")
    g.add_argument("-j", dest="workers", type=int, metavar="N", help="as --workers")
    g.add_argument("--opt", metavar="NAME", help="optimizer, timm's names: sgd (Nesterov momentum, as in timm), "
                   "momentum (plain momentum), adam (weight decay as L2, as timm's), adamw, lion, muon (the blocks' "
                   "matrices; AdamW for the rest); timm's others are refused with the nearest of these")
    g.add_argument("--sched", metavar="NAME", help=f"the decay after warmup: {', '.join(SCHEDULES)}")
    g.add_argument("--decay-epochs", type=float, metavar="N", help="--sched step: decay the lr every N epochs "
                   "(schedule.step_every, as a share of the run; default: every 30%% of it)")
    g.add_argument("--decay-rate", type=float, metavar="R", help="--sched step: the factor of each decay "
                   "(schedule.step_rate; default: 0.1)")
    g.add_argument("--warmup-epochs", type=float, metavar="N", help="warmup over N epochs (a run bounded by the "
                   "clock takes schedule.warmup_fraction instead)")
    g.add_argument("--aa", metavar="POLICY", help="RandAugment as timm writes it, e.g. rand-m9-mstd0.5-inc1: m "
                   "magnitude 0..10 (default 10), n ops an image (default 2), mstd the magnitude's noise, inc1 ops "
                   "that grow more severe with it, p each op's probability (default 0.5); on vitkit's 14 ops")
    g.add_argument("--reprob", type=float, metavar="P", help="random erasing probability (augment.erase_prob)")
    g.add_argument("--clip-grad", type=float, metavar="NORM", help="clip the global gradient norm (optim.clip_grad)")
    g.add_argument("--model-ema", action="store_true", default=None, help=f"keep an EMA of the weights (decay "
                   f"{EMA_DECAY} unless --model-ema-decay)")
    g.add_argument("--model-ema-decay", type=float, metavar="DECAY", help="the EMA's decay (as --ema DECAY)")
    g.add_argument("--amp", action="store_true", default=None, help="mixed precision: as --precision bf16 (timm "
                   "defaults to float16: --precision fp16 on CUDA)")
    g.add_argument("--initial-checkpoint", metavar="WEIGHTS", help="start from these weights, a new head for the "
                   "data's classes (init_from)")
    g.add_argument("--pretrained", action="store_true", default=None, help="start from --model's published "
                   "weights (vitkit.io.hub.PRETRAINED; needs vitkit[hub]), a new head for the data's classes")
    g.add_argument("--num-classes", type=int, metavar="N", help="refused: the classes come from the data")


def timm_flags(args) -> dict:
    """The config keys the aliases set (None: not given); a value vitkit lacks is a one-line ConfigError."""
    from ...core.errors import ConfigError

    if getattr(args, "num_classes", None) is not None:
        raise ConfigError("--num-classes: the classes come from the data (its class folders or labels); drop it")
    out: dict = {}
    if args.opt is not None:
        out.update(optimizer(args.opt))
    if args.sched is not None:
        out["schedule.decay"] = schedule(args.sched)
    if args.aa is not None:
        out.update(rand_augment(args.aa))
    if args.pretrained:
        out["init_from"] = pretrained_weights(args)
    decay = args.model_ema_decay if args.model_ema_decay is not None else EMA_DECAY if args.model_ema else None
    out.update({"augment.erase_prob": args.reprob, "optim.clip_grad": args.clip_grad, "ema": decay,
                "schedule.step_rate": args.decay_rate,
                "precision": "bf16" if args.amp else None})
    if args.initial_checkpoint is not None:
        out["init_from"] = args.initial_checkpoint
    return out


# config key -> the timm alias that sets it and vitkit's own flag for it: given both, they must agree
ALIASED = {"precision": ("--amp", "--precision"), "ema": ("--model-ema (or --model-ema-decay)", "--ema")}


def merge_aliases(flags: dict, aliases: dict) -> dict:
    """``flags`` with the keys the timm aliases set (``aliases``, None: not given) laid over them. A key that
    both vitkit's flag and an alias set to different values is a one-line ConfigError naming both, in
    whichever order they were typed: neither silently wins."""
    from ...core.errors import ConfigError

    out = dict(flags)
    for key, value in aliases.items():
        if value is None:
            continue
        if out.get(key) is not None and out[key] != value:
            alias, own = ALIASED.get(key, ("a timm flag", "a vitkit flag"))
            raise ConfigError(f"{alias} and {own} both set {key}, to {value!r} and {out[key]!r}; give one of the two")
        out[key] = value
    return out


def pretrained_weights(args) -> str:
    """--pretrained: the hf-hub name of --model's published weights; refused where it means nothing."""
    from ...core.errors import ConfigError
    from ...io.hub import pretrained_name

    if getattr(args, "checkpoint", None) is not None:
        raise ConfigError("--pretrained: vitkit finetune takes its weights as SOURCE (e.g. hf-hub:ORG/NAME)")
    if args.initial_checkpoint is not None:
        raise ConfigError("--pretrained and --initial-checkpoint both name weights to start from; give one")
    if not getattr(args, "model", None):
        raise ConfigError("--pretrained: name the model whose published weights to start from (--model NAME)")
    return pretrained_name(args.model)


def _known(flag: str, name: str, known, nearest: dict) -> str:
    """``name`` as a key of ``known`` (lower case); one the table of ``nearest`` names, or none at all, refused in
    one line that names the nearest, or the names vitkit has."""
    from ...core.errors import ConfigError

    key = name.lower()
    if key in nearest:
        raise ConfigError(f"{flag}: vitkit has no {name!r}; the nearest it has: {flag} {nearest[key]}")
    if key not in known:
        raise ConfigError(f"{flag}: {name!r} is not one vitkit has; use one of {', '.join(known)}")
    return key


def optimizer(name: str) -> dict:
    """timm's --opt ``name`` -> the config keys it sets; a name vitkit lacks is refused, naming the nearest."""
    key = _known("--opt", name, OPTIMIZERS, NEAREST_OPTIMIZERS)
    out = {"optim.name": OPTIMIZERS[key][0]}
    if OPTIMIZERS[key][1] is not None:
        out["optim.nesterov"] = OPTIMIZERS[key][1]
    return out


def schedule(name: str) -> str:
    """timm's --sched ``name`` -> schedule.decay; a name vitkit lacks is refused, naming the nearest."""
    return _known("--sched", name, SCHEDULES, NEAREST_SCHEDULES)


def rand_augment(text: str) -> dict:
    """timm's --aa 'rand-m9-mstd0.5-inc1' (its parts in any order) -> RandAugment's config keys, each part as
    timm reads it: m the magnitude of RA_LEVELS (default RA_LEVELS), n the ops an image (default 2), mstd the
    std of each op's magnitude, inc1 the ops that grow more severe with it, p each op's probability (default
    RA_PROB). Another policy, or a part vitkit cannot honour, is a one-line ConfigError naming it."""
    from ...core.errors import ConfigError

    parts = text.split("-")
    if parts[0] != "rand":
        raise ConfigError(f"--aa: {text!r}: vitkit has RandAugment (rand-mM-nN-mstdS-inc1), not timm's {parts[0]!r} "
                          "policy; the nearest: --aa rand-m9-mstd0.5-inc1, or --set augment.auto=trivialaugment")
    keys = {"augment.auto": "randaugment", "augment.ra_magnitude": 3 * RA_LEVELS, "augment.ra_ops": 2,
            "augment.ra_magnitude_std": 0.0, "augment.ra_increasing": False, "augment.ra_prob": RA_PROB}
    for part in parts[1:]:
        key, value = re.fullmatch(r"([a-z]*)(.*)", part).groups()
        try:
            keys.update(ra_part(key, value))
        except ValueError as e:
            raise ConfigError(f"--aa: {text!r}: {part!r}: {e}") from None
    return keys


def ra_part(key: str, value: str) -> dict:
    """One part of a timm RandAugment string (``key`` and its ``value``, e.g. 'mstd', '0.5') -> config keys;
    a ValueError says why it cannot be honoured."""
    number = re.fullmatch(r"\d+(\.\d*)?|\.\d+", value)
    if key in ("m", "n", "mstd", "p", "inc") and number is None:
        raise ValueError(f"{key} takes a number")
    if key == "m":
        if not float(value).is_integer() or not 0 <= float(value) <= RA_LEVELS:
            raise ValueError(f"the magnitude is a whole number in 0..{RA_LEVELS} (timm's scale; timm caps larger ones)")
        return {"augment.ra_magnitude": 3 * int(float(value))}  # vitkit's scale is 0..30
    if key == "n":
        if not float(value).is_integer() or float(value) < 1:
            raise ValueError("the ops an image are a whole number >= 1")
        return {"augment.ra_ops": int(float(value))}
    if key == "mstd":
        if float(value) > 100:
            raise ValueError("timm's uniform magnitudes (mstd above 100) are not in vitkit; the nearest: --set "
                             "augment.auto=trivialaugment (one op an image, at a uniform magnitude)")
        return {"augment.ra_magnitude_std": 3 * float(value)}  # on vitkit's 0..30 scale
    if key == "inc":
        if float(value) != 1:
            raise ValueError("timm reads any inc part as inc1 (the increasing ops); write inc1, or leave it out for "
                             "timm's default ops")
        return {"augment.ra_increasing": True}
    if key == "p":
        if not 0 <= float(value) <= 1:
            raise ValueError("each op's probability is in 0..1")
        return {"augment.ra_prob": float(value)}
    raise ValueError("vitkit's RandAugment takes m, n, mstd, inc and p (its ops and their magnitudes' cap are its "
                     "own: no t, mmax or w)")


def timm_hint(flag: str) -> str | None:
    """What to use instead of timm's ``flag`` where vitkit has no alias for it, else None."""
    form = TIMM_FORMS.get(flag)
    if form is None:
        return None
    return f"timm's {flag} has no vitkit counterpart ({form[6:]})" if form.startswith("none: ") else f"use {form}"


__all__ = ["add_timm_aliases", "timm_flags", "merge_aliases", "ALIASED", "rand_augment", "timm_hint", "TIMM_FORMS",
           "OPTIMIZERS", "SCHEDULES", "NEAREST_OPTIMIZERS", "NEAREST_SCHEDULES", "optimizer", "schedule", "ra_part"]

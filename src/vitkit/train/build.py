"""What a run builds from its RunConfig before the first step: the model's config, the data, the model.

``model_config`` resolves the model a run trains, once: the named model (or the model of the
``init_from`` weights) with ``model_args`` laid over it, at ``img_size``. ``init_from`` is a vitkit
checkpoint or run directory, or timm, HF or JAX weights, whose format the container tells and whose
architecture is read from the weights as ``vitkit convert`` reads it (``init_model`` and
``model_args`` supply what the weights do not show). The checks a launcher runs
before it starts any process (``preflight``), the opening of the data (channels, and the size image
folders are decoded at) and the building of the model all take it from there.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

import torch

from ..core.errors import ConfigError, DataError, TrainingError
from ..core.hardware import resolve_device
from ..core.progress import Progress
from ..data import eval_batch
from ..data.splits import decode_short_side, held_out
from ..infer.paths import check_tta_shift, pick_precision
from ..io import checkpoint as ckpt_io
from ..io.hub import resolve_weights
from ..io.preprocess import apply_preprocess
from ..model.config import Preprocess, ViTConfig
from ..model.vit import VisionTransformer, count_params
from .checkpoint import LOCK, RunLock, find_checkpoint, foreign_checkpoint_file
from .config import RunConfig, checked_run_config, read_run_config
from .metrics import check_loggers


def model_config(cfg: RunConfig, init: tuple[VisionTransformer, dict] | None = None,
                 resume_from: Path | None = None) -> ViTConfig:
    """The config of the model ``cfg`` trains. Its head's size comes from the data (``build_model``), so
    a ``num_classes`` in model_args is ignored. Errors name the model, the argument or the checkpoint.
    ``init``: the foreign ``init_from`` weights already read (``read_init``), so that they are read once.
    ``resume_from``: the checkpoint a resumed run continues from, whose config replaces the model's name
    or the ``init_from`` weights (which are then not read at all)."""
    from ..model.variants import get_config

    args = _model_args(cfg)
    if cfg.init_from or resume_from is not None:
        if resume_from is not None:
            mcfg = ckpt_io.read_config(resume_from)[0]
        elif init is not None:
            mcfg = init[0].cfg
        elif (fmt := init_format(cfg)) == "vitkit":
            mcfg = ckpt_io.read_config(ckpt_io.resolve_checkpoint(resolve_weights(cfg.init_from)))[0]
        else:
            mcfg = read_init(cfg, fmt)[0].cfg
        try:
            mcfg = mcfg.replace(**args)
        except ConfigError as e:
            raise ConfigError(f"model_args: {e}") from None
        return low_size_checked(cfg, mcfg.replace(img_size=cfg.img_size) if cfg.img_size else mcfg)
    get_config(cfg.model)  # an unknown name first, then its arguments
    if cfg.img_size:
        args["img_size"] = cfg.img_size
    return low_size_checked(cfg, get_config(cfg.model, **args))


def _model_args(cfg: RunConfig) -> dict:
    return {k: v for k, v in cfg.model_args.items() if k != "num_classes"}


def low_size_checked(cfg: RunConfig, mcfg: ViTConfig) -> ViTConfig:
    """``mcfg``, taking any multiple of its patch size where the run trains part of the time at
    augment.low_size (progressive resizing), which must be such a multiple and below the model's size."""
    low = cfg.augment.low_size
    if not low:
        return mcfg
    h, w = mcfg.img_size
    if low % mcfg.patch_size:
        raise ConfigError(f"augment.low_size: {low} is not a multiple of the model's patch size {mcfg.patch_size}")
    if low >= min(h, w):
        raise ConfigError(f"augment.low_size: {low} is not below the model's image size {h}x{w}")
    return mcfg if mcfg.dynamic_img_size else mcfg.replace(dynamic_img_size=True)


def init_format(cfg: RunConfig) -> str:
    """The format of the ``init_from`` weights ('vitkit', 'timm', 'hf' or 'jax'), told by the container.
    A named model (``init_model``) describes foreign weights only: a vitkit checkpoint has its config."""
    from ..io.convert import detect_format

    fmt = detect_format(cfg.init_from)
    if fmt == "vitkit" and cfg.init_model:
        raise ConfigError(f"init_model: {cfg.init_from} is a vitkit checkpoint, which carries its architecture; "
                          "init_model describes timm, HF or JAX weights")
    return fmt


def read_init(cfg: RunConfig, fmt: str | None = None) -> tuple[VisionTransformer, dict]:
    """The model of the timm, HF or JAX ``init_from`` weights, at their own size and head, and the report
    of the read (``io.convert.describe``): ``init_model`` and ``model_args`` supply what they do not show.
    ``fmt``: their format (``init_format``), when it is known already."""
    from ..io.convert import read

    fmt = fmt or init_format(cfg)
    overrides = {**_model_args(cfg), **({"preprocess": cfg.preprocess} if cfg.preprocess else {})}
    model, info = read(cfg.init_from, fmt, model_name=cfg.init_model, overrides=overrides)
    report = {"src": cfg.init_from, "from": info["format"], "config": model.cfg.to_dict(),
              "params": count_params(model), "assumed": info["assumed"], "preprocess": model.preprocess.to_dict(),
              "preprocess_from": info["preprocess_from"], "preprocess_assumed": info["preprocess_assumed"]}
    return model, report


def foreign_init(cfg: RunConfig, resume_from: Path | None) -> tuple[VisionTransformer, dict] | None:
    """The timm, HF or JAX ``init_from`` weights a new run starts from, read once (``read_init``) for the
    model's config and the model; None for a resumed run, a vitkit checkpoint or no weights."""
    if cfg.init_from and resume_from is None and (fmt := init_format(cfg)) != "vitkit":
        return read_init(cfg, fmt)
    return None


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """A new run needs a directory that holds no run yet: a new or empty one, or the folder of a vitkit run
    that saved no checkpoint (its config.json reads back as a run's); --resume continues one in place. A
    folder holding files vitkit did not write is refused, naming one, so that nothing of the user's is
    replaced: neither the names a run writes (config.json, metrics.jsonl, ...) nor anything inside last/
    and best/, which each checkpoint replaces whole."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"out: {run_dir} exists and is not a directory")
    if not resume and find_checkpoint(run_dir, "last") is not None:
        raise TrainingError(
            f"{run_dir}: already holds a run (last/ checkpoint); continue it with --resume {run_dir} "
            "or choose another --out"
        )
    if not run_dir.is_dir():
        return
    RunLock(run_dir).check()  # a run another process holds is not touched, not even its config.json
    if not resume:
        _check_run_config_file(run_dir)
    if (foreign := foreign_checkpoint_file(run_dir)) is not None:
        raise ConfigError(f"{'' if resume else 'out: '}{foreign} was not written by vitkit, and each checkpoint "
                          f"replaces {run_dir / foreign.relative_to(run_dir).parts[0]} whole; move it away"
                          + ("" if resume else " or choose another --out"))


def _check_run_config_file(run_dir: Path) -> None:
    """A folder a new run may take: empty (but for what a killed run leaves: its lock, temporary checkpoints),
    or a vitkit run's, told by its config.json reading back as a run config."""
    config = run_dir / "config.json"
    if not os.path.lexists(config):
        mine = [p for p in sorted(run_dir.iterdir()) if not _left_by_a_run(p.name)]
        if mine:
            raise ConfigError(f"out: {run_dir} is not empty and not a vitkit run folder ({mine[0]} was not "
                              "written by vitkit); choose a new or empty folder as --out")
        return
    try:
        if config.is_symlink() or not config.is_file():
            raise ConfigError("not a regular file")
        checked_run_config(read_run_config(config), config)
    except ConfigError as e:
        why = str(e).removeprefix(f"{config}: ").split(";")[0]
        raise ConfigError(f"out: {config} is not a vitkit run's config ({why}), and a run would replace it; "
                          "choose a new or empty folder as --out") from None


def _left_by_a_run(name: str) -> bool:
    """A name a run killed before writing its config.json may leave: its lock or a temporary checkpoint."""
    return name == LOCK or (name.startswith(".") and name.endswith(".tmp"))


def preflight(cfg: RunConfig, run_dir: Path | None = None, resume: bool = False,
              mcfg: ViTConfig | None = None) -> ViTConfig:
    """The checks that need no data: the config's values (augmentation included), the loggers' packages,
    the device and precision, the run directory, the model (its name and arguments, or the checkpoint to
    start from; resuming, the run's last checkpoint; ``mcfg``: the model's config resolved already, so
    that its weights are not read again), and the test-time shift against the model's input size
    (``check_views``). A launcher runs them once, before it starts any process. Returns the model's config."""
    cfg.validate()
    check_loggers(cfg.loggers)
    pick_precision(cfg.precision, resolve_device(cfg.device))
    resume_from = None
    if run_dir is not None:
        check_run_dir(Path(run_dir), resume)
        resume_from = find_checkpoint(Path(run_dir), "last") if resume else None
    mcfg = mcfg if mcfg is not None else model_config(cfg, resume_from=resume_from)
    check_views(cfg, mcfg)
    return mcfg


def check_views(cfg: RunConfig, mcfg: ViTConfig) -> None:
    """The run's test-time shift against the input size of the model it trains (``mcfg``): refused before
    training, not when the run's evaluation first moves an image."""
    if cfg.tta and cfg.tta_shift:
        check_tta_shift(cfg.tta_shift, mcfg.img_size)


# ============================================================================================== data
def open_data(cfg: RunConfig, mcfg: ViTConfig, say: Callable[[str], None], progress: Progress | None = None,
              cache_dir: str | Path | None = None, cached_only: bool = False):
    """The run's DataSplits with ``mcfg``'s channels. Image folders, which may mix sizes, keep whole images
    at a short side a little larger than the model's (``decode_short_side``), so that training crops are
    drawn from the whole image, unless data.img_size sets one size (shown on ``progress``; read back from
    ``cache_dir`` when it holds them). Data with neither a validation nor a test part gives 10% of its
    training images to a validation split, so that the run reports an accuracy. ``cached_only``: what the
    cache holds, else ``data.cache.CacheMiss`` (``open_dataset``)."""
    from ..data import open_dataset

    d = cfg.data
    size = (d.img_size, d.img_size) if d.img_size else None
    short = None
    if size is None and _is_image_folder(d.path, d.format):
        short = d.short_side or decode_short_side(mcfg.img_size, d.crop_pct)
    splits = open_dataset(d.path, d.format, channels=mcfg.in_chans, img_size=size, val_fraction=d.val_fraction,
                          seed=cfg.seed, strict=d.strict, in_memory=d.in_memory, progress=progress,
                          short_side=short, cache_dir=cache_dir, cached_only=cached_only)
    if (line := held_out(splits, cfg.seed, where=str(d.path))) is not None:
        say(line)
    return splits


def eval_crop(pre: Preprocess, train_set, img_size: tuple[int, int], crop_pct: float) -> Preprocess:
    """``pre`` with the data's eval crop ratio when the training images are not stored at the model's size
    (whole images at a short side): evaluation, and the tools that load the model, then resize the short
    side to size / crop_pct and take the centre crop. Images stored at one size, the model's, keep ``pre``."""
    if getattr(train_set, "short_side", None) is None:
        return pre
    if getattr(train_set, "images", None) is not None and tuple(train_set.size) == tuple(img_size):
        return pre
    return dataclasses.replace(pre, crop_pct=crop_pct)


def _is_image_folder(path: str | None, fmt: str | None) -> bool:
    from ..data.datasets import detect_dataset_format

    if path is None or not Path(path).is_dir():
        return False
    try:
        fmt = fmt or detect_dataset_format(Path(path))[0]
    except DataError:
        return False  # open_dataset says what is wrong
    return fmt in ("folder", "split-folder")


def check_classes(splits, run_dir: Path, resumed_classes: list[str] | None, say: Callable[[str], None]) -> list[str]:
    """The data's class names, once they are fit to train on: two or more, each with training images,
    and (resuming) the run's own."""
    classes = list(splits.classes)
    if len(classes) < 2:
        raise DataError(f"training set: found {len(classes)} class; a classifier needs at least 2")
    if resumed_classes is not None and list(resumed_classes) != classes:
        raise TrainingError(
            f"{run_dir}: the data's classes ({_short(classes)}) differ from the run's ({_short(resumed_classes)}); "
            "resume needs the same classes (start a new run, or fine-tune from the checkpoint)"
        )
    counts = torch.bincount(splits.train.labels, minlength=len(classes)).tolist()
    empty = [c for c, n in zip(classes, counts) if n == 0]
    skipped = getattr(splits, "skipped", None) or []
    if empty:
        raise DataError(
            f"training set: class {empty[0]!r} has no images"
            + (f" ({len(skipped)} unreadable file(s) were skipped, e.g. {skipped[0][0]})" if skipped else "")
            + "; every class needs training images"
        )
    if skipped:
        say(f"skipped {len(skipped)} unreadable file(s), e.g. {skipped[0][0]}: {skipped[0][1]}")
    return classes


def _short(names) -> str:
    names = list(names)
    return ", ".join(names[:4]) + (f", ... ({len(names)})" if len(names) > 4 else "")


def data_preprocess(images, channels: int, max_images: int = 10000) -> Preprocess:
    """Normalisation constants measured on (up to ``max_images`` of) the training images."""
    ragged = getattr(images, "ragged", None)
    if getattr(images, "images", None) is None and ragged is None:
        return Preprocess().for_channels(channels)
    n = len(images)
    pick = torch.linspace(0, n - 1, max_images).long() if n > max_images else torch.arange(n)
    if ragged is not None:  # images of different sizes
        mean, std = _channel_stats(ragged.take(pick))
    else:
        x = images.images
        if n > max_images:
            x = x[pick]
        x = x.float().div_(255).transpose(0, 1).reshape(x.shape[1], -1)  # (C, N*H*W)
        mean, std = x.mean(1), x.std(1)
    r = lambda t: tuple(round(float(v), 4) for v in t)  # noqa: E731
    return Preprocess(mean=r(mean), std=r(std.clamp_min(1e-3)), crop_pct=1.0, interpolation="bilinear")


def _channel_stats(images: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (unbiased) std of uint8 images of different sizes, in [0, 1]: sums in float64,
    one image at a time (a float copy of them all could take gigabytes)."""
    s = s2 = torch.zeros(images[0].shape[0], dtype=torch.float64)
    n = 0
    for img in images:
        px = img.reshape(img.shape[0], -1).double().div_(255)
        s, s2, n = s + px.sum(1), s2 + (px * px).sum(1), n + px.shape[1]
    mean = s / n
    return mean, ((s2 - n * mean * mean) / max(n - 1, 1)).clamp_min(0).sqrt()


# ============================================================================================= model
def build_model(cfg: RunConfig, mcfg: ViTConfig, classes: list[str],
                say: Callable[[str], None] = lambda m: None,
                init: tuple[VisionTransformer, dict] | None = None) -> VisionTransformer:
    """The model ``mcfg`` describes with a head for ``classes``: initialised from ``cfg.seed`` (the same
    seed, the same weights), or (``init_from``) the backbone of those weights with a new head; foreign
    weights are described with ``say`` (what was read, what was assumed). ``init``: the foreign weights
    already read (``read_init``)."""
    if cfg.init_from:
        return _from_weights(cfg, mcfg, classes, say, init)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = VisionTransformer(mcfg.replace(num_classes=len(classes)))
    model.labels = list(classes)
    return model


def _from_weights(cfg: RunConfig, mcfg: ViTConfig, classes: list[str], say: Callable[[str], None],
                  init: tuple[VisionTransformer, dict] | None) -> VisionTransformer:
    # the weights at their own size and head, then (fine-tuning) a new, zero-initialised head for the new
    # classes (the old one never fits) and position embeddings resampled to mcfg's size
    fmt = init_format(cfg) if init is None else None
    if fmt == "vitkit":
        ckpt = ckpt_io.resolve_checkpoint(resolve_weights(cfg.init_from))
        saved, pre, _, _ = ckpt_io.read_config(ckpt)
        weights = ckpt_io.checkpoint_files(ckpt)[1]
        model = ckpt_io.model_from_state(mcfg.replace(img_size=saved.img_size, num_classes=saved.num_classes),
                                         ckpt_io.read_safetensors(weights), str(weights))
    else:
        from ..io.convert import describe

        model, report = init if init is not None else read_init(cfg, fmt)
        for line in describe(report, hint="--model NAME or --set model_args.KEY=VALUE"):
            say(line)
        pre = model.preprocess
    model.preprocess = pre.for_channels(mcfg.in_chans)
    model.reset_head(len(classes), classes)
    if model.cfg.img_size != mcfg.img_size:
        model.resample_to(mcfg.img_size)
    return model


def prepare_model(cfg: RunConfig, mcfg: ViTConfig, classes: list[str], train_set,
                  resume_from: Path | None = None, say: Callable[[str], None] = lambda m: None,
                  init: tuple[VisionTransformer, dict] | None = None) -> VisionTransformer:
    """The model a run starts from: built (``init``: the foreign ``init_from`` weights already read), or,
    resuming, the resumed checkpoint's weights and preprocess (``init_from`` is not read); a new run from
    scratch normalises with constants measured on its training images. Gradient checkpointing is set as
    the run asks."""
    if resume_from is not None:
        state = ckpt_io.read_safetensors(ckpt_io.checkpoint_files(resume_from)[1])
        model = ckpt_io.model_from_state(mcfg.replace(num_classes=len(classes)), state, str(resume_from))
        model.preprocess = ckpt_io.read_config(resume_from)[1]
    else:
        model = build_model(cfg, mcfg, classes, say, init)
    model.set_grad_checkpointing(cfg.grad_checkpointing)
    if cfg.init_from or resume_from is not None:
        tune(cfg, model, len(train_set), say)
    if resume_from is None and not cfg.init_from:
        model.preprocess = data_preprocess(train_set, model.cfg.in_chans)
    if resume_from is None:
        model.preprocess = eval_crop(model.preprocess, train_set, model.cfg.img_size, cfg.data.crop_pct)
        model.preprocess = apply_preprocess(model.preprocess, cfg.preprocess, "preprocess").for_channels(
            model.cfg.in_chans)
        if model.cfg.stem_whiten and not cfg.init_from:  # filters from the images as evaluation prepares them
            fit_whitening(model, train_set)
    model.labels = classes
    return model


def tune(cfg: RunConfig, model: VisionTransformer, images: int, say: Callable[[str], None]) -> None:
    """Freeze what a fine-tuning run does not train (``train.tune``): 'auto' not yet settled (a run not
    resolved by ``train.resolve``) is settled here from the training images."""
    from .tune import freeze_for, settle_tune

    if cfg.tune == "auto":
        say(settle_tune(cfg, model.cfg, images))
    if cfg.tune != "full":
        trainable = freeze_for(model, cfg.tune, cfg.tune_blocks)
        say(f"fine-tuning {cfg.tune}: {trainable / 1e6:.3g}M of {count_params(model) / 1e6:.3g}M parameters train")


def fit_whitening(model: VisionTransformer, images, max_images: int = 5000) -> None:
    """Set the conv stem's whitening filters from (up to ``max_images`` of) the training images, prepared
    as the model sees them at evaluation (its size and normalisation). Deterministic: the same images,
    the same filters, on every process."""
    n = len(images)
    x = images.get_batch(torch.linspace(0, n - 1, min(n, max_images)).long())[0]  # spread over the set
    model.patch_embed.set_whitening(eval_batch(x, model.cfg.img_size, model.preprocess))


__all__ = ["model_config", "init_format", "read_init", "foreign_init", "preflight", "check_run_dir", "open_data",
           "eval_crop", "check_classes", "check_views", "data_preprocess",
           "build_model", "prepare_model", "tune", "fit_whitening"]

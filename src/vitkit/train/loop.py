"""The training loop: ``train`` (build everything from a RunConfig and fit) and ``evaluate``.

    data (ImageSet, uint8) -> BatchLoader (seeded order, rank slice) -> BatchAugment (seeded per step)
      -> autocast forward/backward (micro-batches) -> clip -> optimizer step -> EMA
      -> metrics.jsonl, progress bar, checkpoints (last/ periodically, best/ on validation)

Exact resume: the data order depends on (seed, epoch), the augmentation of step s on (seed, s, rank),
and the dropout RNG, optimizer and EMA states are saved with every checkpoint, so a run stopped at
any checkpoint and resumed reaches the same weights as an uninterrupted run (no wall-clock budget).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..config import Preprocess
from ..errors import ConfigError, DataError, TrainingError
from ..io import checkpoint as ckpt_io
from ..model import VisionTransformer
from .checkpoint import (
    RunLock,
    cleanup_temp,
    find_checkpoint,
    load_trainer_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
    write_json,
)
from .config import RunConfig
from .distributed import DistInfo, all_gather_object, all_reduce_sum, barrier, broadcast_buffers, init_process_group
from .loader import BatchLoader, micro_batches
from .optim import build_optimizer
from .schedule import Schedule
from ..runtime import autocast, count_params, pick_precision, resolve_device

STATE_VERSION = 1


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """A new run needs a directory that holds no run yet; --resume continues one in place."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"out: {run_dir} exists and is not a directory")
    if not resume and find_checkpoint(run_dir, "last") is not None:
        raise TrainingError(
            f"{run_dir}: already holds a run (last/ checkpoint); continue it with --resume {run_dir} "
            "or choose another --out"
        )


def preflight(cfg: RunConfig, run_dir: Path | None = None, resume: bool = False) -> None:
    """The checks that need no data: the config's values, the device and precision, the model's name and
    arguments, the checkpoint to start from. A launcher runs them once, before it starts any process."""
    from ..variants import get_config

    cfg.validate()
    pick_precision(cfg.precision, resolve_device(cfg.device))
    if run_dir is not None:
        check_run_dir(Path(run_dir), resume)
    if cfg.init_from:
        ckpt_io.resolve_checkpoint(cfg.init_from)
        return
    args = {k: v for k, v in cfg.model_args.items() if k != "num_classes"}
    if cfg.img_size:
        args["img_size"] = cfg.img_size
    get_config(cfg.model)  # an unknown name first, then its arguments
    get_config(cfg.model, **args)


# ============================================================================================= model
def build_model(cfg: RunConfig, num_classes: int, classes: list[str]) -> VisionTransformer:
    """A fresh named model, or (``init_from``) a checkpoint's backbone with a new head, at ``img_size``."""
    from ..variants import get_config

    args = dict(cfg.model_args)
    args.pop("num_classes", None)
    if cfg.init_from:
        ckpt = ckpt_io.resolve_checkpoint(cfg.init_from)
        mcfg, pre, _, _ = ckpt_io.read_config(ckpt)
        state = ckpt_io.read_safetensors(ckpt / ckpt_io.WEIGHTS)
        try:
            mcfg = mcfg.replace(**args)
        except ConfigError as e:
            raise ConfigError(f"model_args: {e}") from None
        src = VisionTransformer(mcfg)
        ckpt_io.load_weights(src, state, str(ckpt / ckpt_io.WEIGHTS))
        src.preprocess = pre.for_channels(mcfg.in_chans)
        # fine-tuning: a new, zero-initialised head for the new classes (the old one never fits)
        src.reset_head(num_classes, classes)
        if cfg.img_size and (cfg.img_size, cfg.img_size) != tuple(mcfg.img_size):
            src.resample_to(cfg.img_size)
        return src
    get_config(cfg.model)  # a clear error for an unknown name before anything else
    if cfg.img_size:
        args["img_size"] = cfg.img_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = VisionTransformer(get_config(cfg.model, num_classes=num_classes, **args))
    model.labels = list(classes)
    return model


def data_preprocess(images, channels: int, max_images: int = 10000) -> Preprocess:
    """Normalisation constants measured on (up to ``max_images`` of) the training images."""
    if getattr(images, "images", None) is None:
        return Preprocess().for_channels(channels)
    x = images.images
    if len(x) > max_images:
        x = x[torch.linspace(0, len(x) - 1, max_images).long()]
    x = x.float().div_(255).transpose(0, 1).reshape(x.shape[1], -1)  # (C, N*H*W)
    mean = x.mean(1)
    std = x.std(1).clamp_min(1e-3)
    r = lambda t: tuple(round(float(v), 4) for v in t)  # noqa: E731
    return Preprocess(mean=r(mean), std=r(std), crop_pct=1.0, interpolation="bilinear")


# ============================================================================================== eval
@torch.no_grad()
def evaluate(model, images, device: torch.device, precision: str = "fp32", batch_size: int = 256,
             dist: DistInfo = DistInfo()) -> dict:
    """Loss and top-1 accuracy of ``model`` on an ImageSet (sharded over processes, summed)."""
    from ..data import eval_batch

    base = ckpt_io.unwrap(model)
    was_training = base.training
    base.eval()
    broadcast_buffers(base, dist)  # every shard is scored with the buffers rank 0's checkpoint holds
    n = len(images)
    idx_all = torch.arange(dist.rank, n, dist.world_size)
    sums = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    for i in range(0, len(idx_all), batch_size):
        idx = idx_all[i : i + batch_size]
        if getattr(images, "images", None) is not None:
            x, y = images.images[idx], images.labels[idx]
        else:
            x, y = images.get_batch(idx)
        x = eval_batch(x.to(device), base.cfg.img_size, base.preprocess)
        y = y.to(device)
        with autocast(device, precision):
            logits = base(x)
        logits = logits.float()
        sums[0] += F.cross_entropy(logits, y, reduction="sum").item()
        sums[1] += (logits.argmax(-1) == y).sum().item()
        sums[2] += len(y)
    all_reduce_sum(sums, dist)
    base.train(was_training)
    count = max(sums[2].item(), 1)
    return {"loss": sums[0].item() / count, "acc": sums[1].item() / count, "n": int(sums[2].item())}


# ======================================================================================= the run
@dataclass
class _State:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch
    pos: int = 0  # next batch of the current epoch
    seconds: float = 0.0  # training wall-clock spent (all segments of a resumed run)
    skipped: int = 0  # non-finite steps skipped
    best_acc: float = -1.0  # best validation accuracy so far
    best_step: int = -1
    history: list = field(default_factory=list)  # epoch records (for plots)


def aug_seed(seed: int, step: int, rank: int) -> int:
    return (seed * 2_654_435_761 + step * 40_503 + rank * 9_973 + 1) % (2**63 - 1)


class _Stop(Exception):
    pass


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    dist: DistInfo = DistInfo(),
    resume: bool = False,
    splits=None,
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Train as ``cfg`` says, writing the run directory; return a summary dict.

    ``splits``: a ready DataSplits (else opened from cfg.data). ``stop``: polled every step; when it
    returns True the run saves last/ and returns with status 'interrupted'. ``resume``: continue from
    run_dir/last. Errors are VitkitError subclasses with one-line messages.
    """
    cfg.validate()
    run_dir = Path(run_dir)
    main = dist.is_main
    say = (log or (lambda m: print(m, flush=True))) if main else (lambda m: None)
    device = resolve_device(cfg.device, local_rank=dist.local_rank)
    precision = pick_precision(cfg.precision, device)
    if dist.enabled:
        init_process_group(dist, device)

    lock = RunLock(run_dir)
    if main:
        check_run_dir(run_dir, resume)
        from ..io.atomic import ensure_dir

        ensure_dir(run_dir)  # a file in the way: one line naming it
        lock.acquire()
    try:
        summary = _train(cfg, run_dir, dist, resume, splits, progress, stop or (lambda: False), say, device, precision)
        barrier(dist)  # all ranks end together: none tears its process group down while rank 0 still writes
        return summary
    finally:
        lock.release()


def _train(cfg, run_dir, dist, resume, splits, progress, stop, say, device, precision) -> dict:
    from ..data import BatchAugment, open_dataset
    from ..strict import from_dict
    from ..data import AugmentConfig

    main = dist.is_main
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    acfg = from_dict(AugmentConfig, cfg.augment, "augment")

    # ------------------------------------------------------------------ resume: the saved state first
    ckpt_dir, saved = None, None
    if resume:
        ckpt_dir = find_checkpoint(run_dir, "last")
        if ckpt_dir is None:
            raise TrainingError(f"{run_dir}: nothing to resume (no last/ checkpoint with {('trainer.pt')})")
        saved = load_trainer_state(ckpt_dir)
        if main:
            cleanup_temp(run_dir)

    # -------------------------------------------------------------------------------------- data
    if splits is None:
        from ..variants import get_config

        if cfg.init_from:
            in_chans = ckpt_io.read_config(ckpt_io.resolve_checkpoint(cfg.init_from))[0].in_chans
        else:
            in_chans = get_config(cfg.model, **{k: v for k, v in cfg.model_args.items() if k == "in_chans"}).in_chans
        d = cfg.data
        size = (d.img_size, d.img_size) if d.img_size else None
        if size is None and d.path is not None and Path(d.path).is_dir():
            # image folders may mix sizes: decode them at the model's resolution
            from ..data.datasets import detect_format

            try:
                fmt = d.format or detect_format(Path(d.path))[0]
            except DataError:
                fmt = None  # open_dataset says what is wrong
            if fmt in ("folder", "split-folder"):
                from ..variants import get_config as _gc

                size = (cfg.img_size,) * 2 if cfg.img_size else (
                    ckpt_io.read_config(ckpt_io.resolve_checkpoint(cfg.init_from))[0].img_size if cfg.init_from
                    else _gc(cfg.model, **{k: v for k, v in cfg.model_args.items() if k == "img_size"}).img_size)
        splits = open_dataset(d.path, d.format, channels=in_chans, img_size=size,
                              val_fraction=d.val_fraction, seed=cfg.seed, strict=d.strict, in_memory=d.in_memory)
        if splits.val is None and splits.test is None:
            # nothing held out: carve a validation split, so that the run reports an accuracy
            from ..data.datasets import split_stratified

            splits.train, splits.val = split_stratified(splits.train, 0.1, cfg.seed, where=str(d.path))
            say("no validation or test part in the data: 10% of the training images are held out for validation")
    classes = list(splits.classes)
    K = len(classes)
    if K < 2:
        raise DataError(f"training set: found {K} class; a classifier needs at least 2")
    if saved is not None and list(saved["classes"]) != classes:
        raise TrainingError(
            f"{run_dir}: the data's classes ({_short(classes)}) differ from the run's ({_short(saved['classes'])}); "
            "resume needs the same classes (start a new run, or fine-tune from the checkpoint)"
        )
    train_set = splits.train
    eval_set = splits.val
    counts = torch.bincount(train_set.labels, minlength=K).tolist()
    empty = [c for c, n in zip(classes, counts) if n == 0]
    if empty:
        n_skip = len(getattr(splits, "skipped", None) or [])
        raise DataError(
            f"training set: class {empty[0]!r} has no images"
            + (f" ({n_skip} unreadable file(s) were skipped, e.g. {splits.skipped[0][0]})" if n_skip else "")
            + "; every class needs training images"
        )
    if main and getattr(splits, "skipped", None):
        say(f"skipped {len(splits.skipped)} unreadable file(s), e.g. {splits.skipped[0][0]}: {splits.skipped[0][1]}")

    # ------------------------------------------------------------------------------------- model
    model = build_model(cfg, K, classes)
    if saved is not None:
        ckpt_io.load_weights(model, ckpt_io.read_safetensors(ckpt_dir / ckpt_io.WEIGHTS), str(ckpt_dir))
        model.preprocess = ckpt_io.read_config(ckpt_dir)[1]
    elif not cfg.init_from:
        model.preprocess = data_preprocess(train_set, model.cfg.in_chans)
    model.labels = classes
    model.to(device).train()
    img_size = model.cfg.img_size

    loader = BatchLoader(train_set, cfg.batch_size, cfg.seed, dist, cfg.accum_steps, cfg.data.workers)
    total_steps = cfg.epochs * len(loader)
    budget = cfg.max_minutes * 60 if cfg.max_minutes else None
    opt = build_optimizer(model, cfg.optim, device.type)
    sched = Schedule(cfg.schedule, cfg.optim.lr, total_steps, budget)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    augment = BatchAugment(acfg, img_size, model.preprocess, K)

    ema = None
    if cfg.ema:
        ema = [t.detach().clone().float() for t in model.state_dict().values()]

    st = _State()
    # Dropout / drop path draw from the global RNG: seeded per process, restored on resume.
    torch.manual_seed(cfg.seed + 1000 * dist.rank + 1)
    random.seed(cfg.seed + dist.rank)
    np.random.seed((cfg.seed + dist.rank) % 2**32)
    if saved is not None:
        opt.load_state_dict(saved["optimizer"])
        if saved.get("scaler"):
            scaler.load_state_dict(saved["scaler"])
        if ema is not None and saved.get("ema") is not None:
            ema = [t.to(device) for t in saved["ema"]]
        for k in ("step", "epoch", "pos", "seconds", "skipped", "best_acc", "best_step"):
            setattr(st, k, saved[k])
        st.history = json.loads(saved.get("history", "[]"))
        rngs = saved["rng"]
        set_rng_state(rngs[min(dist.rank, len(rngs) - 1)])
    if ema is not None:
        ema = [t.to(device) for t in ema]

    # ------------------------------------------------------------------------------------ files
    metrics_file = run_dir / "metrics.jsonl"
    if main:
        run_info = cfg.to_dict()
        write_json(run_dir / "config.json", run_info)
        write_json(run_dir / "classes.json", classes)
        _trim_metrics(metrics_file, st.step if saved is not None else 0)
        n_params = count_params(model)
        say(
            f"{'resuming' if saved is not None else 'training'} {cfg.init_from or cfg.model} "
            f"({n_params / 1e6:.2f}M params, {img_size[0]}x{img_size[1]}) on {len(train_set)} images, {K} classes; "
            f"{device.type} {precision}, {dist.world_size} process(es), batch {cfg.batch_size}, "
            f"{cfg.epochs} epochs x {len(loader)} steps"
            + (f", budget {cfg.max_minutes:g} min" if budget else "")
            + (f"; from step {st.step}" if saved is not None else "")
        )

    net = model
    if cfg.compile:
        net = torch.compile(net)
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)

    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator(device=device)
    eval_bs = max(cfg.batch_size // max(cfg.accum_steps, 1), 64)

    def trainer_state() -> dict:
        rngs = all_gather_object(rng_state(), dist)
        return {
            "version": STATE_VERSION,
            "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else None,
            "ema": [t.cpu() for t in ema] if ema is not None else None,
            "rng": rngs,
            "classes": classes,
            "history": json.dumps(st.history),
            "total_steps": total_steps,
            "step": st.step, "epoch": st.epoch, "pos": st.pos, "seconds": st.seconds, "skipped": st.skipped,
            "best_acc": st.best_acc, "best_step": st.best_step,
        }

    def save(name: str, with_state: bool = True, weights: str = "raw", extra: dict | None = None):
        ts = trainer_state() if with_state else None  # a collective in DDP: every rank takes part
        if main:
            target = model
            if weights == "ema" and ema is not None:
                target = _ema_model(model, ema)
            info = {"train": {"step": st.step, "epoch": st.epoch, **(extra or {})}}
            save_checkpoint(run_dir, name, target, ts, extra=info)
        barrier(dist)

    # ------------------------------------------------------------------------------------- loop
    bar = None
    if main and progress:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, initial=st.step, file=sys.stderr, unit="step", dynamic_ncols=True,
                   leave=False, smoothing=0.1)
    status = "completed"
    seg_start = time.perf_counter() - st.seconds
    window = {"loss": 0.0, "n": 0, "correct": 0.0, "seen": 0, "t": time.perf_counter()}
    last_lr = 0.0
    eval_model = lambda: _ema_model(model, ema).to(device) if ema is not None else model  # noqa: E731

    try:
        while st.epoch < cfg.epochs:
            for s, xb, yb in loader.epoch(st.epoch, st.pos):
                st.seconds = time.perf_counter() - seg_start
                if sched.done(st.step, st.seconds) and not dist.enabled:
                    break  # e.g. resuming a run whose budget is already spent
                last_lr = sched.apply(opt, st.step, st.seconds)
                gen.manual_seed(aug_seed(cfg.seed, st.step, dist.rank))
                xb = xb.to(device, non_blocking=True)
                yb = yb.to(device, non_blocking=True)
                x, t = augment(xb, yb, gen)
                loss_sum = torch.zeros((), device=device)
                correct = torch.zeros((), device=device)
                parts = micro_batches(x, t, cfg.accum_steps)
                for i, (xm, tm) in enumerate(parts):
                    sync = not (dist.enabled and i < len(parts) - 1)
                    ctx = contextlib.nullcontext() if sync else net.no_sync()
                    with ctx:
                        with autocast(device, precision):
                            logits = net(xm)
                        logits = logits.float()
                        if tm.dtype == torch.int64:
                            loss = F.cross_entropy(logits, tm)
                            hard = tm
                        else:
                            loss = torch.sum(-tm * F.log_softmax(logits, -1), -1).mean()
                            hard = tm.argmax(-1)
                        scaler.scale(loss / len(parts)).backward()
                    loss_sum += loss.detach() / len(parts)
                    correct += (logits.detach().argmax(-1) == hard).sum()
                gnorm = torch.zeros((), device=device)
                if cfg.optim.clip_grad:
                    scaler.unscale_(opt)
                    gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.clip_grad)
                bad_grad = (not torch.isfinite(gnorm)) and not scaler.is_enabled()
                # one collective per step: loss, non-finite flag, stop request, time (every rank decides alike)
                flags = torch.tensor(
                    [loss_sum.item(), float(not math.isfinite(loss_sum.item()) or bad_grad), float(bool(stop())),
                     time.perf_counter() - seg_start], dtype=torch.float64)
                all_reduce_sum(flags, dist)
                w = dist.world_size
                step_loss, nonfinite, stop_req, st.seconds = flags[0].item() / w, flags[1].item() > 0, flags[2].item() > 0, flags[3].item() / w
                if nonfinite:
                    opt.zero_grad(set_to_none=True)
                    st.skipped += 1
                    if st.skipped > cfg.skip_nonfinite:
                        last = find_checkpoint(run_dir, "last")
                        keep = (f"the last good checkpoint {last} (step {_ckpt_step(last)}) is kept"
                                if last else "no checkpoint had been saved yet")
                        what = "loss" if not math.isfinite(step_loss) else "gradient norm"
                        raise TrainingError(
                            f"{what} is {step_loss if what == 'loss' else gnorm.item()} at step {st.step + 1} "
                            f"(epoch {st.epoch + 1}); stopped; {keep}. Lower --lr, or allow skipping with "
                            "--skip-nonfinite N"
                        )
                    say(f"warning: non-finite loss/gradients at step {st.step + 1}; step skipped "
                        f"({st.skipped}/{cfg.skip_nonfinite})")
                else:
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad(set_to_none=True)
                    if ema is not None:
                        _ema_update(ema, model, ema_decay(cfg.ema, st.step))
                    window["loss"] += step_loss
                    window["n"] += 1
                    window["correct"] += correct.item()
                    window["seen"] += len(xb)
                st.step += 1
                st.pos = s + 1
                if bar is not None:
                    bar.update(1)
                if st.step % cfg.log_every == 0 and window["n"]:
                    _log_step(metrics_file if main else None, st, window, last_lr, bar, dist)
                if cfg.ckpt_every and st.step % cfg.ckpt_every == 0:
                    save("last")
                if stop_req:
                    raise _Stop()
                if sched.done(st.step, st.seconds):
                    break
            else:
                # the epoch ran to its end
                st.epoch += 1
                st.pos = 0
                if main:
                    _append(metrics_file, {"type": "epoch", "epoch": st.epoch, "step": st.step,
                                           "seconds": round(st.seconds, 2), "lr": last_lr})
                if cfg.eval_every and eval_set is not None and st.epoch % cfg.eval_every == 0 and st.epoch < cfg.epochs:
                    _validate(eval_model(), eval_set, device, precision, eval_bs, dist, st, metrics_file, say, save,
                              cfg, main)
                save("last")
                continue
            break  # the budget or the step count is spent
    except _Stop:
        status = "interrupted"
    finally:
        if bar is not None:
            bar.close()

    st.seconds = time.perf_counter() - seg_start
    train_seconds = st.seconds
    if status == "interrupted":
        save("last")
        say(f"stopped at step {st.step} (epoch {st.epoch + 1}); saved {run_dir / 'last'}; "
            f"continue with: vitkit train --resume {run_dir}")
        return {"status": status, "step": st.step, "epoch": st.epoch, "run_dir": str(run_dir),
                "train_seconds": round(train_seconds, 2)}

    # ------------------------------------------------------------------------------------- end
    save("last")
    final = eval_model()
    summary: dict = {"status": status, "run_dir": str(run_dir), "step": st.step,
                     "epochs": round(st.epoch + st.pos / max(len(loader), 1), 3),
                     "train_seconds": round(train_seconds, 2), "device": device.type, "precision": precision,
                     "processes": dist.world_size}
    if eval_set is not None:
        r = _validate(final, eval_set, device, precision, eval_bs, dist, st, metrics_file, say, save, cfg, main,
                      final_eval=True)
        summary["val_acc"] = round(r["acc"], 5)
        summary["val_loss"] = round(r["loss"], 5)
        summary["best_val_acc"] = round(st.best_acc, 5)
    else:
        save("best", with_state=False, weights="ema" if ema is not None else "raw")
    if splits.test is not None:
        if eval_set is not None and st.best_step != st.step:
            # best/ is an earlier model: report the test accuracy of what `vitkit.load(run_dir)` gives
            best_model = _load_best(model, run_dir, dist).to(device)
            r = evaluate(best_model, splits.test, device, precision, eval_bs, dist)
            summary["test_acc_final"] = round(evaluate(final, splits.test, device, precision, eval_bs, dist)["acc"], 5)
        else:
            r = evaluate(final, splits.test, device, precision, eval_bs, dist)
        summary["test_acc"] = round(r["acc"], 5)
        summary["test_loss"] = round(r["loss"], 5)
    summary["total_seconds"] = round(time.perf_counter() - t_start, 2)
    summary["cpu_seconds"] = round(time.process_time() - cpu_start, 1)  # this process, all threads
    if main:
        _append(metrics_file, {"type": "final", **summary})
        write_json(run_dir / "summary.json", summary)
        note = write_plots(run_dir) if cfg.plots else None
        if note:
            say(note)
    return summary


# ======================================================================================== helpers
def _short(names) -> str:
    names = list(names)
    return ", ".join(names[:4]) + (f", ... ({len(names)})" if len(names) > 4 else "")


def _ckpt_step(path) -> str:
    try:
        return str(json.loads((Path(path) / ckpt_io.CONFIG).read_text())["train"]["step"])
    except Exception:  # noqa: BLE001
        return "?"


def _validate(model, eval_set, device, precision, bs, dist, st, metrics_file, say, save, cfg, main, final_eval=False):
    r = evaluate(model, eval_set, device, precision, bs, dist)
    improved = r["acc"] > st.best_acc
    if improved:
        st.best_acc, st.best_step = r["acc"], st.step
    rec = {"type": "eval", "split": "val", "epoch": st.epoch, "step": st.step, "loss": round(r["loss"], 5),
           "acc": round(r["acc"], 5), "seconds": round(st.seconds, 2)}
    st.history.append(rec)
    if main:
        _append(metrics_file, rec)
        say(f"epoch {st.epoch}: val loss {r['loss']:.4f} acc {r['acc'] * 100:.2f}%"
            + (" (best)" if improved else f" (best {st.best_acc * 100:.2f}% at step {st.best_step})"))
    if improved:
        save("best", with_state=False, weights="ema" if cfg.ema else "raw", extra={"val_acc": r["acc"]})
    return r


def _load_best(model, run_dir, dist):
    import copy

    best = copy.deepcopy(model).cpu()
    d = run_dir / "best"
    barrier(dist)
    ckpt_io.load_weights(best, ckpt_io.read_safetensors(d / ckpt_io.WEIGHTS), str(d))
    return best


def ema_decay(decay: float, step: int) -> float:
    """The EMA decay at optimizer step ``step`` (0-based): min(decay, (1 + step) / (10 + step)).

    A fixed decay of 0.999 averages over the last ~1,000 steps, so early in a run (or all through a
    short one) the average still holds the random initial weights. Warming the decay up lets the
    average follow the weights at first and settle on ``decay`` after a few thousand steps.
    """
    return min(decay, (1.0 + step) / (10.0 + step))


def _ema_update(ema: list, model, decay: float) -> None:
    with torch.no_grad():
        vals = list(model.state_dict().values())
        fl = [(e, v) for e, v in zip(ema, vals) if v.is_floating_point()]
        torch._foreach_lerp_([e for e, _ in fl], [v.float() for _, v in fl], 1.0 - decay)
        for e, v in zip(ema, vals):
            if not v.is_floating_point():
                e.copy_(v)


def _ema_model(model, ema: list):
    import copy

    m = copy.deepcopy(ckpt_io.unwrap(model))
    with torch.no_grad():
        for (k, v), e in zip(m.state_dict().items(), ema):
            v.copy_(e.to(v.dtype))
    return m


def _append(file: Path, rec: dict) -> None:
    try:
        with open(file, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
    except OSError as e:  # a full disk: one line (the checkpoints are written atomically and stay intact)
        import errno

        why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or type(e).__name__)
        raise TrainingError(f"{file}: could not write the training log ({why})") from None


def _trim_metrics(file: Path, step: int) -> None:
    """Drop records written after the checkpoint being resumed (they will be written again)."""
    if not file.exists():
        return
    keep = []
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("step", 0) <= step and rec.get("type") != "final":
            keep.append(line)
    from ..io.atomic import atomic_write_text

    atomic_write_text(file, "".join(l + "\n" for l in keep))


def _log_step(file, st, window, lr, bar, dist):
    now = time.perf_counter()
    dt = max(now - window["t"], 1e-9)
    ips = window["seen"] * dist.world_size / dt
    rec = {"type": "step", "step": st.step, "epoch": st.epoch, "loss": round(window["loss"] / window["n"], 5),
           "train_acc": round(window["correct"] / max(window["seen"], 1), 4), "lr": lr,
           "img_per_s": round(ips, 1), "seconds": round(st.seconds, 2)}
    if file is not None:
        _append(file, rec)
    if bar is not None:
        bar.set_postfix(loss=f"{rec['loss']:.3f}", lr=f"{lr:.2e}", img_s=f"{ips:.0f}", refresh=False)
    window.update(loss=0.0, n=0, correct=0.0, seen=0, t=now)


def write_plots(run_dir: Path) -> str | None:
    """loss.png, accuracy.png and lr.png from metrics.jsonl; a note (and no plots) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "note: matplotlib is not installed, so no plots were written (pip install 'vitkit[plot]')"
    recs = []
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
    steps = [r for r in recs if r.get("type") == "step"]
    evals = [r for r in recs if r.get("type") == "eval"]

    def plot(name, series, ylabel):
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        for label, xs, ys in series:
            if xs:
                ax.plot(xs, ys, label=label, marker="o" if len(xs) < 30 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        from ..io.atomic import atomic_path

        with atomic_path(run_dir / name) as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)

    plot("loss.png", [("train", [r["step"] for r in steps], [r["loss"] for r in steps]),
                      ("val", [r["step"] for r in evals], [r["loss"] for r in evals])], "loss")
    plot("accuracy.png", [("train", [r["step"] for r in steps], [r["train_acc"] for r in steps]),
                          ("val", [r["step"] for r in evals], [r["acc"] for r in evals])], "accuracy")
    plot("lr.png", [("lr", [r["step"] for r in steps], [r["lr"] for r in steps])], "learning rate")
    return None


__all__ = ["train", "evaluate", "build_model", "write_plots"]

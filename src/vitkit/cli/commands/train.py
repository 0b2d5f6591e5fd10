"""`vitkit train`: train a ViT. With no arguments: the built-in digits, the demo recipe.

Values come from the recipe's defaults, then --config (a TOML file, or a run's config.json or run
directory: the run replayed), then the flags, then --set / trailing KEY=VALUE overrides; a key given
both by a flag and by an override is an error. Flags that timm's train.py users know (--img-size,
--weight-decay, --drop-path, --smoothing, --mixup, --cutmix, --workers) set their config keys, as
--set does. The distributed environment (torchrun's RANK, WORLD_SIZE, LOCAL_RANK)
is read here, once, and handed to the library; so are the launcher's own variables (TORCHELASTIC_RUN_ID:
started by torch's launcher; TORCHELASTIC_ERROR_FILE: where a launched process records its error).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys

from ...train.launch import DEFAULT_RDZV_ID
from . import seconds
from .timm_flags import add_timm_aliases, merge_aliases, timm_flags


def _h(text: str, key: str, finetune: bool = False) -> str:
    """Help text with the default value the run takes for config field ``key`` (dotted): the fine-tuning
    defaults for `vitkit finetune`; for `vitkit train`, RunConfig's, and where a recipe chosen for the
    data sets the key, that it may."""
    from ...train.config import FINETUNE_DEFAULTS, RunConfig, merge

    node = merge(RunConfig().to_dict(), FINETUNE_DEFAULTS) if finetune else RunConfig().to_dict()
    for part in key.split("."):
        node = node[part]
    if not finetune and key in recipe_keys():
        return f"{text} (default: {node}, or what the recipe chosen for the data sets)"
    return f"{text} (default: {node})"


def recipe_keys() -> set[str]:
    """The dotted config keys that a recipe chosen for the data, or the demo's budget, may set."""
    from ...train.config import DEMO_BUDGET
    from ...train.recipe import SHORT_RUN, SMALL_DATA

    def leaves(node: dict, prefix: str = "") -> set[str]:
        keys = set()
        for k, v in node.items():
            keys |= leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and k != "model_args" else {prefix + k}
        return keys

    return leaves(SMALL_DATA) | leaves(SHORT_RUN) | leaves(DEMO_BUDGET) | {"epochs", "max_minutes"}


def max_minutes_default(finetune: bool) -> str:
    """What --max-minutes is when not given: the recipe's budget where the recipe sets one."""
    if finetune:
        return "none"
    from ...train.config import DEMO_BUDGET
    from ...train.recipe import SMALL_DATA_MINUTES

    return (f"{SMALL_DATA_MINUTES:g} for the small-data and photos recipes and {DEMO_BUDGET['max_minutes']:g} for the "
            "demo on the built-in digits, none with --epochs, --recipe none, weights to start from or for other data")


def add_model_flags(g, h, finetune: bool) -> None:
    """The model, its resolution and (train) the recipe, in the group ``g`` (``h``: the help with the default)."""
    if not finetune:
        g.add_argument("--model", metavar="NAME", help=h("a named model (`vitkit list`)", "model"))
        g.add_argument("--img-size", type=int, metavar="PX", help="train at this resolution, the model's position "
                       "embeddings resampled (img_size; default: the model's)")
        g.add_argument("--recipe", choices=["auto", "none"], default="auto", help="auto: the recipe chosen for the "
                       "data, laid under the flags (its first line says what it sets); none: RunConfig's defaults "
                       "(default: auto)")
    else:
        g.add_argument("--img-size", type=int, metavar="PX", help="fine-tune at this resolution (img_size; default: "
                       "the checkpoint's); position embeddings are resampled")


def add_common(p: argparse.ArgumentParser, finetune: bool = False) -> None:
    def h(text: str, key: str) -> str:  # the defaults this command's run takes
        return _h(text, key, finetune)

    g = p.add_argument_group("data and model")
    g.add_argument("--data", metavar="PATH", help="image folder, split folder, MNIST IDX or CIFAR folder "
                   "(default: the built-in demo digits)" if not finetune else "the data to fine-tune on")
    g.add_argument("--data-format", metavar="FMT", help="force the dataset format: folder, split-folder, mnist, "
                   "cifar10, cifar100 (default: detected)")
    g.add_argument("--workers", type=int, metavar="N", help="DataLoader workers that decode streamed datasets "
                   "(data.workers; default: one per usable CPU, at most 8; 0: in the training process)")
    g.add_argument("--cache-dir", metavar="DIR", help="keep decoded image folders in DIR, so that the next run on the "
                   "same files starts without decoding them (default: $XDG_CACHE_HOME/vitkit or ~/.cache/vitkit; "
                   "'none': no cache)")
    g.add_argument("--no-cache", action="store_true", help="neither read nor write the decoded-image cache")
    add_model_flags(g, h, finetune)
    g.add_argument("--drop-path", type=float, metavar="P", help="stochastic depth rate (model_args.drop_path_rate; "
                   "default: the model's)")
    g.add_argument("--config", metavar="FILE", help="a TOML run config (see configs/), or a run's config.json or run "
                   "directory to replay that run; flags override it")
    g = p.add_argument_group("schedule")
    g.add_argument("--epochs", type=int, metavar="N", help=h("training epochs", "epochs"))
    g.add_argument("--max-minutes", type=float, metavar="M",
                   help="wall-clock budget: the schedule is fitted to it and training stops when it is spent "
                   f"(default: {max_minutes_default(finetune)}; 0 = none)")
    g.add_argument("--batch-size", type=int, metavar="B",
                   help=h("images per optimizer step, across all processes (timm: per process)", "batch_size"))
    g.add_argument("--accum-steps", type=int, metavar="N", help=h("gradient accumulation steps", "accum_steps"))
    g.add_argument("--lr", type=float, help=h("peak learning rate", "optim.lr"))
    g.add_argument("--weight-decay", type=float, metavar="WD", help=h("decoupled weight decay (optim.weight_decay)",
                                                                       "optim.weight_decay"))
    g.add_argument("--seed", type=int, help=h("random seed", "seed"))
    g.add_argument("--ema", type=float, metavar="DECAY", help="keep and evaluate an EMA of the weights (e.g. 0.999)")
    g.add_argument("--tta", action=argparse.BooleanOptionalAction, default=None, help="score validation and test "
                   "with test-time flip averaging: the mean logits of each image and its mirror (tta)")
    g.add_argument("--tta-shift", type=int, metavar="PX", help=h("with TTA, also average two copies of each image "
                   "moved PX px diagonally, each flip-averaged: six forward passes", "tta_shift"))
    g.add_argument("--smoothing", type=float, metavar="EPS", help=h("label smoothing (augment.label_smoothing)",
                                                                     "augment.label_smoothing"))
    g.add_argument("--mixup", type=float, metavar="ALPHA", help=h("mixup alpha, 0 = off (augment.mixup_alpha)",
                                                                   "augment.mixup_alpha"))
    g.add_argument("--cutmix", type=float, metavar="ALPHA", help=h("cutmix alpha, 0 = off (augment.cutmix_alpha)",
                                                                    "augment.cutmix_alpha"))
    add_hardware_flags(p, h)
    add_launch_flags(p)
    g = p.add_argument_group("run")
    g.add_argument("--out", metavar="RUN_DIR", help="run directory (default: runs/<model>-<date-time>)")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    g.add_argument("--ckpt-every", type=int, metavar="N", help="also save last/ every N steps (default: each epoch)")
    g.add_argument("--eval-every", type=int, metavar="N", help=h("validate every N epochs (0: at the end)", "eval_every"))
    g.add_argument("--skip-nonfinite", type=int, metavar="N", help="skip up to N steps with a NaN/inf loss "
                   "instead of stopping (default: 0)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set optim.weight_decay=0.05 (repeatable)")
    g.add_argument("rest", nargs="*", metavar="KEY=VALUE", help="more overrides, as --set")
    g.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    g.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.set_defaults(config_keys=config_keys)
    add_progress_and_loggers(p)
    add_timm_aliases(p)


def add_hardware_flags(p: argparse.ArgumentParser, h) -> None:
    """Device, precision, layout and processes (``h``: the help text with the run's default)."""
    g = p.add_argument_group("hardware")
    g.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], help=h("device", "device"))
    g.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"],
                   help=h("autocast precision; fp16 (with a gradient scaler) on CUDA only", "precision"))
    g.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    g.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None, help="a conv stem's "
                   "weights and the input batches channels-last (default: where it pays, a conv stem on the CPU)")
    g.add_argument("--grad-checkpointing", action="store_true", default=None, help="recompute each block's "
                   "activations in the backward pass instead of keeping them: less memory, slower steps")
    g.add_argument("--nproc", type=int, metavar="N", help="train with N data-parallel processes on this machine "
                   "(DDP), started by torch's elastic launcher as `torchrun --nproc-per-node=N` starts them (default: "
                   "1; the demo: 2 on a CPU with 2 or more cores)")
    g.add_argument("--strategy", choices=["ddp", "fsdp"], help=h("how the processes share the model: ddp, a "
                   "replica each; fsdp, a shard each of the weights, gradients and optimizer state (large models)",
                   "strategy"))
    g.add_argument("--sync-bn", action=argparse.BooleanOptionalAction, default=None, help="with several "
                   "processes, share BatchNorm statistics across them (default: on CUDA only)")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: the cores not busy "
                   "with other work, divided among the processes of a distributed run)")


# ------------------------------------------------------------------------------- machines
def add_launch_flags(p: argparse.ArgumentParser) -> None:
    """The machines of a run and how its processes meet, as torchrun names them (train/launch.py)."""
    g = p.add_argument_group("several machines and restarts")
    g.add_argument("--nnodes", metavar="N|MIN:MAX", help="train on N machines (or MIN to MAX: elastic), each "
                   "running this command with --nproc processes (default: 1)")
    g.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="where the machines meet: a free port of one of "
                   "them (needed with --nnodes > 1)")
    g.add_argument("--rdzv-backend", metavar="NAME", help="the rendezvous: c10d (default: the first machine at "
                   "the endpoint hosts it) or static (with --node-rank; rank 0's machine hosts it)")
    g.add_argument("--rdzv-id", metavar="ID", help=f"a name the machines of one run share (default: "
                   f"{DEFAULT_RDZV_ID})")
    g.add_argument("--node-rank", type=int, metavar="R", help="this machine's rank, 0..N-1, with --rdzv-backend "
                   "static (the machine of rank 0 holds the run's rank 0, which writes the run directory)")
    g.add_argument("--max-restarts", type=int, metavar="K", help="after a process fails, start every process "
                   "again, up to K times, from the run's last checkpoint (default: 0, no restarts)")
    # what the launcher adds for runs that may start again: a checkpoint in --out is this launch's own
    g.add_argument("--auto-resume", action="store_true", help=argparse.SUPPRESS)
    # what the launcher adds for the processes it starts: the run is resolved in --out's config.json
    g.add_argument("--resolved", action="store_true", help=argparse.SUPPRESS)


def launch_plan_from_args(args, nproc: int):
    """The run's LaunchPlan from the flags above and its processes on this machine."""
    from ...train.launch import launch_plan

    return launch_plan(nproc, nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                       rdzv_backend=args.rdzv_backend, rdzv_id=args.rdzv_id, max_restarts=args.max_restarts)


# ------------------------------------------------------------------------------- progress and loggers
def add_progress_and_loggers(p: argparse.ArgumentParser) -> None:
    """--progress-every and --log (--quiet, which silences the progress, is with the run's flags)."""
    g = p.add_argument_group("progress and loggers")
    g.add_argument("--progress-every", type=seconds, metavar="SECONDS",
                   help=_h("where stderr is not a terminal (a log), a progress line every SECONDS; 0: none",
                           "progress_every"))
    g.add_argument("--log", type=logger_list, metavar="LOGGERS", help="also log the metrics to: csv (metrics.csv), "
                   "tensorboard, wandb (WANDB_MODE and WANDB_PROJECT honoured; offline without credentials), mlflow "
                   "(MLFLOW_TRACKING_URI, else the run's mlflow.db); a comma list, e.g. --log tensorboard,csv "
                   "(metrics.jsonl is always written)")


def progress_and_loggers_flags(args) -> dict:
    """The config keys of the flags above, and of the loggers' environment variables where no override
    sets them (None: not given)."""
    from ..logger_env import logger_settings

    given = list(getattr(args, "overrides", None) or []) + list(getattr(args, "rest", None) or [])
    keys = {item.split("=", 1)[0].strip() for item in given}
    env = {k: v for k, v in logger_settings().items() if k not in keys}
    return {"progress_every": args.progress_every, "loggers": args.log, **env}


def logger_list(text: str) -> list[str]:
    """argparse type of --log: 'tensorboard,csv' -> ['tensorboard', 'csv'] (the config checks the names)."""
    return [name.strip() for name in text.split(",") if name.strip()]


def register(p: argparse.ArgumentParser) -> None:
    add_common(p)


def flags_from_args(args) -> dict:
    f = {
        "data.path": args.data,
        "data.format": args.data_format,
        "data.workers": args.workers,
        "model": getattr(args, "model", None),
        "img_size": args.img_size,
        "model_args.drop_path_rate": args.drop_path,
        "epochs": args.epochs,
        "max_minutes": args.max_minutes,
        "batch_size": args.batch_size,
        "accum_steps": args.accum_steps,
        "optim.lr": args.lr,
        "optim.weight_decay": args.weight_decay,
        "seed": args.seed,
        "ema": args.ema,
        "tta": args.tta,
        "tta_shift": args.tta_shift,
        "augment.label_smoothing": args.smoothing,
        "augment.mixup_alpha": args.mixup,
        "augment.cutmix_alpha": args.cutmix,
        "device": args.device,
        "processes": args.nproc,
        "threads": args.threads,
        "strategy": args.strategy,
        "sync_bn": args.sync_bn,
        "precision": args.precision,
        "compile": args.compile,
        "channels_last": args.channels_last,
        "grad_checkpointing": args.grad_checkpointing,
        "ckpt_every": args.ckpt_every,
        "eval_every": args.eval_every,
        "skip_nonfinite": args.skip_nonfinite,
    }
    f.update(progress_and_loggers_flags(args))
    return merge_aliases(f, timm_flags(args))


def config_keys() -> list[str]:
    """Every dotted key that --set takes (under model_args, the ViTConfig fields), for the hint that an
    unknown flag gets."""
    import dataclasses

    from ...model.config import ViTConfig
    from ...train.config import RunConfig

    def leaves(node: dict, prefix: str = "") -> list[str]:
        keys = []
        for k, v in node.items():
            keys += leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [prefix + k]
        return keys

    fields = [f"model_args.{f.name}" for f in dataclasses.fields(ViTConfig)]
    return [k for k in leaves(RunConfig().to_dict()) if k != "model_args"] + fields


def check_processes(n: int, device: str) -> None:
    """A clear error for process counts the device cannot host (one GPU per process on CUDA; none on MPS)."""
    import torch

    from ...core.errors import ConfigError
    from ...core.hardware import resolve_device

    kind = resolve_device(device).type
    if kind == "cuda" and torch.cuda.device_count() < n:
        raise ConfigError(f"processes: {n} processes need {n} CUDA GPUs (one each); this machine has "
                          f"{torch.cuda.device_count()}")
    if kind == "mps":
        raise ConfigError(f"processes: {n} processes cannot share MPS (no DDP there); use processes = 1 or --device cpu")


def execute(args, weights: str | None = None, extra_flags: dict | None = None) -> int:
    """Resolve the run once; then start the processes of a launched run, or train in this one. A process
    the launcher started records the one-line error that ends it, for the launcher's report."""
    import os

    from ...train.launch import errors_recorded, follow_launcher

    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torch's launcher (vitkit's, or torchrun)
        follow_launcher()
    with errors_recorded(os.environ.get("TORCHELASTIC_ERROR_FILE")):
        return resolve_and_run(args, weights, extra_flags)


def request_from_args(args, weights: str | None = None, extra_flags: dict | None = None):
    """The command line's request (``train.resolve.RunRequest``): ``weights`` to fine-tune from, and the
    flags of a subcommand of its own (``extra_flags``, dotted config keys)."""
    import os

    from ...train.resolve import RunRequest

    return RunRequest(data=args.data, data_format=args.data_format, weights=weights, config=args.config,
                      flags={**flags_from_args(args), **(extra_flags or {})}, overrides=overrides_from_args(args),
                      out=args.out, resume=args.resume, warmup_epochs=args.warmup_epochs,
                      decay_epochs=args.decay_epochs, recipe=getattr(args, "recipe", "auto"),
                      cache_dir=cache_dir(args, os.environ))


def resolve_and_run(args, weights: str | None, extra_flags: dict | None) -> int:
    """The resolved run (``train.resolve.resolve_run``; a process vitkit's launcher started reads it from
    the run's config.json instead); then the launch, or the training in this process."""
    import os
    from pathlib import Path

    from ...core.errors import ConfigError
    from ...train.distributed import DistInfo
    from ...train.resolve import read_resolved, resolve_run

    dist = DistInfo.from_env(os.environ)
    launched = "TORCHELASTIC_RUN_ID" in os.environ
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads: must be >= 1, got {args.threads}")
    if saved_by_this_launch(args):
        args.resume = args.out  # a restarted attempt continues from the run's last checkpoint
    run_dir = Path(args.resume or args.out or ".")
    if launched and getattr(args, "resolved", False) and (run_dir / "config.json").is_file():
        run = read_resolved(run_dir, resume=bool(args.resume))  # the launcher resolved it
    else:
        # a rank other than 0, or the launcher of a run on several machines, may be where the run is not
        local = int(os.environ.get("LOCAL_WORLD_SIZE") or 0) or (dist.world_size if dist.enabled else None)
        run = resolve_run(request_from_args(args, weights, extra_flags), local_processes=local,
                          elsewhere=dist.rank > 0 or args.nnodes is not None)
    if not dist.enabled and not launched:  # a launched process of one trains here
        plan = launch_plan_from_args(args, run.cfg.processes)
        if plan.needs_launcher:  # start the processes; each comes back here as one rank
            return launch_processes(args, run, plan)
    return train_here(args, run, dist)


def saved_by_this_launch(args) -> bool:
    """Whether this process belongs to a launch that may start its processes again (--max-restarts, an
    elastic --nnodes MIN:MAX whose processes restart when a machine joins) and an earlier attempt left a
    checkpoint in the run directory. The launcher checked before its first attempt that the directory
    held none (or was --resume'd), so a checkpoint there is this launch's own."""
    from pathlib import Path

    from ...train.checkpoint import find_checkpoint

    return (getattr(args, "auto_resume", False) and not args.resume and bool(args.out)
            and find_checkpoint(Path(args.out), "last") is not None)


def overrides_from_args(args) -> list[str]:
    """The --set overrides, then the trailing KEY=VALUE ones."""
    from ...core.errors import ConfigError

    overrides = list(args.overrides or [])
    for item in args.rest or []:
        if "=" not in item:
            raise ConfigError(f"unexpected argument {item!r}: overrides are KEY=VALUE (e.g. optim.lr=0.001)")
        overrides.append(item)
    return overrides


def launch_processes(args, run, plan) -> int:
    """Check the run once (one error line, not one per process), write it to the run's config.json where
    this machine holds rank 0, say what was chosen, then start the processes ``plan`` says
    (run.cfg.processes on this machine), which read the run from that file."""
    from ...core.errors import ConfigError
    from ...train.build import preflight
    from ...train.launch import launch
    from ...train.resolve import write_resolved

    run.init = None  # the processes read the weights themselves; the launcher holds no copy while they run
    preflight(run.cfg, run.run_dir, run.resume, run.model)
    check_processes(run.cfg.processes, run.cfg.device)
    argv = list(getattr(args, "argv", None) or [])
    if not argv:
        raise ConfigError("processes: a multi-process run is started from the command line (vitkit train)")
    if not run.resume and not args.out:
        argv += ["--out", str(run.run_dir)]  # every rank must agree on the run directory
    if plan.may_restart:
        argv += ["--auto-resume"]  # a restarted attempt continues from the checkpoint an earlier one saved
    if plan.max_nodes == 1 or plan.node_rank == 0:  # this machine holds rank 0, which owns the run directory
        write_resolved(run)
        argv += ["--resolved"]
    elif args.threads is None:  # elsewhere the processes resolve again (rank 0's config wins when they meet),
        argv += ["--threads", str(run.cfg.threads)]  # on threads counted once while the machine is not busy
    say_notes(args, run)
    return launch(argv, plan, run.run_dir)


def say_notes(args, run) -> None:
    """The lines the main process prints before training: the recipe chosen for the data, and why."""
    if not args.quiet:
        for note in run.notes:
            print(note, flush=True)


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT and SIGTERM ask the run to stop at the next step (it saves last/ and returns); a second
    Ctrl-C gives up at once. Yields the function the run polls; the handlers are removed after."""
    received: list[int] = []

    def on_signal(signum, frame):
        if received and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: give up at once
        received.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(received)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def cache_dir(args, env) -> str | None:
    """The decoded-image cache folder: --cache-dir, else $XDG_CACHE_HOME/vitkit, else ~/.cache/vitkit (as
    ``vitkit.fit`` caches by default: ``data.cache.user_cache``); None with --no-cache or --cache-dir none."""
    import os

    from ...data.cache import user_cache

    if getattr(args, "no_cache", False) or (args.cache_dir or "").lower() == "none":
        return None
    if args.cache_dir:
        return args.cache_dir
    return os.path.join(env["XDG_CACHE_HOME"], "vitkit") if env.get("XDG_CACHE_HOME") else user_cache()


def train_here(args, run, dist) -> int:
    """Train the resolved ``run`` in this process (alone, or as one rank of a distributed run); report as
    the exit code says."""
    import os

    from ...train.distributed import destroy_process_group
    from ...train.loop import train
    from . import cli_progress

    progress = cli_progress(args.quiet, run.cfg.progress_every)
    log = (lambda m: None) if args.quiet else (lambda m: print(m, flush=True))
    if dist.is_main and not getattr(args, "resolved", False):  # a launcher said them already
        say_notes(args, run)
    with stop_on_signals() as stop:
        try:
            summary = train(run.cfg, run.run_dir, dist=dist, resume=run.resume, progress=progress, stop=stop,
                            log=log, cache_dir=cache_dir(args, os.environ), path=run.path,
                            init=run.init)
        finally:
            destroy_process_group()
    if not dist.is_main:
        return 0 if summary.get("status") == "completed" else 130
    return report(args, summary, run.run_dir)


def report(args, summary: dict, run_dir) -> int:
    """The main process's last lines (how to continue a stopped run; the accuracies) and the exit code."""
    from . import json_line

    if summary.get("status") == "interrupted":
        if args.quiet:  # quiet silences progress, not how to continue
            print(f"vitkit: stopped at step {summary.get('step', 0)}; continue with: vitkit train --resume {run_dir}",
                  file=sys.stderr)
        if args.json:
            print(json_line(summary))
        return 130
    parts = accuracy_parts(summary)
    parts.append(f"train time {summary['train_seconds']:.1f} s (total {summary['total_seconds']:.1f} s)")
    print(", ".join(parts) + f"; saved {run_dir}")
    if args.json:
        print(json_line(summary))
    return 0


def accuracy_parts(summary: dict) -> list[str]:
    """The accuracies of the last line, each saying which weights it is of where best/ holds other weights
    than the run ended with: the test split scores best/ (what ``vitkit.load(run)`` gives), the final
    validation the weights the run ended with."""
    parts = []
    if "test_acc" in summary:
        final = summary.get("test_acc_final")
        parts.append(f"test accuracy {summary['test_acc'] * 100:.2f}%"
                     + (f" (best/; the final weights {final * 100:.2f}%)" if final is not None else ""))
    if "val_acc" in summary:
        best = summary.get("best_val_acc", summary["val_acc"])
        parts.append(f"val accuracy {summary['val_acc'] * 100:.2f}%"
                     + (f" (the final weights; best/ {best * 100:.2f}%)" if best != summary["val_acc"] else ""))
    return parts


def run(args) -> int:
    return execute(args)

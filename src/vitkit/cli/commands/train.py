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

from . import seconds
from .launch import DEFAULT_RDZV_ID


def _h(text: str, key: str) -> str:
    """Help text with the recipe's default value of config field ``key`` (dotted)."""
    from ...train.config import RunConfig

    node = RunConfig().to_dict()
    for part in key.split("."):
        node = node[part]
    return f"{text} (default: {node})"


def add_common(p: argparse.ArgumentParser, finetune: bool = False) -> None:
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
    if not finetune:
        g.add_argument("--model", metavar="NAME", help=_h("a named model (`vitkit list`)", "model"))
        g.add_argument("--img-size", type=int, metavar="PX", help="train at this resolution, the model's position "
                       "embeddings resampled (img_size; default: the model's)")
    else:
        g.add_argument("--img-size", type=int, metavar="PX", help="fine-tune at this resolution (img_size; default: "
                       "the checkpoint's); position embeddings are resampled")
    g.add_argument("--drop-path", type=float, metavar="P", help="stochastic depth rate (model_args.drop_path_rate; "
                   "default: the model's)")
    g.add_argument("--config", metavar="FILE", help="a TOML run config (see configs/), or a run's config.json or run "
                   "directory to replay that run; flags override it")
    g = p.add_argument_group("schedule")
    g.add_argument("--epochs", type=int, metavar="N", help=_h("training epochs", "epochs"))
    g.add_argument("--max-minutes", type=float, metavar="M",
                   help="wall-clock budget: the schedule is fitted to it and training stops when it is spent "
                   "(default: none; 4 for the demo on the built-in digits; 0 = none)")
    g.add_argument("--batch-size", type=int, metavar="B", help=_h("images per optimizer step (all processes)", "batch_size"))
    g.add_argument("--accum-steps", type=int, metavar="N", help=_h("gradient accumulation steps", "accum_steps"))
    g.add_argument("--lr", type=float, help=_h("peak learning rate", "optim.lr"))
    g.add_argument("--weight-decay", type=float, metavar="WD", help=_h("decoupled weight decay (optim.weight_decay)",
                                                                       "optim.weight_decay"))
    g.add_argument("--seed", type=int, help=_h("random seed", "seed"))
    g.add_argument("--ema", type=float, metavar="DECAY", help="keep and evaluate an EMA of the weights (e.g. 0.999)")
    g.add_argument("--tta", action=argparse.BooleanOptionalAction, default=None, help="score validation and test "
                   "with test-time flip averaging: the mean logits of each image and its mirror (tta)")
    g.add_argument("--smoothing", type=float, metavar="EPS", help=_h("label smoothing (augment.label_smoothing)",
                                                                     "augment.label_smoothing"))
    g.add_argument("--mixup", type=float, metavar="ALPHA", help=_h("mixup alpha, 0 = off (augment.mixup_alpha)",
                                                                   "augment.mixup_alpha"))
    g.add_argument("--cutmix", type=float, metavar="ALPHA", help=_h("cutmix alpha, 0 = off (augment.cutmix_alpha)",
                                                                    "augment.cutmix_alpha"))
    g = p.add_argument_group("hardware")
    g.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], help=_h("device", "device"))
    g.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"],
                   help=_h("autocast precision; fp16 (with a gradient scaler) on CUDA only", "precision"))
    g.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    g.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None, help="a conv stem's "
                   "weights and the input batches channels-last (default: where it pays, a conv stem on the CPU)")
    g.add_argument("--grad-checkpointing", action="store_true", default=None, help="recompute each block's "
                   "activations in the backward pass instead of keeping them: less memory, slower steps")
    g.add_argument("--nproc", type=int, metavar="N", help="train with N data-parallel processes on this machine "
                   "(DDP), started by torch's elastic launcher as `torchrun --nproc-per-node=N` starts them (default: "
                   "1; the demo: 2 on a CPU with 2 or more cores)")
    add_launch_flags(p)
    g.add_argument("--strategy", choices=["ddp", "fsdp"], help=_h("how the processes share the model: ddp, a "
                   "replica each; fsdp, a shard each of the weights, gradients and optimizer state (large models)",
                   "strategy"))
    g.add_argument("--sync-bn", action=argparse.BooleanOptionalAction, default=None, help="with several "
                   "processes, share BatchNorm statistics across them (default: on CUDA only)")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: the cores not busy "
                   "with other work, divided among the processes of a distributed run)")
    g = p.add_argument_group("run")
    g.add_argument("--out", metavar="RUN_DIR", help="run directory (default: runs/<model>-<date-time>)")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    g.add_argument("--ckpt-every", type=int, metavar="N", help="also save last/ every N steps (default: each epoch)")
    g.add_argument("--eval-every", type=int, metavar="N", help=_h("validate every N epochs (0: at the end)", "eval_every"))
    g.add_argument("--skip-nonfinite", type=int, metavar="N", help="skip up to N steps with a NaN/inf loss "
                   "instead of stopping (default: 0)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set optim.weight_decay=0.05 (repeatable)")
    g.add_argument("rest", nargs="*", metavar="KEY=VALUE", help="more overrides, as --set")
    g.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    g.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.set_defaults(config_keys=config_keys)
    add_progress_and_loggers(p)


# ------------------------------------------------------------------------------- machines
def add_launch_flags(p: argparse.ArgumentParser) -> None:
    """The machines of a run and how its processes meet, as torchrun names them (commands/launch.py)."""
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


def launch_plan_from_args(args, nproc: int):
    """The run's LaunchPlan from the flags above and its processes on this machine."""
    from .launch import launch_plan

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
                   "tensorboard, wandb (offline); a comma list, e.g. --log tensorboard,csv (metrics.jsonl is always "
                   "written)")


def progress_and_loggers_flags(args) -> dict:
    """The config keys of the flags above (None: not given)."""
    return {"progress_every": args.progress_every, "loggers": args.log}


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
    return f


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


def default_threads(local_procs: int) -> int:
    """CPU threads per process: the cores not already busy (1-minute load average), shared among this
    machine's processes. Threads competing with other work for a core spin and wait, which on small
    models is several times slower than using fewer threads."""
    import os

    from ...core.hardware import usable_cpus

    cpus = usable_cpus()
    try:
        free = cpus - int(round(os.getloadavg()[0]))
    except OSError:  # pragma: no cover - no load average on this platform
        free = cpus
    return max(1, min(cpus, free) // max(local_procs, 1))


def demo_base() -> dict:
    """The demo's time budget, and its processes: 2 data-parallel processes of one thread on a CPU with 2 or
    more cores (this small model keeps two processes busier than one process with two threads); 1
    process where a GPU will be used."""
    from ...train.config import DEMO_BUDGET

    cpus = cpu_run_cpus(None)
    return dict(DEMO_BUDGET, processes=1 if cpus is None else min(DEMO_BUDGET["processes"], cpus))


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


def execute(args, base: dict | None = None, extra_flags: dict | None = None) -> int:
    """Resolve the config; then start the processes of a launched run, or train in this one. A process
    the launcher started records the one-line error that ends it, for the launcher's report."""
    import os

    from .launch import errors_recorded, follow_launcher

    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torch's launcher (vitkit's, or torchrun)
        follow_launcher()
    with errors_recorded(os.environ.get("TORCHELASTIC_ERROR_FILE")):
        return resolve_and_run(args, base, extra_flags)


def resolve_and_run(args, base: dict | None, extra_flags: dict | None) -> int:
    """The run's config (``base``: the recipe's defaults, if not the demo's or a resumed run's) and
    directory; then the launch, or the training in this process."""
    import os
    from pathlib import Path

    from ...core.errors import ConfigError
    from ...train.config import resolve_config
    from ...train.distributed import DistInfo

    dist = DistInfo.from_env(os.environ)
    overrides = overrides_from_args(args)
    flags = {**flags_from_args(args), **(extra_flags or {})}
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads: must be >= 1, got {args.threads}")
    if saved_by_this_launch(args):
        args.resume = args.out  # a restarted attempt continues from the run's last checkpoint
    if args.resume:
        # a rank other than 0, or the launcher of a run on several machines, may be where the run is not
        base = saved_run_config(Path(args.resume), args.out, elsewhere=dist.rank > 0 or args.nnodes is not None)
    recipe = None
    if base is None and args.config is None:
        if args.data is None:
            base = demo_base()  # the demo: the built-in digits, within a fixed time, on up to 2 CPU processes
        else:
            recipe = data_recipe(args, flags, overrides)  # chosen from what the data is
            base = recipe.base
    cfg = resolve_config(args.config, flags, overrides, base=base)
    run_dir = Path(args.resume) if args.resume else new_run_dir(cfg, args.out)
    if not dist.enabled and "TORCHELASTIC_RUN_ID" not in os.environ:  # a launched process of one trains here
        plan = launch_plan_from_args(args, cfg.processes)
        if plan.needs_launcher:  # start the processes; each comes back here as one rank
            return launch_processes(args, cfg, run_dir, plan)
    return train_here(args, cfg, run_dir, dist, recipe.line if recipe else None)


def data_recipe(args, flags: dict, overrides: list[str]):
    """The recipe for --data (train/recipe.py), told the budget the flags or overrides give."""
    from ...core.strict import parse_override
    from ...train.recipe import recipe_for

    given = {k: v for k, v in flags.items() if v is not None}
    for text in overrides:
        key, value = parse_override(text)
        given[".".join(key)] = value
    return recipe_for(args.data, args.data_format, _number(given.get("max_minutes")), _number(given.get("epochs")),
                      cpus=cpu_run_cpus(given.get("device")), processes=_whole(given.get("processes")))


def cpu_run_cpus(device) -> int | None:
    """The CPUs a run on ``device`` (a flag's value; None: auto) may use when it trains on the CPU; None
    when it trains on a GPU."""
    from ...core.errors import ConfigError
    from ...core.hardware import resolve_device, usable_cpus

    try:
        on_cpu = resolve_device(device or "auto").type == "cpu"
    except ConfigError:  # an unusable --device: the run reports it in its own words
        return None
    return usable_cpus() if on_cpu else None


def _whole(value) -> int | None:
    """An override's value as a whole number, or None when it is none or not one (resolve_config judges it)."""
    number = _number(value)
    return int(number) if number is not None and float(number).is_integer() else None


def _number(value):
    """An override's value as a number, or None when it is none (resolve_config judges it)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


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


def saved_run_config(run_dir, out: str | None, elsewhere: bool = False) -> dict:
    """The config.json of the run that --resume continues (checked alone, so that an error names it).
    ``elsewhere``: this process may be on a machine that does not see the run directory, which rank 0
    alone writes: then a missing config.json is no error. Such a process starts from the command line's
    values alone (an empty base), and the run's config comes from rank 0 once the processes meet
    (``train.loop.main_config``)."""
    from pathlib import Path

    from ...core.errors import ConfigError
    from ...train.config import checked_run_config, read_run_config

    saved = run_dir / "config.json"
    if not saved.is_file() and elsewhere:
        return {}
    if not saved.is_file():
        raise ConfigError(f"--resume {run_dir}: no config.json there; not a vitkit run directory")
    base = read_run_config(saved)
    checked_run_config(base, saved)
    if out and Path(out) != run_dir:
        raise ConfigError("--out and --resume name different directories; --resume continues in place")
    return base


def new_run_dir(cfg, out: str | None):
    """--out, or runs/<model or weights' name>-<date-time>."""
    import time
    from pathlib import Path

    if out:
        return Path(out)
    name = cfg.model
    if cfg.init_from:
        init = Path(cfg.init_from)
        name = init.stem if init.is_file() else init.name
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def launch_processes(args, cfg, run_dir, plan) -> int:
    """Check the config once (one error line, not one per process), then start the processes ``plan``
    says (cfg.processes on this machine)."""
    from ...core.errors import ConfigError
    from ...train.build import preflight
    from .launch import launch

    preflight(cfg, run_dir, bool(args.resume))
    check_processes(cfg.processes, cfg.device)
    argv = list(getattr(args, "argv", None) or [])
    if not argv:
        raise ConfigError("processes: a multi-process run is started from the command line (vitkit train)")
    if not args.resume and not args.out:
        argv += ["--out", str(run_dir)]  # every rank must agree on the run directory
    if plan.may_restart:
        argv += ["--auto-resume"]  # a restarted attempt continues from the checkpoint an earlier one saved
    if cfg.threads is None:  # ... and on the threads, counted once while the machine is not yet busy with them
        argv += ["--threads", str(default_threads(cfg.processes))]
    return launch(argv, plan, run_dir)


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
    """The decoded-image cache folder: --cache-dir, else $XDG_CACHE_HOME/vitkit, else ~/.cache/vitkit;
    None with --no-cache or --cache-dir none."""
    import os

    if getattr(args, "no_cache", False) or (args.cache_dir or "").lower() == "none":
        return None
    if args.cache_dir:
        return args.cache_dir
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "vitkit")


def train_here(args, cfg, run_dir, dist, note: str | None = None) -> int:
    """Train in this process (alone, or as one rank of a distributed run); report as the exit code says.
    ``note``: a line the main process prints first (the recipe chosen for the data, and why)."""
    import os

    from ...train.distributed import destroy_process_group
    from ...train.loop import train
    from . import cli_progress

    if cfg.threads is None:  # the run sets this many and records it in its config.json
        cfg.threads = default_threads(int(os.environ.get("LOCAL_WORLD_SIZE") or dist.world_size))
    progress = cli_progress(args.quiet, cfg.progress_every)
    log = (lambda m: None) if args.quiet else (lambda m: print(m, flush=True))
    if note and dist.is_main:
        log(note)
    with stop_on_signals() as stop:
        try:
            summary = train(cfg, run_dir, dist=dist, resume=bool(args.resume), progress=progress, stop=stop, log=log,
                            cache_dir=cache_dir(args, os.environ))
        finally:
            destroy_process_group()
    if not dist.is_main:
        return 0 if summary.get("status") == "completed" else 130
    return report(args, summary, run_dir)


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
    parts = []
    if "test_acc" in summary:
        parts.append(f"test accuracy {summary['test_acc'] * 100:.2f}%")
    if "val_acc" in summary:
        parts.append(f"val accuracy {summary['val_acc'] * 100:.2f}%")
    parts.append(f"train time {summary['train_seconds']:.1f} s (total {summary['total_seconds']:.1f} s)")
    print(", ".join(parts) + f"; saved {run_dir}")
    if args.json:
        print(json_line(summary))
    return 0


def run(args) -> int:
    return execute(args)

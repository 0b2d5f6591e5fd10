"""The run configuration: strict dataclasses, one per concern, filled from defaults, a TOML file,
command-line flags and dotted ``KEY=VALUE`` overrides, in that order. The resolved config is saved
as the run's config.json.

The defaults are the demo recipe (``vitkit train`` with no arguments): the built-in MNIST digits and
a small hybrid ViT that reaches >= 98.5% test accuracy within a few minutes on two CPU cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..core.errors import ConfigError
from ..core.files import NotRegularFile, open_regular
from ..core.strict import (
    MAX_NESTING,
    apply_overrides,
    brief,
    check_nesting,
    from_dict,
    parse_override,
    read_json_object,
    real_in,
    to_dict,
)
from ..data import AugmentConfig
from ..model.config import CROP_PCT_RANGE


@dataclass
class DataConfig:
    path: str | None = None  # a folder, a split folder, MNIST IDX or CIFAR batches; None = built-in demo set
    format: str | None = None  # force a format ('folder', 'split-folder', 'mnist', 'cifar10', ...); None = detect
    img_size: int | None = None  # size images are decoded/stored at; None = native (or the model's size)
    val_fraction: float = 0.0  # share of train carved out for validation when the data has no val part
    strict: bool = False  # an unreadable image is an error (False: skipped and reported)
    in_memory: bool | None = None  # hold decoded images in memory; None = auto (small datasets)
    workers: int | None = None  # DataLoader worker processes that decode streamed (not in-memory) datasets;
    #   None = the usable CPUs shared among the training processes (at most 8); 0 = decode in the main process
    short_side: int | None = None  # image folders (with no data.img_size) keep whole images, shrunk (never
    #   enlarged) to this short side, and training crops are drawn from the whole image; None = the model's
    #   size / crop_pct (256 for 224 at 0.875). Images that all come out at one size share one tensor
    crop_pct: float = 0.875  # evaluation of such images: resize the short side to size / crop_pct, centre
    #   crop to the model's size (timm's eval transform); recorded in the model's preprocessing

    def validate(self):
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction: must be in [0, 1), got {self.val_fraction!r}")
        for name in ("img_size", "short_side"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"data.{name}: must be a positive integer or null, got {brief(v)}")
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"data.workers: must be >= 0 or null (null: one per usable CPU), got {self.workers!r}")
        real_in(self.crop_pct, "data.crop_pct", *CROP_PCT_RANGE)  # the eval crop's Preprocess takes the same


@dataclass
class OptimConfig:
    name: Literal["adamw", "adam", "sgd", "lion", "muon"] = "adamw"  # AdamW (pre-training), Adam (its weight decay
    #   an L2 term added to the gradient, as torch.optim.Adam and timm's 'adam'), SGD with momentum (fine-tuning),
    #   Lion (Chen et al. 2023: the sign of an interpolated momentum; use a 3-10x lower lr, higher weight decay)
    #   or Muon (Jordan et al. 2024) for the blocks' weight matrices with AdamW for the rest, at one lr
    #   (train/optim.py MuonAdamW)
    lr: float = 2e-3  # peak learning rate, reached at the end of warmup
    weight_decay: float = 0.05  # decoupled weight decay; never applied to biases, norms, pos_embed, cls_token
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas (the paper: 0.9, 0.999); Lion takes (0.9, 0.99)
    eps: float = 1e-8  # AdamW epsilon
    momentum: float = 0.9  # SGD momentum
    muon_momentum: float = 0.95  # Muon's momentum (Nesterov)
    muon_convs: bool = False  # Muon also for the conv filters (the conv stem's), each flattened to a matrix
    #   (out, in * kh * kw), as airbench's Muon; else they take AdamW
    nesterov: bool = False  # SGD Nesterov momentum
    layer_decay: float | None = None  # layer-wise lr decay: block i gets lr * decay^(depth - i); None = off
    clip_grad: float | None = 1.0  # clip the global gradient norm to this value; None = off
    bn_lr_scale: float = 1.0  # the BatchNorm layers' weights and biases train at this multiple of the lr (airbench
    #   trains its BatchNorm biases at a far higher rate than its filters; not the recipe's: docs/experiments.md)

    def validate(self):
        if not self.lr > 0:
            raise ConfigError(f"optim.lr: must be > 0, got {self.lr!r}")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay: must be >= 0, got {self.weight_decay!r}")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise ConfigError(f"optim.layer_decay: must be in (0, 1] or null, got {self.layer_decay!r}")
        if self.clip_grad is not None and not self.clip_grad > 0:
            raise ConfigError(f"optim.clip_grad: must be > 0 or null, got {self.clip_grad!r}")
        if not self.bn_lr_scale > 0:
            raise ConfigError(f"optim.bn_lr_scale: must be > 0, got {self.bn_lr_scale!r}")
        if self.muon_convs and self.name != "muon":
            raise ConfigError(f"optim.muon_convs: needs optim.name='muon', got optim.name={self.name!r}")
        if not 0 <= self.muon_momentum < 1:
            raise ConfigError(f"optim.muon_momentum: must be in [0, 1), got {self.muon_momentum!r}")
        if not self.eps > 0:
            raise ConfigError(f"optim.eps: must be > 0, got {self.eps!r}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"optim.momentum: must be in [0, 1), got {self.momentum!r}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"optim.betas: each must be in [0, 1), got {self.betas!r}")


@dataclass
class ScheduleConfig:
    decay: Literal["cosine", "linear", "constant", "step"] = "cosine"  # shape after warmup; 'step': the lr is
    #   multiplied by step_rate after every step_every of the run (warmup included), as timm's step schedule
    warmup_steps: int = 0  # linear warmup from 0 over this many optimizer steps ...
    warmup_fraction: float = 0.05  # ... or this share of the run (the larger of the two is used; 1: the whole run)
    min_lr_ratio: float = 0.0  # the lr decays to lr * min_lr_ratio
    step_every: float = 0.3  # decay 'step': a decay after every this share of the run (--decay-epochs N sets
    #   N / epochs)
    step_rate: float = 0.1  # decay 'step': the factor of each decay (timm's --decay-rate)

    def validate(self):
        if self.warmup_steps < 0:
            raise ConfigError(f"schedule.warmup_steps: must be >= 0, got {self.warmup_steps!r}")
        if not 0 <= self.warmup_fraction <= 1:
            raise ConfigError(f"schedule.warmup_fraction: must be in [0, 1], got {self.warmup_fraction!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"schedule.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio!r}")
        if not 0 < self.step_every <= 1:
            raise ConfigError(f"schedule.step_every: must be in (0, 1] (a share of the run), got {self.step_every!r}")
        if not 0 < self.step_rate <= 1:
            raise ConfigError(f"schedule.step_rate: must be in (0, 1], got {self.step_rate!r}")


STRATEGIES = ("ddp", "fsdp")  # RunConfig.strategy


@dataclass
class RunConfig:
    # --- what to train -------------------------------------------------------------------------------
    model: str = "vit_hybrid_mini_patch4_28"  # a named model (`vitkit list`)
    model_args: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields that override the named model
    init_from: str | None = None  # start from these weights (fine-tuning), new head: a vitkit checkpoint or run
    #   directory, or timm, HF or JAX weights (the format is told by the container, io.convert.detect_format)
    init_model: str | None = None  # with timm, HF or JAX weights: a named model that supplies what the weights
    #   do not show (heads, eps, pooling); None = defaults, reported. model_args set single fields
    preprocess: dict[str, Any] = field(default_factory=dict)  # Preprocess fields (mean, std, crop_pct,
    #   interpolation, resize) laid over the model's preprocessing (the init_from weights' own, or what was
    #   assumed for them; else measured on the data), e.g. --set preprocess.crop_pct=0.9; saved with the model
    img_size: int | None = None  # train at this resolution (position embeddings resampled); None = model's
    tune: Literal["auto", "full", "last", "probe"] = "full"  # with init_from: what trains: the whole model, the
    #   last tune_blocks blocks (and the final norm and head), or the head alone on the frozen backbone (a
    #   linear probe, on features computed once: train/probe.py); auto: chosen from the budget and the model's
    #   size (train/tune.py), recorded as chosen
    tune_blocks: int = 2  # the blocks 'last' trains
    # --- how long ------------------------------------------------------------------------------------
    epochs: int = 20  # passes over the training set (the schedule spans them, unless max_minutes ends sooner)
    max_minutes: float | None = None  # wall-clock budget for training; the schedule is fitted to it; None or 0 =
    #   no limit (the demo, `vitkit train` on the built-in digits, uses DEMO_BUDGET)
    batch_size: int = 64  # images per optimizer step, across all processes and accumulation steps
    accum_steps: int = 1  # gradient accumulation: micro-batch = batch_size / (accum_steps * processes)
    # --- numerics and hardware ----------------------------------------------------------------------
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"  # auto: cuda, then mps, then cpu
    processes: int = 1  # data-parallel processes that `vitkit train` starts on this machine (DDP: gloo on
    #   CPU, one GPU each on CUDA), as `torchrun --nproc_per_node=N` would; a torchrun launch decides itself,
    #   and a run's config.json records the number it ran with
    strategy: Literal["ddp", "fsdp"] = "ddp"  # how the processes share the work: "ddp", a full replica of the model
    #   in each process, gradients all-reduced; "fsdp", each process holds a shard of every parameter, gradient
    #   and optimizer state (torch FSDP2), for models whose training state does not fit one device (bf16 or fp32)
    threads: int | None = None  # CPU threads of each process; None = the cores not busy with other work, shared
    #   among this machine's processes. A run's config.json records the number it ran with
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # autocast dtype; auto: bf16 where the
    #   hardware has fast bf16 (CUDA with bf16, CPUs with AMX/AVX512-BF16) and the model is large enough for it
    #   to pay (vitkit.infer.fastpath.auto_precision), else fp32; fp16 needs CUDA
    compile: bool = False  # torch.compile the model
    channels_last: bool | None = None  # the conv stem's weights and the input batches channels-last (NHWC); None =
    #   auto: where it was measured to pay (vitkit.infer.fastpath.channels_last_pays: a conv stem on the CPU), never
    #   under FSDP. Numerics as contiguous within float rounding; checkpoints are contiguous either way
    grad_checkpointing: bool = False  # recompute each block's activations in the backward pass instead of keeping
    #   them (VisionTransformer.set_grad_checkpointing): less memory for about one more forward pass per step
    sync_bn: bool | None = None  # with several processes, normalise BatchNorm layers (the conv stem's) with the
    #   statistics of the whole global batch, shared across the processes, so that N processes train as one
    #   does; None = on CUDA only (on the CPU it slows the demo's steps by a quarter, for no accuracy)
    ema: float | None = None  # keep an exponential moving average of the weights with this decay; evaluate it
    #   (the decay warms up as min(ema, (1 + step) / (10 + step)), so short runs are not held back)
    tta: bool = False  # score validation and test with test-time flip augmentation: the mean of the logits of
    #   each image and its left-right mirror (runtime.model_logits)
    tta_shift: int = 0  # with tta, also score two copies of each image moved this many px diagonally (up-left
    #   and down-right, edges by reflection), each flip-averaged: six forward passes (infer.paths.model_logits);
    #   0 = the flips only; without tta it scores nothing (so that --no-tta turns a recipe's views off whole)
    tta_flip: bool = True  # with tta, the views include each one's mirror image; False: the image alone, and with
    #   tta_shift its two shifted copies (three forward passes), for data whose mirror images change class
    #   (augment.mirror_check)
    bn_recalibrate: bool | None = None  # when training ends, re-estimate the final model's BatchNorm statistics on
    #   training images prepared as they are evaluated (train/precise_bn.py); None = auto: where training
    #   cropped at random scales (augment.crop 'rrc'), as measured; a model without BatchNorm is unchanged
    seed: int = 0  # seeds initialisation, data order, augmentation and dropout
    replay: str | None = None  # a run directory whose recorded steps this run takes: its number of steps and
    #   each step's place in the schedule, in place of the clock (train/replay.py); `--config RUN` sets it
    #   where RUN was bounded by the clock and the request leaves its bound as it was
    expected_epochs: float | None = None  # the epochs a run bounded by the clock expected to reach, as its first
    #   line counted them from the measured speed (before the share of them that earlier runs here reached is
    #   applied); set when the run is resolved, and at its end the share it reached is kept in the cache folder
    #   for later runs' counts (train/speed.py, RUNS_FILE). None: nothing measured
    # --- bookkeeping ---------------------------------------------------------------------------------
    eval_every: int = 0  # evaluate on the validation split every N epochs (0 = only at the end)
    ckpt_every: int = 0  # also save last/ every N optimizer steps (0 = at the end of each epoch only)
    log_every: int = 20  # write a metrics.jsonl line every N optimizer steps
    skip_nonfinite: int = 0  # tolerate (skip) up to N steps whose loss or gradients are NaN/inf
    plots: bool = True  # write loss.png, accuracy.png and lr.png at each periodic validation, on a stop and at
    #   the end (needs matplotlib)
    # --- progress and loggers -----------------------------------------------------------------------
    progress_every: float = 30.0  # `vitkit train` writing to a log (not a terminal, which gets a bar): a progress
    #   line every N seconds (step, epoch, loss, accuracy, images/s, ETA); 0 = none
    loggers: list[Literal["csv", "tensorboard", "wandb", "mlflow"]] = field(default_factory=list)  # also log the
    #   metrics to metrics.csv, TensorBoard (pip install 'vitkit[tensorboard]'), a wandb run ('vitkit[wandb]') or
    #   an MLflow run ('vitkit[mlflow]')
    wandb_mode: str | None = None  # wandb's mode ('online', 'offline', 'disabled'); None = offline. `vitkit
    #   train` sets it from WANDB_MODE, else 'online' where wandb has credentials (WANDB_API_KEY, ~/.netrc)
    wandb_project: str | None = None  # the wandb project; None = 'vitkit'. `vitkit train`: WANDB_PROJECT
    mlflow_tracking_uri: str | None = None  # where MLflow records; None = a SQLite store, the run's mlflow.db.
    #   `vitkit train`: MLFLOW_TRACKING_URI
    mlflow_experiment: str | None = None  # the MLflow experiment; None = 'vitkit'. `vitkit train`:
    #   MLFLOW_EXPERIMENT_NAME
    # --- sections ------------------------------------------------------------------------------------
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentConfig = field(default_factory=lambda: AugmentConfig(crop="pad", pad=2, hflip=0.0,
                                                                         label_smoothing=0.1))
    #   the training augmentation (vitkit.data.AugmentConfig); a run's config.json holds every field
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def validate(self) -> "RunConfig":
        for name in ("epochs", "batch_size", "accum_steps", "log_every", "processes"):
            v = getattr(self, name)
            if v < 1:
                raise ConfigError(f"{name}: must be a positive integer, got {brief(v)}")
        for name in ("eval_every", "ckpt_every", "skip_nonfinite", "progress_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy: expected one of {', '.join(map(repr, STRATEGIES))}, got {self.strategy!r}")
        if self.strategy == "fsdp" and self.precision == "fp16":
            raise ConfigError("strategy: 'fsdp' trains in bf16 or fp32, not fp16 (its gradient scaler does not take "
                              "sharded gradients); use precision bf16")
        if self.strategy == "fsdp" and self.channels_last:
            raise ConfigError("channels_last: 'fsdp' shards contiguous parameters only (torch's fully_shard refuses "
                              "channels-last ones); use channels_last = false or null, or strategy ddp")
        if self.expected_epochs is not None and not self.expected_epochs >= 0:
            raise ConfigError(f"expected_epochs: must be >= 0, got {self.expected_epochs!r}")
        if self.max_minutes is not None and self.max_minutes < 0:
            raise ConfigError(f"max_minutes: must be >= 0 (0 = no limit), got {self.max_minutes!r}")
        if self.ema is not None and not 0 < self.ema < 1:
            raise ConfigError(f"ema: the decay must be in (0, 1), got {self.ema!r}")
        if self.tta_shift < 0:
            raise ConfigError(f"tta_shift: must be >= 0 px (0 = flips only), got {self.tta_shift!r}")
        if self.batch_size % self.accum_steps:
            raise ConfigError(f"batch_size: {self.batch_size} is not divisible by accum_steps {self.accum_steps}")
        if self.tune not in ("full", "auto") and not self.init_from:
            raise ConfigError(f"tune: {self.tune!r} fine-tunes weights; it needs init_from (vitkit finetune WEIGHTS)")
        if self.tune == "probe" and self.processes > 1:
            from .tune import probe_processes_error

            raise probe_processes_error(self.processes)
        if self.tune_blocks < 1:
            raise ConfigError(f"tune_blocks: must be a positive integer, got {self.tune_blocks!r}")
        for name in ("img_size", "threads"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"{name}: must be a positive integer or null, got {brief(v)}")
        if self.preprocess:
            from ..io.preprocess import apply_preprocess
            from ..model.config import Preprocess

            apply_preprocess(Preprocess(), self.preprocess, where="preprocess")
        self.data.validate()
        self.augment.validate()
        self.optim.validate()
        self.schedule.validate()
        return self

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "config") -> "RunConfig":
        return from_dict(cls, data, where).validate()


def load_toml(path: str | Path) -> dict:
    """A TOML file as a dict; a missing or malformed file is a ConfigError naming it."""
    import tomllib

    path = Path(path)
    try:
        with open_regular(path) as f:
            data = tomllib.load(f)
        check_nesting(data)
        return data
    except NotRegularFile as e:
        raise ConfigError(f"{path}: {e.strerror}, expected a TOML file") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML (nested more than {MAX_NESTING} levels deep)") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8 text; tomllib lets the decoding error through
        raise ConfigError(f"{path}: not valid TOML (not UTF-8 text: byte 0x{e.object[e.start]:02x} at "
                          f"offset {e.start})") from None
    except ValueError as e:  # check_nesting's
        raise ConfigError(f"{path}: not valid TOML ({e})") from None


def read_run_config(path: str | Path) -> dict:
    """A run's config.json (or that of run directory ``path``) as a dict, to replay or resume the run.

    A missing or malformed file, or a checkpoint's config (vitkit.json), is a ConfigError naming it; the values
    are checked where they are used (``resolve_config``).
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.exists() or file.is_dir():  # a FIFO, say, is for read_json_object to name
        raise ConfigError(f"{path}: no config.json there; not a vitkit run directory" if path.is_dir()
                          else f"{path}: no such config file")
    data = read_json_object(file)
    if data.get("format") == "vitkit":
        raise ConfigError(f"{file}: is a checkpoint's config, not a run's; fine-tune from the checkpoint with "
                          "`vitkit finetune`")
    return data


def checked_run_config(data: dict, where) -> RunConfig:
    """``data`` (a run's config.json, say) laid over the defaults as a RunConfig; a bad key or value is a
    ConfigError naming ``where``."""
    try:
        return RunConfig.from_dict(merge(RunConfig().to_dict(), data))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def load_config_file(path: str | Path) -> dict:
    """A config file as a dict: a run's config.json or run directory (``read_run_config``), else TOML."""
    path = Path(path)
    if path.is_dir() and not (path / "config.json").is_file():
        raise ConfigError(f"{path}: is a directory, expected a TOML file or a run directory (it holds no config.json)")
    if path.is_dir() or path.suffix.lower() == ".json":
        return read_run_config(path)
    return load_toml(path)


def merge(base: dict, update: dict) -> dict:
    """``update`` laid over ``base``, tables merged key by key (model_args and augment included)."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def resolve_config(
    file: str | Path | None = None,
    flags: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    base: dict | None = None,
) -> RunConfig:
    """Defaults <- ``base`` <- ``file`` <- ``flags`` (dotted keys, None = not given) <- ``overrides``.

    ``file``: a TOML file, or a run's config.json or run directory (the run replayed).

    Every layer is checked strictly: an unknown key or a wrong type is a ConfigError naming the key
    (and the file it came from). A key given both by a flag and by an override is an error: neither
    silently wins.
    """
    _check_given_once(flags or {}, overrides or [])
    data = RunConfig().to_dict()
    if base:
        data = merge(data, base)
    if file is not None:
        loaded = load_config_file(file)
        try:
            _check_named_model(RunConfig.from_dict(merge(data, loaded)))  # the file alone first, to name it
        except ConfigError as e:
            raise ConfigError(f"{file}: {e}") from None
        data = merge(data, loaded)
    for key, value in (flags or {}).items():
        if value is not None:
            _set_key(data, key, value)
    if overrides:
        data = apply_overrides(data, overrides)
    return RunConfig.from_dict(data)


def _set_key(data: dict, key: str, value) -> None:
    """Set dotted ``key`` of ``data`` to ``value``; a key under no section of the config is a ConfigError
    naming it (an unknown key in a section is from_dict's)."""
    node = data
    *parents, last = key.split(".")
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: not a config key ({p!r} is not a section of the run config)")
    node[last] = value


def _check_named_model(cfg: RunConfig) -> None:
    """The named model with ``cfg``'s model_args, where no weights supply the architecture: an unknown
    field or a bad value is a ConfigError (the caller names where the values came from)."""
    from ..model.variants import get_config

    if not cfg.init_from:
        get_config(cfg.model, **{k: v for k, v in cfg.model_args.items() if k != "num_classes"})


def _check_given_once(flags: dict[str, Any], overrides: list[str]) -> None:
    given = {key for key, value in flags.items() if value is not None}
    for text in overrides:
        key = ".".join(parse_override(text)[0])
        if key in given:
            raise ConfigError(f"override {brief(text)}: {key} is also given by a flag; give one of the two")


__all__ = ["RunConfig", "STRATEGIES", "DataConfig", "OptimConfig", "ScheduleConfig", "resolve_config", "load_toml",
           "load_config_file", "read_run_config", "checked_run_config", "merge"]


# `vitkit train` with neither --data nor --config (the demo on the built-in digits) is also capped in time,
# and trains in fp32: its matrices are too small for bf16 to pay (vitkit bench -> benchmarks/results/
# bench_demo_precision.json; docs/performance.md, "The demo trains in fp32").
DEMO_BUDGET: dict[str, Any] = {"max_minutes": 4.0, "processes": 2, "precision": "fp32"}

# The fine-tuning recipe's defaults (`vitkit finetune`), laid over RunConfig's: SGD with momentum 0.9, no
# weight decay, warmup + cosine, gradient clipping at 1 (the paper's fine-tuning setup), light augmentation.
FINETUNE_DEFAULTS: dict[str, Any] = {
    "tune": "auto",
    "epochs": 10,
    "batch_size": 64,
    "eval_every": 1,
    "optim": {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0, "clip_grad": 1.0},
    "schedule": {"decay": "cosine", "warmup_fraction": 0.1, "warmup_steps": 0},
    "data": {"val_fraction": 0.1},
    "augment": {"crop": "rrc", "rrc_scale": [0.35, 1.0], "hflip": 0.5, "mirror_check": True, "pad": 4,
                "label_smoothing": 0.0},  # flips where mirroring keeps the class (data/mirror.py)
}

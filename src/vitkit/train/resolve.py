"""A run resolved once: a request (the command line's values, or keyword arguments from Python) becomes
the run's config with every 'auto' settled, its model's config and its directory.

    request -> the base (a resumed run's config.json; the fine-tuning defaults; the demo's budget; or the
               recipe chosen from the data) <- --config <- flags <- overrides    (``train.config.resolve_config``)
            -> threads and processes, then the model's config and the training path (precision,
               channels-last) settled for this machine                            (``resolve_run``)
            -> the run directory; config.json written once                         (``write_resolved``)

``vitkit train``, ``vitkit finetune`` and ``vitkit.fit`` all go through ``resolve_run``, so the same
request trains the same thing. Processes that a launcher starts read the run's config.json
(``read_resolved``) instead of resolving again; a rank on another machine, which may not see the run
directory, takes rank 0's config once the processes meet (``train.loop.main_config``).
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.hardware import cpu_bf16_kind, cpu_capability, load_average, resolve_device, usable_cpus
from ..core.strict import is_finite_real, parse_override
from ..infer.fastpath import FastPath
from ..infer.paths import training_path
from ..model.config import ViTConfig
from .checkpoint import RunLock, find_checkpoint, write_json
from .config import DEMO_BUDGET, FINETUNE_DEFAULTS, RunConfig, checked_run_config, read_run_config, resolve_config
from .replay import settle_replay

RUN_CONFIG = "config.json"  # the resolved run, in its run directory
# A fine-tuning run of a model of at most this many forward FLOPs an image, bounded by the clock on a CPU,
# trains as 2 processes of one thread (``finetune_processes``), as the recipes train their models: the
# largest of them, the photos model at 96 px with 4 blocks, is 0.20 GFLOPs; larger models were not measured
SMALL_MODEL_FLOPS = 2.5e8

# config keys that say what model a run trains: a resumed run keeps its own, so a request that names
# other values is refused rather than recorded untruly
MODEL_KEYS = ("model", "model_args", "img_size", "init_from", "init_model")


@dataclass
class RunRequest:
    """What is asked of a run, before anything is settled. ``flags``: dotted config keys and values (None:
    not given), as the command line's flags or ``vitkit.fit``'s keyword arguments give them;
    ``overrides``: 'KEY=VALUE' texts, laid over the flags (a key given by both is an error)."""

    data: str | None = None  # a folder, split folder, MNIST or CIFAR directory; None: the built-in digits
    data_format: str | None = None  # force the dataset format; None: detected
    weights: str | None = None  # fine-tune from these weights (the fine-tuning defaults apply)
    config: str | None = None  # a TOML run config, or a run's config.json or directory to replay
    flags: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    out: str | None = None  # the run directory; None: runs/<model>-<date-time>
    resume: str | None = None  # continue the run in this directory from its last checkpoint
    warmup_epochs: float | None = None  # warmup over this many epochs (a share of a run of fixed epochs)
    decay_epochs: float | None = None  # schedule 'step': a decay every this many epochs (a share of the run)
    recipe: str = "auto"  # 'auto': the recipe chosen for the data; 'none': RunConfig's defaults, no recipe
    cache_dir: str | None = None  # where measured training speeds are kept (train/speed.py); None: not kept


@dataclass
class ResolvedRun:
    """A run with every choice made: ``cfg`` (no 'auto' left in threads, precision and channels-last),
    ``run_dir``, whether it resumes, the training ``path`` (and why: printed once, and in the summary),
    ``notes``: what the main process prints first (the recipe chosen for the data, and why), the model's
    config and the timm, HF or JAX weights it starts from as resolving read them (for a run in this
    process; a launcher drops them)."""

    cfg: RunConfig
    run_dir: Path
    resume: bool = False
    path: FastPath | None = None
    notes: list[str] = field(default_factory=list)
    model: ViTConfig | None = None  # the config of the model it trains
    init: tuple | None = field(default=None, repr=False)  # foreign init_from weights as read (build.foreign_init)


def resolve_run(req: RunRequest, *, local_processes: int | None = None, elsewhere: bool = False) -> ResolvedRun:
    """The run ``req`` asks for, resolved once. ``local_processes``: the processes that share this machine's
    CPUs (None: the run's own count), for the threads each gets. ``elsewhere``: this process may be on a
    machine that does not see a resumed run's directory (a rank of a run on several machines); a missing
    config.json is then no error, and rank 0's config replaces this one when the processes meet."""
    flags = dict(req.flags)
    if req.data is not None:
        flags["data.path"] = req.data
    if req.data_format is not None:
        flags["data.format"] = req.data_format
    if req.weights is not None:
        flags["init_from"] = req.weights
    given = _given(flags, req.overrides)  # what the request's flags and overrides set
    weights = given.get("init_from")  # --pretrained, --initial-checkpoint: a fine-tune too
    base, notes, saved, measuring = _base(req, flags, elsewhere, weights)
    cfg = resolve_config(req.config, flags, req.overrides, base=base)
    if req.config and not req.resume:
        cfg.expected_epochs = None  # the config's run's: this run counts its own, where it measures
    if req.config and not req.resume and (line := settle_replay(cfg, req.config, given)):
        notes.append(line)  # a run bounded by the clock, replayed step by step (train/replay.py)
    if measuring and cfg.max_minutes:  # seconds spent measuring (0: the cache had the speeds)
        notes.append(take_from_budget(cfg, measuring))
    if saved:
        check_same_model(saved, cfg, Path(req.resume))
    if req.warmup_epochs is not None:
        notes.append(warmup_in_epochs(cfg, req.warmup_epochs))
    if req.decay_epochs is not None or flags.get("schedule.step_rate") is not None:
        notes.append(step_in_epochs(cfg, req.decay_epochs))
    run_dir = Path(req.resume) if req.resume else new_run_dir(cfg, req.out)
    mcfg, init = _model_named_by(req, cfg, run_dir if req.resume else None, weights)
    threads_given = cfg.threads is not None
    if not threads_given:
        cfg.threads = default_threads(local_processes or cfg.processes)
    path = settle_path(cfg, mcfg)
    check_one_step_fits(cfg, mcfg)
    measured = None
    work = functools.cache(lambda: _work_images(cfg))  # the data probed once, and only where it is needed

    def images() -> int | None:
        return None if work() is None else work()[0]

    if measuring is None and speed_wanted(req, cfg, mcfg, images):
        measured = say_speed(cfg, mcfg, notes, req.cache_dir, images(), 0 if work() is None else work()[1])
    if cfg.tune == "auto":
        from .tune import settle_tune

        # weighs the threads of all processes, at the speed measured where it was
        notes.append(settle_tune(cfg, mcfg, images(), measured))
    if weights and not req.resume and (line := finetune_processes(cfg, mcfg, given)):
        notes.append(line)
        cfg.expected_epochs = None  # counted for one process: the share a run of these reaches is not its
        if not threads_given:  # the same CPUs, shared among the processes
            cfg.threads = default_threads(local_processes or cfg.processes)
    if not threads_given and (line := busy_note(cfg.threads, local_processes or cfg.processes)):
        notes.append(line)
    return ResolvedRun(cfg, run_dir, resume=bool(req.resume), path=path, notes=notes, model=mcfg, init=init)


def _base(req: RunRequest, flags: dict, elsewhere: bool,
          weights: str | None) -> tuple[dict | None, list[str], dict | None, float | None]:
    """The values a run starts from, the lines that say why, (resuming) the run's saved config, and the
    seconds spent measuring this machine's speed for the recipe's candidates (None: nothing measured).
    ``weights``: the weights the run starts from, if any (a fine-tune, whichever flag named them)."""
    if req.resume:
        saved = saved_run_config(Path(req.resume), req.out, elsewhere)
        return saved, [], saved or None, None
    if weights is not None:
        base, line = finetune_base(flags, req.overrides)
        lines = [line] if line else []
        if req.weights is None:  # `vitkit train` given weights (--pretrained, --initial-checkpoint)
            lines.insert(0, "fine-tuning: the run starts from weights, so it takes vitkit finetune's defaults (optim "
                         f"{base['optim']['name']}, lr {base['optim']['lr']:g}, {base['epochs']} epochs unless the "
                         "clock ends it), not a recipe for the data; the weights' own resolution and preprocessing")
        return base, lines, None, None
    if req.config is not None:
        return None, [], None, None
    if req.recipe == "none":
        return plain_base(req.data, req.data_format), ["recipe none (--recipe none): RunConfig's defaults"], None, None
    if req.data is None:
        return demo_base(_given(flags, req.overrides)), [], None, None
    recipe, seconds = data_recipe(req.data, req.data_format, flags, req.overrides, req.cache_dir)
    return recipe.base, [recipe.line], None, seconds


STEP_MARGIN = 2.0  # a run is refused when one step is estimated at more than this many times its whole budget


def check_one_step_fits(cfg: RunConfig, mcfg: ViTConfig) -> None:
    """A run on the CPU whose budget cannot hold one training step is refused in one line, before anything is
    written: the step's work (forward and backward, about 3x the forward FLOPs, times the batch) at the eager
    rate the fast-path rules were measured with (``fastpath.CPU_EAGER_RATE`` a thread), over STEP_MARGIN
    times the budget (the margin for the estimate: a CPU with AMX in bf16 runs several times faster)."""
    from ..infer.fastpath import CPU_EAGER_RATE, vit_flops

    if not cfg.max_minutes or cfg.replay or resolve_device(cfg.device).type != "cpu":
        return
    threads = max(cfg.threads or 1, 1) * max(cfg.processes, 1)
    work = 3 * vit_flops(mcfg)  # an image's forward and backward
    step_s = work * cfg.batch_size / (threads * CPU_EAGER_RATE)
    budget_s = cfg.max_minutes * 60
    if step_s > STEP_MARGIN * budget_s:
        fits = int(budget_s * threads * CPU_EAGER_RATE / work)
        advice = f"lower --batch-size (about {fits} fits) or raise" if fits >= 1 else "raise"
        raise ConfigError(f"--max-minutes {cfg.max_minutes:g}: one training step of batch {cfg.batch_size} is about "
                          f"{step_s:.0f} s of work on this CPU ({work / 1e9:.1f} GFLOPs an image on {threads} "
                          f"thread(s) at about {CPU_EAGER_RATE / 1e9:g} GFLOP/s each), more than the budget; "
                          f"{advice} --max-minutes")


def speed_wanted(req: RunRequest, cfg: RunConfig, mcfg: ViTConfig, images: Callable[[], int | None]) -> bool:
    """Whether a run whose recipe measured nothing should measure its own speed to say what its budget is in
    epochs: a new run bounded by the clock, from scratch or fine-tuning (whose mode, 'auto', is then chosen
    at the measured speed), of a model small enough (SMALL_MODEL_FLOPS) that a few of its steps take a
    second or two on a CPU. ``images``: the training images (``_work_images``), asked last."""
    from ..infer.fastpath import vit_flops

    partial = cfg.init_from and cfg.tune not in ("auto", "full")  # --tune last or probe: the whole model's speed
    if not cfg.max_minutes or req.resume or cfg.replay or partial or vit_flops(mcfg) > SMALL_MODEL_FLOPS:
        return False  # says nothing of theirs
    known = images()  # a batch larger than the data: the run refuses it, a measurement would hold it in
    return known is None or cfg.batch_size <= known  # memory first


def say_speed(cfg: RunConfig, mcfg: ViTConfig, notes: list[str], cache_dir: str | None,
              images: int | None, scored: int = 0) -> float:
    """Measure the run's speed (``train.speed``; a fine-tune's: the whole model training), take the time
    from its budget and say, first, what the budget is in epochs of ``images`` training images (in place:
    ``cfg`` and ``notes``): in the time it leaves once measuring and the end's scoring of ``scored`` images
    (``recipe.end_seconds``) are taken out, as a recipe counts its candidates'. The images a second measured."""
    from .recipe import end_seconds
    from .speed import measure_speed, reached_share, share_words

    device = resolve_device(cfg.device)
    speed = measure_speed(cfg, mcfg, device, cfg.threads, cache_dir)
    left = cfg.max_minutes * 60 - speed.seconds - end_seconds(cfg.to_dict(), speed.images_per_s, scored)
    expected = speed.images_per_s * max(left, 0.0) / (images or 1)
    share = reached_share(cache_dir, device, cfg.processes)
    epochs = expected * (share[0] if share else 1.0)
    cfg.expected_epochs = round(expected, 3)
    whole = " training the whole model" if cfg.init_from else ""
    scaled = f" {share_words(share)}" if share else ""
    line = (f"measured on {device_words(cfg.device)}: {speed.images_per_s:,.0f} img/s{whole} -> {epochs:.1f} epochs "
            f"in {cfg.max_minutes:g} min{scaled}" + (f" (the run's {cfg.epochs} epochs end it sooner)"
                                                     if epochs > cfg.epochs else ""))
    if notes and notes[0].startswith("recipe "):
        notes[0] += f"; {line}"
    else:
        notes.insert(0, line)
    if speed.seconds:
        notes.append(take_from_budget(cfg, speed.seconds))
    return speed.images_per_s


def take_from_budget(cfg: RunConfig, seconds: float) -> str:
    """Take the seconds spent measuring the machine's speed from the run's budget (in place): the budget a
    user gives is the time they wait. The line that says so."""
    cfg.max_minutes = max(round(cfg.max_minutes - seconds / 60, 4), 0.001)
    return f"measuring the speed took {seconds:.1f} s of the budget: training for {cfg.max_minutes:g} min"


def _model_named_by(req: RunRequest, cfg: RunConfig, resume_dir: Path | None, given: str | None) -> tuple:
    """``_model``; where the model is a config file's (its ``model``, ``model_args``, ``img_size`` or
    ``init_from``, not a flag's or an override's), its error names that file too, and the key where the
    weights it starts from are at fault."""
    from ..core.errors import VitkitError
    from .config import load_config_file

    try:
        return _model(cfg, resume_dir)
    except VitkitError as e:
        if req.config is None or req.resume:
            raise
        from_file = set(load_config_file(req.config)) & {"model", "model_args", "img_size", "init_from"}
        from_file -= {key.split(".")[0] for key in _given(req.flags, req.overrides)}
        if given is None and cfg.init_from and "init_from" in from_file:
            raise type(e)(f"{req.config}: init_from: {e}") from None
        if isinstance(e, ConfigError) and from_file:
            raise ConfigError(f"{req.config}: {e}") from None
        raise


def _model(cfg: RunConfig, resume_dir: Path | None) -> tuple:
    """The config of the model the run trains (the named model, the weights it starts from or
    (``resume_dir``) the run's last checkpoint), and the foreign weights read for it, if any."""
    from .build import foreign_init, model_config

    resume_from = find_checkpoint(resume_dir, "last") if resume_dir is not None else None
    init = foreign_init(cfg, resume_from)
    return model_config(cfg, init, resume_from), init


def _work_images(cfg: RunConfig) -> tuple[int, int] | None:
    """(the images the run trains on an epoch, the images it scores at its end) of its data (the built-in
    digits where it names none), as its probe counts them (``recipe.work_images``; None where it cannot tell)."""
    from ..core.errors import DataError
    from ..data.datasets import DEMO_DIR
    from .recipe import probe_data, work_images

    try:
        if cfg.data.path is None:
            return work_images(probe_data(DEMO_DIR, "demo"))
        return work_images(probe_data(cfg.data.path, cfg.data.format))
    except DataError:
        return None  # the run opens the data and says what is wrong


def settle_path(cfg: RunConfig, mcfg) -> FastPath:
    """Settle ``cfg``'s precision and channels-last for this machine's device and a model of ``mcfg`` (in
    place) and return the training path with the reasons of its choices."""
    device = resolve_device(cfg.device)
    path = training_path(mcfg, device, cfg.precision, cfg.compile, cfg.channels_last,
                         sharded=cfg.strategy == "fsdp")
    cfg.precision, cfg.channels_last = path.precision, path.channels_last
    return path


def warmup_in_epochs(cfg: RunConfig, epochs: float) -> str:
    """Set ``cfg``'s warmup to ``epochs`` epochs of its run, as a share of it (schedule.warmup_fraction);
    the line that says so. A run bounded by the clock has no number of epochs to count them in."""
    if cfg.max_minutes:
        raise ConfigError(f"--warmup-epochs: this run is bounded by the clock ({cfg.max_minutes:g} min), so its "
                          "epochs are not known ahead; give the warmup as a share of the run: --set "
                          "schedule.warmup_fraction=F")
    if not 0 <= epochs <= cfg.epochs:  # as timm, a warmup may span the whole run
        raise ConfigError(f"--warmup-epochs: must be in [0, {cfg.epochs}] (the run's epochs), got {epochs:g}")
    cfg.schedule.warmup_fraction = epochs / cfg.epochs
    return f"warmup: {epochs:g} of {cfg.epochs} epochs (schedule.warmup_fraction={cfg.schedule.warmup_fraction:g})"


def step_in_epochs(cfg: RunConfig, epochs: float | None) -> str:
    """Set ``cfg``'s step schedule to a decay every ``epochs`` epochs (schedule.step_every, a share of the run;
    None: its own share); the line that says so. Refused in one line where the run's schedule is not 'step'
    (--decay-epochs and --decay-rate shape that one alone) or where the clock bounds the run."""
    s = cfg.schedule
    if s.decay != "step":
        flag = "--decay-epochs" if epochs is not None else "--decay-rate"
        raise ConfigError(f"{flag}: spaces and sizes the decays of --sched step; this run's schedule is {s.decay!r} "
                          "(add --sched step)")
    if epochs is None:
        return f"step schedule: lr x {s.step_rate:g} after every {s.step_every:g} of the run"
    if cfg.max_minutes:
        raise ConfigError(f"--decay-epochs: this run is bounded by the clock ({cfg.max_minutes:g} min), so its "
                          "epochs are not known ahead; give the decay's spacing as a share of the run: --set "
                          "schedule.step_every=F")
    if not 0 < epochs <= cfg.epochs:
        raise ConfigError(f"--decay-epochs: must be in (0, {cfg.epochs}] (the run's epochs), got {epochs:g}")
    s.step_every = epochs / cfg.epochs
    return (f"step schedule: lr x {s.step_rate:g} every {epochs:g} of {cfg.epochs} epochs "
            f"(schedule.step_every={s.step_every:g})")


def check_same_model(saved: dict, cfg: RunConfig, run_dir: Path) -> None:
    """A resumed run trains the model it started with: a request whose model keys differ from the saved
    run's is refused in one line (so config.json keeps describing what was trained)."""
    asked = cfg.to_dict()
    for key in MODEL_KEYS:
        if key in saved and asked.get(key) != saved[key]:
            raise ConfigError(f"{key}: {run_dir} trains {_show(saved[key])}, not {_show(asked.get(key))}; --resume "
                              f"continues a run as it is (start a new run with another --out to train another)")


def _show(value) -> str:
    return "none" if value in (None, {}) else repr(value)


# ------------------------------------------------------------------------------------- the bases
def demo_base(given: dict | None = None) -> dict:
    """The demo's time budget, and its processes: 2 data-parallel processes of one thread on a CPU with 2
    or more cores (this small model keeps two processes busier than one process with two threads); 1
    process where a GPU will be used. A run ``given`` epochs and no max_minutes is bounded by its epochs."""
    cpus = cpu_run_cpus(None)
    base = dict(DEMO_BUDGET, processes=1 if cpus is None else min(DEMO_BUDGET["processes"], cpus))
    if given and given.get("epochs") is not None and given.get("max_minutes") is None:
        del base["max_minutes"]
    return base


def plain_base(data: str | None, data_format: str | None) -> dict:
    """RunConfig's defaults, no recipe laid on (--recipe none), but for the model's input channels, which
    follow the data's (as every recipe's): nothing where the data cannot be inspected (the run says why)."""
    from ..core.errors import DataError
    from ..data.datasets import DEMO_DIR
    from .recipe import probe_data

    try:
        facts = probe_data(DEMO_DIR, "demo") if data is None else probe_data(data, data_format)
    except DataError:
        return {}
    return {"model_args": {"in_chans": facts.channels}}


FLIP_KEYS = ("augment.hflip", "augment.flip_mode", "tta_flip")  # a run that sets one of these chose its own flips


def own_flips(base: dict, given: dict) -> None:
    """``base`` (in place) without its mirror check where the run sets its own flips (FLIP_KEYS): no check
    overrules what the run was told."""
    if set(FLIP_KEYS) & set(given):
        base.get("augment", {}).pop("mirror_check", None)


def finetune_base(flags: dict, overrides: list[str]) -> tuple[dict, str | None]:
    """The fine-tuning defaults (FINETUNE_DEFAULTS), and the line that says how the run's length is set:
    given ``--max-minutes`` and no ``--epochs``, the clock ends the run (CLOCK_EPOCHS epochs, the schedule
    fitted to the time), as a recipe's run bounded by the clock does, so that the budget is used."""
    from .recipe import CLOCK_EPOCHS

    base = copy.deepcopy(FINETUNE_DEFAULTS)
    given = _given(flags, overrides)
    own_flips(base, given)
    minutes = _number(given.get("max_minutes"))
    if not minutes or given.get("epochs") is not None:
        return base, None
    base["epochs"] = CLOCK_EPOCHS
    return base, f"fine-tuning: schedule fitted to {minutes:g} min (--max-minutes; --epochs N ends it sooner)"


def finetune_processes(cfg: RunConfig, mcfg: ViTConfig, given: dict) -> str | None:
    """A fine-tuning run bounded by the clock on a CPU of 2 or more cores, of a model of at most
    SMALL_MODEL_FLOPS forward FLOPs an image, trains as CPU_PROCESSES processes (in place), as the recipes'
    runs do (their small models kept two processes busier than one of two threads: recipe.CPU_PROCESSES);
    the line that says so (None: one process). ``--nproc`` (or ``processes``) wins; a probe (its head trains
    on cached features) stays one process."""
    from ..infer.fastpath import vit_flops
    from .recipe import CPU_PROCESSES

    cpus = cpu_run_cpus(cfg.device)
    if "processes" in given or not cfg.max_minutes or cpus is None or cpus < CPU_PROCESSES or cfg.tune == "probe":
        return None
    flops = vit_flops(mcfg)
    if flops > SMALL_MODEL_FLOPS:
        return None
    cfg.processes = CPU_PROCESSES
    return (f"fine-tuning: {CPU_PROCESSES} processes on the CPU (a small model: {flops / 1e9:.2f} GFLOPs an image, "
            f"at most {SMALL_MODEL_FLOPS / 1e9:g}; --nproc N changes it)")


def _given(flags: dict, overrides: list[str]) -> dict:
    """The values the flags and ``--set`` overrides give, by dotted key (overrides win)."""
    given = {k: v for k, v in flags.items() if v is not None}
    for text in overrides:
        key, value = parse_override(text)
        given[".".join(key)] = value
    return given


def data_recipe(data: str, data_format: str | None, flags: dict, overrides: list[str],
                cache_dir: str | None = None):
    """The recipe for ``data`` (train/recipe.py), told the budget, processes and model the flags or overrides
    give, and the speed of this machine for each of its candidates (measured, or from ``cache_dir``); and
    the seconds measuring took (None: the recipe measured nothing)."""
    from .recipe import laid_over_model, recipe_for

    given = _given(flags, overrides)
    model = given.get("model")
    cpus = cpu_run_cpus(given.get("device"))
    spent: list[float] = []
    speed = recipe_speed(flags, overrides, cache_dir, spent)
    recipe = recipe_for(data, data_format, _number(given.get("max_minutes")), _number(given.get("epochs")),
                        cpus=cpus, processes=_whole(given.get("processes")),
                        model=model if isinstance(model, str) else None,
                        cpu_bf16=cpu_bf16_kind() if cpus is not None else None, speed=speed,
                        where=device_words(given.get("device")), batch_size=_whole(given.get("batch_size")),
                        end=given, share=lambda processes: run_share(cache_dir, given.get("device"), processes))
    name = given.get("optim.name")
    if name is not None and name != "muon" and "optim.muon_convs" not in given:  # another optimizer than the
        recipe.base.get("optim", {}).pop("muon_convs", None)  # recipe's Muon: none of Muon's own settings
    own_flips(recipe.base, given)
    return laid_over_model(recipe, model, set(given)), sum(spent) if spent else None


def recipe_speed(flags: dict, overrides: list[str], cache_dir: str | None, spent: list[float]):
    """The function a recipe measures its candidates' speed with: a candidate's values (a dict), with the
    run's flags and overrides laid over them, -> images per second on the run's device
    (``train.speed.measure_speed``); the seconds each measurement took are added to ``spent``. Candidates whose
    steps cost the same (``train.speed.speed_key``: they differ in a learning rate, say) are measured once: a
    busy machine's speeds are not kept in the cache, and each measurement is seconds of the run's budget."""
    from .build import model_config
    from .speed import measure_speed, speed_key

    seen: dict[str, float] = {}

    def speed(base: dict) -> float:
        cfg = resolve_config(None, flags, overrides, base=base)
        mcfg = model_config(cfg)
        settle_path(cfg, mcfg)
        threads = cfg.threads or default_threads(cfg.processes)
        device = resolve_device(cfg.device)
        key = speed_key(cfg, mcfg, device, threads)
        if key not in seen:
            measured = measure_speed(cfg, mcfg, device, threads, cache_dir)
            spent.append(measured.seconds)
            seen[key] = measured.images_per_s
        return seen[key]

    return speed


def run_share(cache_dir: str | None, device, processes: int) -> tuple[float, int] | None:
    """The share of their expected epochs that recent runs of ``processes`` processes reached on the run's
    device (``train.speed.reached_share``); None where none is recorded or the device is not there."""
    from .speed import reached_share

    try:
        dev = resolve_device(device or "auto")
    except ConfigError:
        return None
    return reached_share(cache_dir, dev, processes)


def device_words(device) -> str:
    """The run's device as the recipe's line names it: this CPU and its instruction set, or the GPU."""
    try:
        dev = resolve_device(device or "auto")
    except ConfigError:
        return "this machine"
    if dev.type == "cuda":
        import torch

        return torch.cuda.get_device_name(dev)
    if dev.type != "cpu":
        return dev.type
    amx = ", AMX" if cpu_bf16_kind() == "amx" else ""
    return f"this CPU ({cpu_capability()}{amx})"


def cpu_run_cpus(device) -> int | None:
    """The CPUs a run on ``device`` (a flag's value; None: auto) may use when it trains on the CPU; None
    when it trains on a GPU."""
    try:
        on_cpu = resolve_device(device or "auto").type == "cpu"
    except ConfigError:  # an unusable device: the run reports it in its own words
        return None
    return usable_cpus() if on_cpu else None


def _whole(value) -> int | None:
    """An override's value as a whole number, or None when it is none or not one (resolve_config judges it)."""
    number = _number(value)
    return int(number) if number is not None and float(number).is_integer() else None


def _number(value):
    """An override's value as a finite number a float holds, or None when it is none or not one
    (resolve_config judges it: NaN, 10**400)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        try:
            value = None if value is None else float(value)
        except (TypeError, ValueError):
            return None
    return value if is_finite_real(value) else None


def saved_run_config(run_dir: Path, out: str | None, elsewhere: bool = False) -> dict:
    """The config.json of the run that --resume continues (checked alone, so that an error names it).
    ``elsewhere``: see ``resolve_run``; such a process starts from the request's values alone (an empty
    base)."""
    saved = run_dir / RUN_CONFIG
    if not saved.is_file() and elsewhere:
        return {}
    if not saved.is_file():
        raise ConfigError(f"--resume {run_dir}: no {RUN_CONFIG} there; not a vitkit run directory")
    base = read_run_config(saved)
    checked_run_config(base, saved)
    if out and Path(out) != run_dir:
        raise ConfigError("--out and --resume name different directories; --resume continues in place")
    return base


def new_run_dir(cfg: RunConfig, out: str | None) -> Path:
    """``out``, or runs/<model or weights' name>-<date-time>."""
    if out:
        return Path(out)
    name = cfg.model
    if cfg.init_from:
        init = Path(cfg.init_from)
        name = init.stem if init.is_file() else init.name
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def default_threads(local_processes: int) -> int:
    """CPU threads per process: the cores not already busy (1-minute load average), shared among this
    machine's processes. Threads competing with other work for a core spin and wait, which on small
    models is several times slower than using fewer threads."""
    cpus = usable_cpus()
    free = cpus - int(round(load_average()))
    return max(1, min(cpus, free) // max(local_processes, 1))


def busy_note(threads: int, local_processes: int) -> str | None:
    """The line that says why each process got ``threads``, fewer than its share of the CPUs: the load
    other work put on them as the run was resolved (``default_threads``); None when it got its share."""
    cpus = usable_cpus()
    share = max(1, cpus // max(local_processes, 1))
    if threads >= share:
        return None
    return (f"threads: {threads} per process, not {share}: the 1-minute load average was {load_average():.1f} on {cpus} "
            f"CPUs as the run started (other work; threads that share a core wait for each other); config.json "
            f"records the {threads} it trains with; --threads {share} takes them all")


# ------------------------------------------------------------------------------------ the record
def write_resolved(run: ResolvedRun) -> Path:
    """Write the resolved run to its directory's config.json (atomically), for the processes a launcher
    starts; return the file. (A resumed run's record is the run continued: its config with what the
    request changes, such as a longer budget, as the run itself writes it when it starts.) The run
    directory's rules (``build.check_run_dir``: its lock above all) are checked first, and the lock is held
    while the file is written, so that a run another process holds is never changed."""
    from ..io.atomic import ensure_dir
    from .build import check_run_dir

    file = run.run_dir / RUN_CONFIG
    check_run_dir(run.run_dir, run.resume)
    ensure_dir(run.run_dir)
    with RunLock(run.run_dir):
        write_json(file, run.cfg.to_dict())
    return file


def read_resolved(run_dir: Path, resume: bool = False) -> ResolvedRun:
    """The run a launcher resolved and wrote to ``run_dir`` (``write_resolved``), as a process it started
    takes it: nothing is resolved again."""
    file = Path(run_dir) / RUN_CONFIG
    data = read_run_config(file)
    cfg = checked_run_config(data, file)
    return ResolvedRun(cfg, Path(run_dir), resume=resume)


__all__ = ["RunRequest", "ResolvedRun", "resolve_run", "write_resolved", "read_resolved", "settle_path",
           "check_same_model", "demo_base", "data_recipe", "finetune_base", "finetune_processes", "saved_run_config",
           "new_run_dir", "default_threads", "cpu_run_cpus", "MODEL_KEYS", "RUN_CONFIG"]

"""The entry points: ``create_model`` (a named model with fresh weights, or a model read from weights on disk
in any format) and ``fit`` (a training run, resolved as `vitkit train` resolves it).

    model = vitkit.create_model("vit_small_patch16_224", seed=0)                  # random weights
    model = vitkit.create_model(weights="vit_small.safetensors")                   # timm weights
    model = vitkit.create_model("vit_small_patch16_224", weights="ViT-S_16.npz", num_classes=10)
    model = vitkit.create_model("vit_small_patch16_224", pretrained=True)           # its published weights
    model = vitkit.create_model(weights="hf-hub:google/vit-base-patch16-224")       # from the Hugging Face Hub

With ``weights``, the format is told by the container (``io.convert.detect_format``: a vitkit checkpoint
or run directory, an HF folder, a JAX .npz file, a timm .pth / .bin / .safetensors file) and the
architecture is read from the weights as ``vitkit convert`` reads it. A name is then optional: None
(or 'auto') takes everything from the weights and fills in what they do not show (heads, LayerNorm
eps, activation, pooling) with defaults; a name supplies those fields from that model instead, after
checking that it agrees with the weights on width, depth, patch size, channels and MLP width.
``io.convert.read`` gives the same model together with what was assumed.

``pretrained=True`` reads the named model's published weights (``io.hub.PRETRAINED``: timm's default tag
for that architecture) from the Hugging Face Hub, as ``weights="hf-hub:ORG/NAME"`` reads any repository
(``pip install 'vitkit[hub]'``); the model's ``preprocess`` is the one its publisher gives.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from .core.errors import ConfigError, TrainingError
from .model.variants import build_model


def create_model(name: str | None = None, seed: int | None = None, *, pretrained: bool = False,
                 weights: str | os.PathLike | None = None, **overrides):
    """A model: ``name`` with random weights (``seed`` makes them reproducible), or read from ``weights`` (a
    path or a Hub name), or (``pretrained``) from ``name``'s published weights.

    Reading weights, ``overrides`` set ViTConfig fields the weights do not show (as ``vitkit convert
    --set``), and ``num_classes`` different from the weights' head gives a new, zero-initialised head
    of that size (the labels are dropped). A vitkit checkpoint carries its config: it takes no name and
    no overrides but num_classes. The model is in eval mode on the CPU, as ``vitkit.load`` gives it.
    """
    if pretrained:
        if weights is not None:
            raise ConfigError("create_model: give pretrained=True (the name's published weights) or weights=..., "
                              "not both")
        if name in (None, "auto"):
            raise ConfigError("create_model: pretrained=True needs a model name (vitkit.list_models())")
        from .io.hub import pretrained_name
        from .model.variants import get_config

        get_config(name)  # an unknown name is that error
        weights = pretrained_name(name)
    if weights is None:
        if name in (None, "auto"):
            raise ConfigError("create_model: give a model name (vitkit.list_models()) or weights=PATH")
        return build_model(name, seed=seed, **overrides)
    from .io.convert import read

    num_classes = overrides.pop("num_classes", None)
    model, _ = read(weights, model_name=None if name in (None, "auto") else name, overrides=overrides)
    if num_classes is not None and num_classes != model.cfg.num_classes:
        model.reset_head(num_classes)
    return model



# ------------------------------------------------------------------------------------------- fit
@dataclass
class FitResult:
    """What ``fit`` returns: the run's summary (as summary.json holds it) and its directory."""

    summary: dict
    run_dir: Path

    def __getitem__(self, key):
        return self.summary[key]


def fit(data: str | os.PathLike | None = None, *, weights: str | os.PathLike | None = None,
        out: str | os.PathLike | None = None, max_minutes: float | None = None, epochs: int | None = None,
        model: str | None = None, config: str | os.PathLike | None = None, resume: str | os.PathLike | None = None,
        settings: dict[str, Any] | None = None, overrides: list[str] | None = None, loggers: list | None = None,
        cache_dir: str | os.PathLike | None = "default", log: Callable[[str], None] | None = print,
        progress=None) -> FitResult:
    """Train on ``data`` as ``vitkit train --data DATA`` does (or, with ``weights``, fine-tune them as
    ``vitkit finetune WEIGHTS --data DATA`` does): the same request resolved the same way
    (``train.resolve.resolve_run``: the recipe chosen from the data, or the fine-tuning defaults; the
    processes, threads and precision for this machine), and the same run directory. Returns the summary
    and the run's directory.

        result = vitkit.fit("photos/", max_minutes=5, out="runs/photos")
        result = vitkit.fit("photos/", weights="runs/photos/best", settings={"optim.lr": 0.003})

    ``data``: a folder, split folder, MNIST or CIFAR directory (None: the built-in digits). ``settings``:
    config keys (dotted, as ``--set`` takes them) and values; ``overrides``: 'KEY=VALUE' texts. ``model``:
    a named model (`vitkit list`), or with foreign ``weights`` the named model that supplies what they do
    not show. ``loggers``: objects with ``log_metrics(metrics: dict, step: int)`` (and optionally
    ``log_hparams(config: dict)`` and ``close()``), fed as the run logs; a run of several processes runs in
    processes of its own (started as `vitkit train --nproc N` starts them), whose records reach the
    loggers, from its metrics.jsonl, when it ends. ``cache_dir``: where decoded image folders are cached
    (docs/data.md), by default where `vitkit train` caches them (``data.cache.user_cache``: ~/.cache/vitkit; the
    command line follows $XDG_CACHE_HOME, which a library call does not read: pass its folder here); None: no
    cache. ``log``: where the run's lines go (None: nowhere); ``progress``: a ``core.progress.Progress``.
    """
    from .train.resolve import RunRequest, resolve_run

    flags = _settings(settings)
    cache_dir = _cache_folder(cache_dir)
    flags.update({"max_minutes": max_minutes, "epochs": epochs})
    flags["init_model" if weights is not None else "model"] = model
    req = RunRequest(data=None if data is None else str(data), weights=None if weights is None else str(weights),
                     config=None if config is None else str(config), flags=flags, overrides=list(overrides or []),
                     out=None if out is None else str(out), resume=None if resume is None else str(resume),
                     cache_dir=None if cache_dir is None else str(cache_dir))
    if weights is not None and data is None and resume is None:
        raise ConfigError("fit: fine-tuning needs data (a folder, MNIST or CIFAR directory)")
    run = resolve_run(req)
    say = log or (lambda m: None)
    for note in run.notes:
        say(note)
    if run.cfg.processes > 1:
        summary = _fit_launched(run, cache_dir, log is None)
        _replay(run.run_dir, run.cfg.to_dict(), loggers)
    else:
        summary = _fit_here(run, cache_dir, loggers, say, progress)
    return FitResult(summary, run.run_dir)


def _settings(settings) -> dict[str, Any]:
    """``fit``'s ``settings`` as the flags of a run request: a mapping of dotted config keys (text) to values;
    anything else is a ConfigError saying what was given."""
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise ConfigError(f"fit: settings must be a dict of config keys and values (e.g. {{'optim.lr': 0.003}}), "
                          f"got {type(settings).__name__} {settings!r:.80}")
    for key in settings:
        if not isinstance(key, str) or not all(key.split(".")):
            raise ConfigError(f"fit: settings key {key!r}: expected a dotted config key such as 'optim.lr'")
    return dict(settings)


def _cache_folder(cache_dir):
    """``fit``'s cache_dir: 'default' is the folder `vitkit train` caches in by default."""
    from .data.cache import user_cache

    return user_cache() if cache_dir == "default" else cache_dir


def _fit_here(run, cache_dir, loggers, say, progress) -> dict:
    """The resolved run trained in this process."""
    from .train.loop import train

    return train(run.cfg, run.run_dir, resume=run.resume, progress=progress, log=say, path=run.path,
                 cache_dir=cache_dir, loggers=list(loggers or ()), init=run.init)


def _fit_launched(run, cache_dir, quiet: bool) -> dict:
    """The resolved run trained by ``run.cfg.processes`` processes on this machine, started as
    `vitkit train --nproc N` starts them: each reads the run from its config.json."""
    import json

    from .train.build import preflight
    from .train.launch import launch, launch_plan
    from .train.resolve import write_resolved

    run.init = None  # the processes read the weights themselves
    preflight(run.cfg, run.run_dir, run.resume, run.model)
    write_resolved(run)
    argv = ["train", "--out", str(run.run_dir), "--resolved", "--cache-dir", str(cache_dir or "none")]
    argv += (["--resume", str(run.run_dir)] if run.resume else []) + (["--quiet"] if quiet else [])
    code = launch(argv, launch_plan(run.cfg.processes), run.run_dir)
    summary_file = run.run_dir / "summary.json"
    if code != 0 or not summary_file.is_file():
        raise TrainingError(f"{run.run_dir}: the run's processes ended with exit code {code}; see the lines above "
                            f"(continue with vitkit.fit(resume={str(run.run_dir)!r}))")
    return json.loads(summary_file.read_text())


def _replay(run_dir: Path, config: dict, loggers: list | None) -> None:
    """Feed the run's metrics.jsonl records to ``loggers`` as a run feeds them (``train.metrics.ObjectLog``),
    then close them."""
    import json

    from .train.metrics import ObjectLog

    if not loggers:
        return
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    for obj in loggers:
        log = ObjectLog(obj, config)
        log.open(0)
        for rec in records:
            log.write(rec)
        log.close()


__all__ = ["create_model", "fit", "FitResult"]

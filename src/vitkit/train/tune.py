"""What a fine-tuning run trains: the whole model ('full'), its last blocks ('last', with the final norm
and the head), or its head alone on a frozen backbone ('probe'); 'auto' chooses from the budget and the
model's size.

The rule (``choose_tune``), for a run bounded by the clock on a CPU: the seconds of one epoch in each
mode follow from the model's forward FLOPs (``infer.fastpath.vit_flops``: a training step's backward costs
twice its forward, and a frozen part runs forward only) at the rate this CPU trains the whole model, as
measured before the run (``train.speed``, for a model small enough to measure in seconds), else at the
CPU's eager rate (``CPU_EAGER_RATE`` FLOP/s a thread, an estimate); the first mode, in the order full,
last, probe, that the budget gives at least ``MIN_EPOCHS`` epochs is taken. The probe trains on features
computed once (train/probe.py): its cost is one forward pass over the data, whatever its epochs, and it
is the mode left when neither of the others fits. A run of fixed epochs, or on a GPU, trains the whole model.
"""

from __future__ import annotations

from torch import nn

from ..core.errors import ConfigError
from ..core.hardware import resolve_device
from ..infer.fastpath import CPU_EAGER_RATE, vit_flops

TUNE_MODES = ("auto", "full", "last", "probe")
MIN_EPOCHS = 3  # a mode is chosen where the budget gives it at least this many epochs


def step_flops(mcfg, mode: str, blocks: int) -> float:
    """FLOPs of one training image in ``mode``: the forward pass, and the backward (2x forward) of the
    part that trains (the last ``blocks`` blocks for 'last'). For 'probe' the forward pass that computes the
    image's features, once a run (its head's steps on them are not worth counting), not once an epoch."""
    fwd = vit_flops(mcfg)
    trained = {"full": 1.0, "last": min(blocks, mcfg.depth) / mcfg.depth, "probe": 0.0}[mode]
    return fwd * (1 + 2 * trained)


def choose_tune(mcfg, images: int, minutes: float | None, threads: int, blocks: int,
                on_cpu: bool = True, measured: float | None = None) -> tuple[str, str]:
    """The mode for fine-tuning a model of ``mcfg`` on ``images`` training images within ``minutes`` (None
    or 0: no limit) on ``threads`` CPU threads in all, and why. ``measured``: the images a second this
    machine trains the whole model at (None: estimated from ``threads``)."""
    if not minutes:
        return "full", "a run of fixed epochs trains the whole model"
    if not on_cpu:
        return "full", "on a GPU the whole model trains within any budget this rule weighs"
    if measured is not None:
        rate, kind = measured * step_flops(mcfg, "full", blocks), "a measured"
    else:
        rate, kind = CPU_EAGER_RATE * max(threads, 1), "an estimated"
    epochs = {}
    for mode in ("full", "last"):
        epochs[mode] = minutes * 60 / max(images * step_flops(mcfg, mode, blocks) / rate, 1e-9)
        if epochs[mode] >= MIN_EPOCHS:
            break
    else:
        mode = "probe"
    est = ", ".join(f"{m} ~{e:.1f}" for m, e in epochs.items())
    why = f"the budget gives {kind} {est} epochs ({MIN_EPOCHS} needed)"
    if mode == "probe":
        features = images * step_flops(mcfg, "probe", blocks) / rate
        why += (f"; the probe's features take ~{features / 60:.1f} min once (within the budget, on fewer training "
                "images when they do not fit), then its epochs next to nothing")
    return mode, why


def settle_tune(cfg, mcfg, images: int | None, measured: float | None = None) -> str:
    """Settle a RunConfig's ``tune`` 'auto' (in place) by ``choose_tune`` for a model of ``mcfg`` and
    ``images`` training images (None: not known); the line that says what and why. ``measured``: see
    ``choose_tune``."""
    if images is None:
        cfg.tune, why = "full", "the data's size could not be told ahead"
    else:
        on_cpu = resolve_device(cfg.device).type == "cpu"
        cfg.tune, why = choose_tune(mcfg, images, cfg.max_minutes, (cfg.threads or 1) * cfg.processes,
                                    cfg.tune_blocks, on_cpu, measured)
    what = {"full": "the whole model", "last": f"the last {cfg.tune_blocks} blocks and the head",
            "probe": "the head on the frozen backbone (a linear probe)"}[cfg.tune]
    unused = ("; --layer-decay does not apply: the probe trains the head alone, at the full lr"
              if cfg.tune == "probe" and cfg.optim.layer_decay is not None else "")
    return f"fine-tuning {cfg.tune}: {what}; {why} (--tune forces one){unused}"


def probe_processes_error(processes: int) -> ConfigError:
    """The error of a probe asked to run in ``processes`` (> 1) processes: it trains in one (train/probe.py)."""
    return ConfigError(f"tune: 'probe' trains the head on features computed once, in one process, not {processes}; "
                       "use --nproc 1 (or --tune last to train with several)")


def freeze_for(model: nn.Module, mode: str, blocks: int) -> int:
    """Leave trainable only what ``mode`` trains (in place): 'full' everything; 'last' the last ``blocks``
    blocks, the final norm, the pooling, fc_norm, pre-logits and the head; 'probe' the head alone (it trains
    on the features its input holds, train/probe.py). Returns the trainable parameters' count."""
    if mode not in TUNE_MODES[1:]:
        raise ConfigError(f"tune: expected one of {', '.join(TUNE_MODES[1:])} once settled, got {mode!r}")
    if mode != "full":
        model.requires_grad_(False)
        train = [model.head]
        if mode == "last":
            train += [model.fc_norm, model.pre_logits, model.norm]
            train += model.blocks[len(model.blocks) - min(blocks, len(model.blocks)):]
            train += [model.attn_pool] if model.attn_pool is not None else []
        for part in train:
            part.requires_grad_(True)
        for m in model.modules():  # a frozen BatchNorm (a conv stem's) keeps normalising as it was trained
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and not any(q.requires_grad for q in m.parameters()):
                m.register_forward_pre_hook(_as_evaluated)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _as_evaluated(module: nn.Module, args) -> None:
    module.train(False)  # running statistics, never updated: a training step does not move a frozen layer


__all__ = ["TUNE_MODES", "MIN_EPOCHS", "choose_tune", "settle_tune", "freeze_for", "step_flops",
           "probe_processes_error"]

"""Training: run config, optimizer and schedule, resumable checkpoints, distributed setup, the trainer.

    from . import RunConfig, train
    summary = train(RunConfig(epochs=5), "runs/demo")   # the demo recipe on the built-in digits
"""

from .build import model_config, preflight
from .config import DataConfig, OptimConfig, RunConfig, ScheduleConfig, resolve_config
from .distributed import DistInfo
from .ema import EMA
from .loop import train
from .state import TrainerState
from .trainer import StepResult, Trainer, evaluate_split

__all__ = ["RunConfig", "DataConfig", "OptimConfig", "ScheduleConfig", "resolve_config", "DistInfo", "train",
           "evaluate_split", "model_config", "preflight", "Trainer", "StepResult", "TrainerState", "EMA"]

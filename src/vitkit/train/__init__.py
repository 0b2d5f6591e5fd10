"""Training: run config, optimizer and schedule, resumable checkpoints, distributed setup, the loop.

    from vitkit.train import RunConfig, train
    summary = train(RunConfig(epochs=5), "runs/demo")   # the demo recipe on the built-in digits
"""

from .config import DataConfig, OptimConfig, RunConfig, ScheduleConfig, resolve_config
from .distributed import DistInfo
from .loop import evaluate, train

__all__ = ["RunConfig", "DataConfig", "OptimConfig", "ScheduleConfig", "resolve_config", "DistInfo", "train", "evaluate"]

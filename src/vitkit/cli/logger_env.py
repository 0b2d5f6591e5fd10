"""The loggers' settings a user makes in the environment, read by the CLI and passed to the run config.

wandb and MLflow users set them with their libraries' variables; the library code never reads the
environment, so the CLI does, here: WANDB_MODE (else 'online' where wandb has credentials, that is
WANDB_API_KEY or an api.wandb.ai entry in ~/.netrc, and otherwise the run config's default, offline),
WANDB_PROJECT, MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Mapping

WANDB_HOST = "api.wandb.ai"


def has_wandb_credentials(environ: Mapping[str, str], home: Path) -> bool:
    """Whether wandb can log in without asking: WANDB_API_KEY, or an api.wandb.ai entry in ~/.netrc."""
    if environ.get("WANDB_API_KEY"):
        return True
    file = Path(environ.get("NETRC") or home / ".netrc")
    try:
        return netrc.netrc(str(file)).authenticators(WANDB_HOST) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def logger_settings(environ: Mapping[str, str] | None = None, home: Path | None = None) -> dict:
    """The run-config keys that the environment sets for the loggers (None: not set, the config's default)."""
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    mode = environ.get("WANDB_MODE") or None
    if mode is None and has_wandb_credentials(environ, home):
        mode = "online"
    return {
        "wandb_mode": mode,
        "wandb_project": environ.get("WANDB_PROJECT") or None,
        "mlflow_tracking_uri": environ.get("MLFLOW_TRACKING_URI") or None,
        "mlflow_experiment": environ.get("MLFLOW_EXPERIMENT_NAME") or None,
    }

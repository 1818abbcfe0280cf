"""scalelab: a reproducible experiment pipeline for LLM research."""

from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.1.0"

# Threads per training process, set by the pipeline flow for each worker (cores / workers, issue 6). It overrides
# `pretrain.threads` without being a param: it decides where the work runs, not what it computes (up to the order
# of floating-point sums).
THREADS_ENV = "SCALELAB_THREADS"


def project_root() -> Path:
    """The folder holding params.yaml/dvc.yaml: SCALELAB_ROOT or DVC_ROOT, else the nearest ancestor of the cwd that has one."""
    for var in ("SCALELAB_ROOT", "DVC_ROOT"):  # DVC sets DVC_ROOT for stage commands
        if env := os.environ.get(var):
            return Path(env).resolve()
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        if (d / "dvc.yaml").exists() or (d / "params.yaml").exists():
            return d
    return cwd


def offline_defaults() -> None:
    """Offline, telemetry-free defaults that never override what the user already set."""
    root = project_root()
    defaults = {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(root / ".cache" / "huggingface"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "MLFLOW_ENABLE_TELEMETRY": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",
        "PREFECT_HOME": str(root / ".prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # the flow's temporary Prefect server: 20 s by default, which a busy 2-core machine exceeds
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "DVC_NO_ANALYTICS": "1",
        "TOKENIZERS_PARALLELISM": "true",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


offline_defaults()

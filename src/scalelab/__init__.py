"""scalelab: a reproducible experiment pipeline for LLM research."""

from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.1.0"

# Threads per training process, set by the pipeline flow for each worker (cores / workers). It overrides
# `pretrain.threads` without being a param: it decides where the work runs, not what it computes (up to the order
# of floating-point sums).
THREADS_ENV = "SCALELAB_THREADS"


# `dvc exp run --temp` and queued experiments run in a copy of the repo under <repo>/.dvc/tmp/exps/ (DVC's
# EXEC_TMP_DIR); DVC sets DVC_ROOT to the original repo there, and DVC_EXP_NAME / DVC_EXP_BASELINE_REV.
EXP_TMP = (".dvc", "tmp", "exps")
EXP_ENV = {"DVC_EXP_NAME": "dvc.exp_name", "DVC_EXP_BASELINE_REV": "dvc.exp_baseline_rev"}  # env var -> run tag


def _workspace_of(d: Path) -> Path | None:
    """The nearest ancestor of `d` (itself included) holding dvc.yaml or params.yaml."""
    return next((a for a in (d, *d.parents) if (a / "dvc.yaml").exists() or (a / "params.yaml").exists()), None)


def project_root() -> Path:
    """The workspace whose params and data a stage reads: SCALELAB_ROOT, else DVC_ROOT (DVC sets it for stage
    commands), else the nearest ancestor of the cwd that holds dvc.yaml/params.yaml. In an experiment's temporary
    copy, where DVC_ROOT names the original repo, it is the copy the stage runs in."""
    if env := os.environ.get("SCALELAB_ROOT"):
        return Path(env).resolve()
    cwd = Path.cwd().resolve()
    if env := os.environ.get("DVC_ROOT"):
        root = Path(env).resolve()
        inside_exp = cwd.is_relative_to(root.joinpath(*EXP_TMP)) and cwd != root.joinpath(*EXP_TMP)
        return (_workspace_of(cwd) or cwd) if inside_exp else root
    return _workspace_of(cwd) or cwd


def store_root() -> Path:
    """The repo whose MLflow store, caches and Prefect home a stage uses: the project root, or for an experiment's
    temporary copy (<repo>/.dvc/tmp/exps/...) the original repo, so that its runs outlive the copy."""
    root = project_root()
    parts = root.parts
    for i in range(len(parts) - len(EXP_TMP)):
        if parts[i + 1:i + 1 + len(EXP_TMP)] == EXP_TMP:
            return Path(*parts[:i + 1])
    return root


def experiment_tags() -> dict[str, str]:
    """MLflow tags naming the DVC experiment a stage runs in (`dvc exp run`): {} outside one."""
    return {tag: os.environ[var] for var, tag in EXP_ENV.items() if os.environ.get(var)}


def offline_defaults() -> None:
    """Offline, telemetry-free defaults that never override what the user already set."""
    root = store_root()  # an experiment's temporary copy logs to, and caches in, the repo it came from
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
        # `mlflow server` (make ui, the team server) otherwise starts 7 Huey job consumers for MLflow's GenAI jobs,
        # which scalelab never submits: idle, they kept 1.1 cores busy on this machine (0.01 without)
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
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

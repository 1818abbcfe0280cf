"""A copy of the project's code in a fresh git repo, for tests and benchmarks that run DVC stages (no side effects on
import, unlike conftest)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "tests" / "micro_params.yaml"
# A Prefect database already migrated by this Prefect (tests/conftest.py's `prefect_db` builds one per test run): a
# server started on a fresh home otherwise spends ~6 CPU s in Prefect's migrations, and the suite started ~8 of them.
PREFECT_DB_ENV = "SCALELAB_TEST_PREFECT_DB"


def seed_prefect_home(home: Path, name: str = "prefect.db") -> Path:
    """`home` with a copy of the test run's migrated Prefect database as `name` (Prefect's default file in a home),
    unless it has one. Without one (a benchmark run on its own) the home is left as it is: its server migrates, as a
    user's first one does."""
    home.mkdir(parents=True, exist_ok=True)
    if (db := os.environ.get(PREFECT_DB_ENV)) and not (home / name).exists():
        shutil.copyfile(db, home / name)
    return home


def workspace_copy(ws: Path, params: Path = MICRO, code: Path = ROOT) -> dict[str, str]:
    """The code of `code` as it is now (tracked or not, without results) in a fresh git repo at `ws`, with `params`
    as params.yaml; returns the environment its stages run in: its own root and MLflow store, this venv first on
    PATH, and its src/ first on PYTHONPATH (stages import that copy's library, not the installed one)."""
    listed = subprocess.run(["git", "ls-files"], cwd=code, capture_output=True, text=True).stdout.split()
    for rel in [*listed, "stages", "src", "corpus", "dvc.yaml", ".dvc/config", ".dvcignore"]:
        if rel.startswith(("metrics/", "plots/", "data/")) or rel == "dvc.lock":
            continue
        src = code / rel
        if src.is_dir():
            shutil.copytree(src, ws / rel, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ws / rel)
    shutil.copy2(params, ws / "params.yaml")
    env = {**os.environ, "SCALELAB_ROOT": str(ws), "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ws / "src"), os.environ.get("PYTHONPATH")])),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID"):
        env.pop(var, None)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=ws, env=env, check=True, capture_output=True)
    return env

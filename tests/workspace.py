"""A copy of the project's code in a fresh git repo, for tests and benchmarks that run DVC stages (no side effects on
import, unlike conftest)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "tests" / "micro_params.yaml"
# A Prefect database already migrated by this Prefect (tests/conftest.py's `prefect_db` builds one per test run): a
# server started on a fresh home otherwise spends ~6 CPU s in Prefect's migrations, and the suite started ~8 of them.
PREFECT_DB_ENV = "SCALELAB_TEST_PREFECT_DB"
# Where the test run's migrated MLflow store is (tests/conftest.py sets it; seed_mlflow_store builds it on first use):
# a workspace's first tracked stage otherwise creates its store, MLflow's migrations (~0.6-1.8 CPU s, ~5.5 s wall on a
# disk /tmp), and the suite creates dozens of workspaces.
MLFLOW_DB_ENV = "SCALELAB_TEST_MLFLOW_DB"
# Where the test run's remembered `scalelab check` verdicts on the micro profile are (tests/conftest.py sets it;
# seed_check_verdicts builds them on first use): a workspace's first DVC command or flow otherwise builds every
# optimizer of the profile (torch and pytorch-optimizer imported in a child: ~6 CPU s), the same verdict in each of the
# suite's ~15 micro workspaces, since a verdict's key is the params' and the code's content (scalelab.pipeline.check).
CHECKED_ENV = "SCALELAB_TEST_CHECKED"


def seed_prefect_home(home: Path, name: str = "prefect.db") -> Path:
    """`home` with a copy of the test run's migrated Prefect database as `name` (Prefect's default file in a home),
    unless it has one. Without one (a benchmark run on its own) the home is left as it is: its server migrates, as a
    user's first one does."""
    home.mkdir(parents=True, exist_ok=True)
    if (db := os.environ.get(PREFECT_DB_ENV)) and not (home / name).exists():
        shutil.copyfile(db, home / name)
    return home


def seed_mlflow_store(db: Path) -> Path:
    """`db` as a copy of the test run's migrated MLflow store, unless it exists. Without one (a benchmark run on its
    own) nothing is written: the first tracked stage creates the store, as a user's first run does."""
    if not (seed := os.environ.get(MLFLOW_DB_ENV)) or db.exists():
        return db
    seed = Path(seed)
    if not seed.exists():  # built once per test run, by the first process to need it (the xdist workers share it)
        with open(seed.with_name(f"{seed.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not seed.exists():
                from scalelab.tracking.store import _create_sqlite_store

                _create_sqlite_store(seed)  # the production code path: the schema a stage would create
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(seed, db)
    # MLflow's "Default" experiment (id 0) records <creating process's cwd>/mlruns/0 as its artifact folder; a stage
    # creating the store runs in its workspace. Nothing of scalelab logs there (its own experiment keeps artifacts
    # beside the store), but the copy must not point into the folder the seed was built from.
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                    (str(db.parent / "mlruns" / "0"),))
    return db


def seed_check_verdicts(ws: Path, env: dict[str, str]) -> None:
    """`ws`'s remembered check verdicts (scalelab.pipeline.check.STAMP), unless it has some, as a copy of the test
    run's: those of the micro profile, built by the first micro workspace to need them, which runs the check itself as
    a user's first command does (under a lock the xdist workers share; a check that fails leaves no seed). Other params
    find their optimizers' verdict there when their `optim` is the profile's; what else they hold is checked as usual.
    Without the variable (a benchmark run on its own) nothing is written."""
    stamp = ws / ".cache" / "scalelab" / "checked.json"
    if not (seed := os.environ.get(CHECKED_ENV)) or stamp.exists():
        return
    seed = Path(seed)
    if not seed.exists():
        if (ws / "params.yaml").read_bytes() != MICRO.read_bytes():
            return
        with open(seed.with_name(f"{seed.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not seed.exists():
                res = subprocess.run([sys.executable, "-m", "scalelab.pipeline.check"], cwd=ws, env=env,
                                     capture_output=True, text=True)
                if res.returncode != 0 or not stamp.is_file():
                    return  # the workspace's own commands will say what is wrong
                shutil.copyfile(stamp, seed.with_name(f".{seed.name}.tmp"))
                os.replace(seed.with_name(f".{seed.name}.tmp"), seed)
                return
    stamp.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(seed, stamp)


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
    from scalelab.config import profiles

    (ws / "params.yaml").write_text(profiles.complete_text(params))  # an overlay profile composed, as a switch writes it
    env = {**os.environ, "SCALELAB_ROOT": str(ws), "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ws / "src"), os.environ.get("PYTHONPATH")])),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID"):
        env.pop(var, None)
    # Objects stored uncompressed (zlib level 0; git reads them as any other): compressing the ~2,600 files (results/
    # ~49 MB) at git's default level was about a third of this function's CPU
    git = ["git", "-c", "core.compression=0"]
    for cmd in (["git", "init", "-q"], [*git, "add", "-A"],
                [*git, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=ws, env=env, check=True, capture_output=True)
    seed_mlflow_store(ws / "mlflow.db")  # after the commit: a user's store is no part of the repo (.gitignore)
    seed_check_verdicts(ws, env)  # likewise .cache/
    return env

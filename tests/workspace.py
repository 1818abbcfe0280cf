"""A copy of the project's code in a fresh git repo, for tests and benchmarks that run DVC stages (no side effects on
import, unlike conftest)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from fnmatch import fnmatch
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
        if not (ws / "params.yaml").is_file() or (ws / "params.yaml").read_bytes() != MICRO.read_bytes():
            return  # (a study's workspace, seeded before its study writes its params.yaml: only from a seed)
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


def workspace_env(ws: Path) -> dict[str, str]:
    """The environment `ws`'s stages run in: its own root and MLflow store, this venv first on PATH, and its src/ first
    on PYTHONPATH (stages import that copy's library, not the installed one)."""
    env = {**os.environ, "SCALELAB_ROOT": str(ws), "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ws / "src"), os.environ.get("PYTHONPATH")])),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID"):
        env.pop(var, None)
    return env


def workspace_copy(ws: Path, params: Path = MICRO, code: Path = ROOT) -> dict[str, str]:
    """The code of `code` as it is now (tracked or not, without the studies' cells) in a fresh git repo at `ws`, with `params`
    as params.yaml; returns the environment its stages run in: its own root and MLflow store, this venv first on
    PATH, and its src/ first on PYTHONPATH (stages import that copy's library, not the installed one)."""
    listed = subprocess.run(["git", "ls-files"], cwd=code, capture_output=True, text=True).stdout.split()
    # the committed studies' parts that no stage reads (.dvcignore's results/ lines: their cells, stores, diagnostics):
    # ~2,500 files that every git command and DVC experiment copy here would handle; their ledgers stay (the report's)
    unread = [line.strip() + "*" for line in (code / ".dvcignore").read_text().splitlines()
              if line.startswith("results/")]
    for rel in [*listed, "stages", "src", "corpus", "dvc.yaml", ".dvc/config", ".dvcignore"]:
        if rel.startswith(("metrics/", "plots/", "data/")) or rel == "dvc.lock" or any(fnmatch(rel, u) for u in unread):
            continue
        src = code / rel
        if src.is_dir():
            shutil.copytree(src, ws / rel, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ws / rel)
    from scalelab.config import profiles

    (ws / "params.yaml").write_text(profiles.complete_text(params))  # an overlay profile composed, as a switch writes it
    env = workspace_env(ws)
    # Objects stored uncompressed (zlib level 0; git reads them as any other): compressing them at git's default level
    # was about a third of this function's CPU
    git = ["git", "-c", "core.compression=0"]
    for cmd in (["git", "init", "-q"], [*git, "add", "-A"],
                [*git, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=ws, env=env, check=True, capture_output=True)
    seed_mlflow_store(ws / "mlflow.db")  # after the commit: a user's store is no part of the repo (.gitignore)
    seed_check_verdicts(ws, env)  # likewise .cache/
    return env


# ---------------------------------------------------------------- the micro DAG, built once per test run
# Building the whole micro DAG (every stage of dvc.yaml on the micro profile) is the suite's single biggest setup, and
# several files need it, or a part of it: test_pipeline, test_experiments, test_crash, test_study, test_runners. It is
# built once per test run by the first process to ask (under a lock the xdist workers share), and each test gets a
# copy of its own (`copy_workspace`): the builds they did before, each in their own workspace, were the same work.
BUILD_INFO = "build.json"
BUILD_FAILED = "failed.txt"
# Content-addressed stores: a file in them is never written again once there (git's objects, DVC's cache), so a copy
# may share them by hard links. Everything else is copied: stages rewrite their outs, MLflow its store.
SHARED_STORES = (".git/objects/", ".dvc/cache/")


class MicroBuild:
    """A finished build of the micro DAG: `ws` (never written after the build: copy it), `prefect_db` (the database
    of the Prefect server the flow ran on, every run of it there), and what the flow run said (`info`): each stage's
    status as the flow returned it, the flow run's id, its last log lines as Prefect's API served them, when each
    stage's task ran, and the stage graph."""

    def __init__(self, folder: Path):
        self.folder, self.ws, self.prefect_db = folder, folder / "ws", folder / "prefect" / "prefect.db"
        self.info = json.loads((folder / BUILD_INFO).read_text())

    @property
    def statuses(self) -> list[dict]:
        return self.info["statuses"]

    def needs(self, targets: list[str]) -> list[str]:
        """The stages `targets` select as `dvc repro <targets>` would (flows/dag.py: select): them, what they need."""
        chosen, todo = set(), list(targets)
        while todo:
            if (stage := todo.pop()) not in chosen:
                chosen.add(stage)
                todo += self.info["needs"][stage]
        return sorted(chosen)

    def metrics(self, stages: list[str]) -> list[str]:
        """The metrics files (metrics/**/*.json) among the outs of `stages`, each relative to the workspace."""
        outs = {o for s in stages for o in self.info["outs"][s]}
        return sorted(str(p.relative_to(self.ws)) for p in self.ws.glob("metrics/**/*.json")
                      if any(str(q) in outs for q in (p.relative_to(self.ws), *p.relative_to(self.ws).parents)))

    def seconds_until(self, stages: list[str]) -> float:
        """Seconds from the start of the build's flow process until the last of `stages` had finished."""
        return max(self.info["times"][s][1] for s in stages) - self.info["started"]


def build_micro(shared: Path, workers: int = 2) -> MicroBuild:
    """The micro DAG built once in `shared` (a folder every process of the test run sees) by the flow of
    flows/pipeline.py with `workers` cells at once, in a process of its own on the temporary Prefect server that
    process starts; the first caller (conftest: the `micro_build` fixture) builds it while the others wait on the
    lock. A failed build is not retried by the next caller, which raises with the same output."""
    folder = shared / "micro-build"
    with open(shared / "micro-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / BUILD_FAILED).exists():
            raise RuntimeError(f"the micro DAG's build failed (tried once per test run):\n"
                               f"{(folder / BUILD_FAILED).read_text()}")
        if not (folder / BUILD_INFO).exists():
            shutil.rmtree(folder, ignore_errors=True)
            env = workspace_copy(folder / "ws")
            env = {k: v for k, v in env.items() if not k.startswith("PREFECT_API")}
            env["PREFECT_HOME"] = str(seed_prefect_home(folder / "prefect"))
            res = subprocess.run([sys.executable, __file__, "build", str(folder), str(workers)], cwd=folder / "ws",
                                 env=env, capture_output=True, text=True)
            if res.returncode != 0 or not (folder / BUILD_INFO).exists():
                (folder / BUILD_FAILED).write_text(f"exit {res.returncode}\n{res.stdout[-4000:]}\n{res.stderr[-6000:]}")
                raise RuntimeError(f"the micro DAG's build failed:\n{(folder / BUILD_FAILED).read_text()}")
    return MicroBuild(folder)


def _build(folder: Path, workers: int) -> None:
    """The build itself, in its own process (build_micro): the flow as test_pipeline ran it, then what the tests
    read of its run from Prefect while its server runs (it stops with this process)."""
    import time

    started = time.time()
    import importlib.util

    import scalelab  # noqa: F401  first, as in flows/pipeline.py: the offline defaults before Prefect reads them

    spec = importlib.util.spec_from_file_location("scalelab_flow", ROOT / "flows" / "pipeline.py")
    flow = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flow)
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogHandler

    import tempserver  # flows/ (on sys.path once the flow is loaded)

    ws = folder / "ws"
    os.chdir(ws)
    tempserver.ensure()  # the temporary Prefect server as `python flows/pipeline.py` starts it (stops with this process)
    state = flow.pipeline(workers=workers, return_state=True)
    statuses = state.result()  # raises when the flow failed
    run_id = state.state_details.flow_run_id
    server_package = "prefect.server.api.server" in sys.modules  # what Prefect's own temporary server start imports
    APILogHandler().flush()  # the warm server's report reaches the Prefect API before it is read
    with get_client(sync_client=True) as prefect:
        logs = [log.message for log in prefect.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])),
                                                        limit=20, sort=LogSort.TIMESTAMP_DESC)]
        tasks, page = [], FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
        # in pages: the API serves at most 200 task runs a call, and a DAG may have more stages
        while batch := prefect.read_task_runs(flow_run_filter=page, limit=200, offset=len(tasks)):
            tasks += batch
    graph = flow.stage_graph(ws)
    info = {"statuses": statuses, "flow_run_id": str(run_id), "logs": logs, "started": started,
            "prefect_server_package": server_package,
            "times": {t.name: [t.start_time.timestamp(), t.end_time.timestamp()] for t in tasks
                      if t.start_time and t.end_time},
            "needs": {s: sorted(graph.successors(s)) for s in graph},
            "outs": {s: sorted(str(Path(o).relative_to(ws)) for o in graph.nodes[s]["outs"]) for s in graph}}
    (folder / f".{BUILD_INFO}.tmp").write_text(json.dumps(info))
    os.replace(folder / f".{BUILD_INFO}.tmp", folder / BUILD_INFO)


def copy_workspace(src: Path, dest: Path) -> dict[str, str]:
    """A copy of the built workspace `src` at `dest` that a test may change as it likes (its content-addressed stores
    shared by hard links, ~1 s where rebuilding took minutes); returns its environment, as workspace_copy's. Its MLflow
    store's absolute paths (artifact folders) point into the copy: a stage run there must not write into `src`."""

    def copy(s: str, d: str) -> None:
        if Path(s).relative_to(src).as_posix().startswith(SHARED_STORES):
            os.link(s, d)
        else:
            shutil.copy2(s, d)

    shutil.copytree(src, dest, symlinks=True, copy_function=copy)
    if (db := dest / "mlflow.db").exists():
        with contextlib.closing(sqlite3.connect(db)) as con, con:
            for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                for col in con.execute(f"PRAGMA table_info('{table}')").fetchall():
                    if col[2].upper().startswith(("TEXT", "VARCHAR", "STRING")):
                        con.execute(f'UPDATE "{table}" SET "{col[1]}" = replace("{col[1]}", ?, ?) '
                                    f'WHERE instr("{col[1]}", ?) > 0', (str(src), str(dest), str(src)))
    return workspace_env(dest)


if __name__ == "__main__" and sys.argv[1:2] == ["build"]:
    _build(Path(sys.argv[2]), int(sys.argv[3]))

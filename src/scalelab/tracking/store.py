"""The MLflow store: where it is, how to reach it, and the keys that identify runs (git commit, params, deps).

HTTP servers: importing this module sets (setdefault: the user's values win) MLFLOW_HTTP_REQUEST_MAX_RETRIES=2 and
MLFLOW_HTTP_REQUEST_TIMEOUT=20, since MLflow's defaults (7 retries with exponential backoff, 120 s timeout) hang a
stage for minutes per call once the server is gone; and every contact starts with a 3 s probe of the server's
/health, so an unreachable server costs a stage seconds, once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from mlflow import MlflowClient

from scalelab import experiment_tags, project_root, store_root
from scalelab.tracking import dashboard, orphans

os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")

PARENT_ENV = "SCALELAB_PARENT_RUN_ID"  # set by the Prefect flow
FLOW_RUN_ENV = "SCALELAB_PREFECT_FLOW_RUN_ID"  # set by the Prefect flow
RUN_ENV = "SCALELAB_RUN_ID"  # set by rank 0, inherited by the DDP ranks Lightning re-launches
BIG_FILE = 64 * 2**20  # deps above this are hashed by size + mtime
MAX_KEY, MAX_PARAM, MAX_TAG = 250, 6000, 8000  # MLflow's length limits


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store_root() / 'mlflow.db'}"


def public_uri() -> str:
    """The tracking URI without its password: safe in outs and links."""
    parts = urllib.parse.urlsplit(tracking_uri())
    if parts.password is None:
        return tracking_uri()
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", "@")).geturl()


def run_url(experiment_id: str, run_id: str) -> str | None:
    """A link into the MLflow UI for http(s) servers; None for local stores (open them with `mlflow ui`)."""
    uri = public_uri()
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}" if uri.startswith("http") else None


@lru_cache
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project_root(), capture_output=True, text=True)
    except OSError:
        return "nogit"
    return out.stdout.strip() if out.returncode == 0 else "nogit"


def pipeline_key() -> str:
    """Identifies one plain `dvc repro`: git commit + sha256 of params.yaml."""
    params = project_root() / "params.yaml"
    params_hash = hashlib.sha256(params.read_bytes() if params.is_file() else b"").hexdigest()
    return hashlib.sha256(f"{git_commit()}:{params_hash}".encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    st = path.stat()
    if st.st_size > BIG_FILE:  # re-reading GB token shards at every stage start costs minutes; DVC hashes them anyway
        return f"size={st.st_size},mtime_ns={st.st_mtime_ns}"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def deps_hash(params: Mapping[str, Any], deps: Sequence[str | os.PathLike] = ()) -> str:
    """sha256 over the params' JSON and each dep's content (a folder: its files, walked in sorted order)."""
    h = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode())
    for dep in sorted(map(Path, deps)):
        for f in sorted(p for p in dep.rglob("*") if p.is_file()) if dep.is_dir() else [dep]:
            h.update(f"{f.as_posix()}:{_file_digest(f) if f.is_file() else 'missing'}\n".encode())
    return h.hexdigest()


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay single values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _number(value: Any) -> float | None:
    try:
        return float(value)  # python, numpy and 0-d torch numbers
    except (TypeError, ValueError):
        return None


def _create_sqlite_store(db: Path) -> None:
    """A new sqlite store, whole or not at all. MLflow builds one by running its migrations (seconds of DDL); a process
    killed meanwhile left a half-migrated file that no later process could open ("table experiment_tags already
    exists", found by tests/test_crash.py), so tracking stayed off for the project. Built aside and hard-linked into
    place: the link fails when another process got there first, and its store wins."""
    tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
    try:
        MlflowClient(f"sqlite:///{tmp}")  # the client runs the migrations on construction
        with contextlib.suppress(FileExistsError):
            os.link(tmp, db)
    finally:
        tmp.unlink(missing_ok=True)


def _connect(experiment: str) -> tuple[MlflowClient, str]:
    """Probe the store (fails fast) and get or create the experiment; raises on any tracking problem."""
    uri, artifacts = tracking_uri(), None
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=3).close()
        except urllib.error.HTTPError:
            pass  # it answered (e.g. an auth proxy): reachable
    elif uri.startswith("sqlite:///"):  # artifacts beside the db, not in whatever the cwd is
        db = Path(uri.removeprefix("sqlite:///")).resolve()
        db.parent.mkdir(parents=True, exist_ok=True)
        if not db.exists():
            _create_sqlite_store(db)
        artifacts = (db.parent / "mlartifacts").as_uri()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return client, client.create_experiment(experiment, artifact_location=artifacts, tags=dashboard.EXPERIMENT_TAGS)
    dashboard.ensure_experiment(client, exp.experiment_id, exp.tags)  # kind, primary metric, saved view
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    try:  # runs left RUNNING by a kill or an outage get their status; best effort, never in the way
        orphans.sweep(client, exp.experiment_id, uri)
    except Exception as err:
        warnings.warn(f"could not close MLflow runs left RUNNING ({type(err).__name__}: {err})", RuntimeWarning)
    return client, exp.experiment_id


def _repro_parent(client: MlflowClient, experiment_id: str, create: bool) -> str | None:
    """The parent run of this plain `dvc repro` (same pipeline key, not failed), created when asked."""
    key = pipeline_key()
    query = f"tags.`scalelab.pipeline_key` = '{key}'"
    for run in client.search_runs([experiment_id], query, max_results=20, order_by=["attributes.start_time DESC"]):
        if run.info.status in ("RUNNING", "FINISHED"):
            return run.info.run_id
    if not create:
        return None
    tags = {"scalelab.pipeline_key": key, "git.commit": git_commit(), **dashboard.source_tags("dvc.yaml"),
            **experiment_tags(),
            orphans.OWNER_TAG: orphans.owner()}  # owned from its first write: never RUNNING without an owner
    return client.create_run(experiment_id, run_name=f"dvc repro {git_commit()[:8]}", tags=tags).info.run_id

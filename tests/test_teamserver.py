"""The team MLflow server for real: Debian's PostgreSQL and `mlflow server --serve-artifacts` on
127.0.0.1 (scalelab.tracking.teamserver), and the Prefect flow at 2 workers logging to it: the same invariants as with sqlite
(one parent, one FINISHED child per cell, a logged model per cell), the runs are rows in PostgreSQL, and artifacts go
through the server. Without PostgreSQL this skips on a developer's machine and fails under CI (CI=true, .ci/run)."""

import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
from conftest import ROOT, marked_processes
from mlflow import MlflowClient
from mutants import mutant, mutation_checks
from workspace import workspace_copy

from scalelab.tracking import teamserver
from scalelab.tracking import dashboard
from scalelab.runtime import yamlio

pytestmark = pytest.mark.slow
CELLS = ["pretrain@none-a-0", "pretrain@standard-a-0"]  # two cells at once: concurrent writers to the server
spec = importlib.util.spec_from_file_location("scalelab_flow", ROOT / "flows" / "pipeline.py")
flow_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(flow_mod)


def _need_postgres() -> None:
    try:
        teamserver.pg_bin("initdb")
    except teamserver.TeamServerError as err:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI: {err}; the team-server test cannot be skipped in CI", pytrace=False)
        pytest.skip(str(err))


@pytest.fixture
def server():
    """A throwaway team server. As root PostgreSQL runs as `postgres`, which must reach its folder: a private one
    under the system temp dir, not pytest's (its parents are 0700)."""
    _need_postgres()
    folder = Path(tempfile.mkdtemp(prefix="scalelab-team-"))
    folder.chmod(0o755)
    try:
        with teamserver.team_server(folder, durable=False) as running:
            yield running
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_flow_at_two_workers_logs_to_postgres_through_the_server(server, prefect_harness, tmp_path, monkeypatch):
    # no MLflow job consumers (scalelab submits no MLflow jobs; idle, their 7 Huey processes kept 1.1 cores busy)
    assert not [cmd for cmd in marked_processes().values() if "huey_consumer" in cmd]
    ws = tmp_path / "ws"
    env = workspace_copy(ws)
    for key in ("SCALELAB_ROOT", "PYTHONPATH"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.tracking_uri)
    for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(ws)
    state = flow_mod.pipeline(targets=CELLS, workers=2, return_state=True)
    statuses = {r["stage"]: r["status"] for r in state.result()}
    assert set(CELLS) <= set(statuses) and set(statuses.values()) == {"ran"}

    client = MlflowClient(server.tracking_uri)
    exp = client.get_experiment_by_name(yamlio.safe_load((ws / "params.yaml").read_text())["tracking"]["experiment"])
    found = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{state.state_details.flow_run_id}'")
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    children = [r.data.tags["dvc.stage"] for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(set(children)) and set(CELLS) <= set(children) <= set(statuses)
    assert all(r.info.status == "FINISHED" for r in found)
    for cell in ("none-a-base-0", "standard-a-base-0"):  # logged models through the server's REST API
        assert dashboard.find_model(client, exp.experiment_id, ws / f"data/pretrain/{cell}/model/hf")

    # the store is PostgreSQL: the runs the server lists are its rows
    import psycopg2

    with psycopg2.connect(server.backend_uri.replace("+psycopg2", "")) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs WHERE experiment_id = %s", (int(exp.experiment_id),))
        assert cur.fetchone()[0] == len(client.search_runs([exp.experiment_id]))

    # artifacts are proxied: the run's root is an mlflow-artifacts: URI, stored by the server, read back through it
    note = tmp_path / "note.md"
    note.write_text("through the server\n")
    client.log_artifact(parent.info.run_id, str(note), "checks")
    assert client.get_run(parent.info.run_id).info.artifact_uri.startswith("mlflow-artifacts:")
    assert [p.read_text() for p in server.artifacts.rglob("note.md")] == ["through the server\n"]
    got = mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="checks/note.md",
                                              dst_path=str(tmp_path / "got"), tracking_uri=server.tracking_uri)
    assert Path(got).read_text() == "through the server\n"


def test_a_missing_postgres_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(teamserver.shutil, "which", lambda name: None)
    monkeypatch.setattr(teamserver, "Path", lambda p: tmp_path / "nothing-here")  # no Debian folder either
    with pytest.raises(teamserver.TeamServerError, match="initdb not found"):
        teamserver.pg_bin("initdb")


@mutant("team-no-serve-artifacts")
def _(monkeypatch):  # the server not proxying artifacts (MLflow's default is to serve them): clients write to a path
    real = subprocess.Popen

    def popen(cmd, *args, **kwargs):
        if "--serve-artifacts" in cmd:
            i = cmd.index("--artifacts-destination")
            cmd = [c for c in cmd[:i] + cmd[i + 2:] if c != "--serve-artifacts"] + ["--no-serve-artifacts"]
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(teamserver, "subprocess", SimpleNamespace(**{**vars(subprocess), "Popen": popen}))


@mutant("team-sqlite-backend")
def _(monkeypatch):  # the server on a sqlite file, PostgreSQL started but unused
    real = teamserver.postgres

    def postgres(folder, *args, **kwargs):
        with real(folder, *args, **kwargs):
            yield f"sqlite:///{folder / 'mlflow.db'}"

    monkeypatch.setattr(teamserver, "postgres", teamserver.contextlib.contextmanager(postgres))


TARGET = "tests/test_teamserver.py::test_the_flow_at_two_workers_logs_to_postgres_through_the_server"
test_mutants_are_caught = mutation_checks([("team-no-serve-artifacts", TARGET), ("team-sqlite-backend", TARGET)])

"""The pipeline flow's cluster task runners (issue 6): a micro-profile grid of two pretrain cells on a Dask LocalCluster
of 2 workers and a local Ray instance (2 CPUs; the local thread runner: test_pipeline, on the whole DAG), with the
invariants of a concurrent run: both cells ran at once, DVC's status is clean and dvc.lock holds them, neither a second
flow run nor a plain `dvc repro` reruns anything, and the MLflow parent run has exactly one child per cell."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterFlowRunId
from workspace import workspace_copy

pytestmark = pytest.mark.slow
spec = importlib.util.spec_from_file_location("scalelab_flow", ROOT / "flows" / "pipeline.py")
flow_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(flow_mod)
DVC = [sys.executable, "-m", "dvc"]
CELLS = ["pretrain@none-a-0", "pretrain@standard-a-0"]


def _run(cmd, cwd, env):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.fixture(scope="module")
def data_workspace(tmp_path_factory):
    """The code as it is now with the micro profile, its data stages built by a plain `dvc repro`."""
    ws = tmp_path_factory.mktemp("runners") / "ws"
    _run(DVC + ["repro", "tokenize"], ws, workspace_copy(ws))
    return ws


@pytest.mark.parametrize("kind", ["dask", "ray"])  # the local thread runner: test_pipeline, on the whole DAG
def test_micro_grid_on_each_runner(kind, data_workspace, tmp_path, prefect_harness, monkeypatch):
    ws = tmp_path / "ws"
    shutil.copytree(data_workspace, ws, symlinks=True)
    for key, value in {"SCALELAB_ROOT": str(ws), "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}",
                       "PYTHONPATH": str(ws / "src"), "PREFECT_API_URL": os.environ.get("PREFECT_API_URL", "")}.items():
        monkeypatch.setenv(key, value)  # restored after the test: the runner exports the API URL to its workers
    for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(ws)

    runner = flow_mod.runners.task_runner(kind, workers=2)
    state = flow_mod.pipeline.with_options(task_runner=runner)(targets=CELLS, workers=2, return_state=True)
    statuses = {r["stage"]: r["status"] for r in state.result()}
    assert {s: statuses[s] for s in CELLS} == dict.fromkeys(CELLS, "ran")
    assert set(statuses.values()) == {"ran", "up to date"}  # the data stages were built before

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(yaml.safe_load((ws / "params.yaml").read_text())["tracking"]["experiment"])
    found = client.search_runs([exp.experiment_id],
                               f"tags.`prefect.flow_run_id` = '{state.state_details.flow_run_id}'")
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(c.data.tags["dvc.stage"] for c in children) == CELLS  # exactly one child per cell
    assert all(c.info.status == "FINISHED" for c in children)
    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as prefect:
        in_run = TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]))
        tasks = prefect.read_task_runs(task_run_filter=in_run)
    (a0, a1), (b0, b1) = sorted((t.start_time, t.end_time) for t in tasks if t.name in CELLS)
    assert b0 < a1  # the two cells' tasks ran at the same time, each on its own worker

    assert set(CELLS) <= set(yaml.safe_load((ws / "dvc.lock").read_text())["stages"])
    assert "up to date" in _run(DVC + ["status", *CELLS], ws, os.environ)
    again = flow_mod.pipeline(targets=CELLS, workers=2)  # the default (thread) runner suffices to check the state
    assert {r["status"] for r in again} == {"up to date"}
    assert "Running stage" not in _run(DVC + ["repro", *CELLS], ws, os.environ)

"""The pipeline flow's cluster task runners: a micro-profile grid of two pretrain cells on a Dask LocalCluster
of 2 workers and a local Ray instance (2 CPUs; the local thread runner: test_pipeline, on the whole DAG), with the
invariants of a concurrent run: both cells ran at once, DVC's status is clean and dvc.lock holds them, neither a second
flow run nor a plain `dvc repro` reruns anything, and the MLflow parent run has exactly one child per cell."""

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from mutants import assert_caught, mutant
from mlflow import MlflowClient
from workspace import copy_workspace

from scalelab.runtime import yamlio

pytestmark = pytest.mark.slow
spec = importlib.util.spec_from_file_location("scalelab_flow", ROOT / "flows" / "pipeline.py")
flow_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(flow_mod)
DVC = [sys.executable, "-m", "dvc"]
CELLS = ["pretrain@none-a-0", "pretrain@standard-a-0"]
# A rendezvous put in the workspace copy's stage script: each cell marks that it runs and waits until the other does
# (both on their workers at once), or gives up and leaves a `.timeout` mark for the test to find.
BARRIER = """
import os as _os, time as _time
if _barrier := _os.environ.get("TEST_BARRIER"):
    Path(_barrier, _os.environ["DVC_STAGE"]).touch()
    _deadline = _time.monotonic() + 120
    while len([p for p in Path(_barrier).iterdir() if p.suffix != ".timeout"]) < 2:
        if _time.monotonic() > _deadline:
            Path(_barrier, _os.environ["DVC_STAGE"] + ".timeout").touch()
            sys.exit("the other cell never ran while this one did")
        _time.sleep(0.05)

"""


def _run(cmd, cwd, env):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.mark.parametrize("kind", ["dask", "ray"])  # the local thread runner: test_pipeline, on the whole DAG
def test_micro_grid_on_each_runner(kind, micro_build, tmp_path, prefect_harness, monkeypatch):
    # the micro DAG as built once per test run (conftest's micro_build), in a copy of this test's own: its data stages
    # are up to date, and the barrier below edits the stage script every pretrain cell depends on, so the cells rerun
    ws = tmp_path / "ws"
    copy_workspace(micro_build.ws, ws)
    script = ws / "stages" / "pretrain.py"
    main = '\nif __name__ == "__main__":'
    script.write_text(script.read_text().replace(main, BARRIER + main))
    (barrier := tmp_path / "barrier").mkdir()
    monkeypatch.setenv("TEST_BARRIER", str(barrier))  # the cluster's workers start from this environment
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
    exp = client.get_experiment_by_name(yamlio.safe_load((ws / "params.yaml").read_text())["tracking"]["experiment"])
    found = client.search_runs([exp.experiment_id],
                               f"tags.`prefect.flow_run_id` = '{state.state_details.flow_run_id}'")
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(c.data.tags["dvc.stage"] for c in children) == CELLS  # exactly one child per cell
    assert all(c.info.status == "FINISHED" for c in children)
    # the two cells ran at the same time, each on its own worker: each went on only once the other ran
    assert sorted(p.name for p in barrier.iterdir()) == CELLS
    # their stage scripts started warm, forked by the flow's server at their workers' request (the cluster is this
    # machine's: runners.on_this_machine), as on the thread runner; its report is among the flow run's last log lines
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    with get_client(sync_client=True) as prefect:
        logs = [log.message for log in prefect.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id])), limit=50,
            sort=LogSort.TIMESTAMP_DESC)]
    assert any(f"served {len(CELLS)} stage(s)" in m for m in logs), logs

    assert set(CELLS) <= set(yamlio.safe_load((ws / "dvc.lock").read_text())["stages"])
    assert "up to date" in _run(DVC + ["status", *CELLS], ws, os.environ)
    again = flow_mod.pipeline(targets=CELLS, workers=2)  # the default (thread) runner suffices to check the state
    assert {r["status"] for r in again} == {"up to date"}
    assert "Running stage" not in _run(DVC + ["repro", *CELLS], ws, os.environ)


@mutant("runner-one-worker")
def _(monkeypatch):  # a cluster of one worker: the cells run one after the other
    real = flow_mod.runners.task_runner
    monkeypatch.setattr(flow_mod.runners, "task_runner", lambda kind, workers=None, address=None:
                        real(kind, 1, address))


@pytest.mark.mutation
def test_the_grid_test_catches_cells_run_one_at_a_time():
    assert_caught("tests/test_runners.py::test_micro_grid_on_each_runner[dask]", "runner-one-worker")


def test_only_a_cluster_the_runner_starts_here_is_served_warm(monkeypatch):
    """The flow's warm server serves the thread pool and a Dask LocalCluster or local Ray instance the runner starts
    (their workers are this machine's processes); not a cluster at an address, nor SLURM's jobs: their workers are
    elsewhere, where the server's socket is not."""
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner
    from prefect_ray import RayTaskRunner

    on_here = flow_mod.runners.on_this_machine
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert on_here(ThreadPoolTaskRunner(max_workers=2))
    assert on_here(DaskTaskRunner(cluster_class="distributed.LocalCluster")) and on_here(DaskTaskRunner())
    assert not on_here(DaskTaskRunner(address="tcp://scheduler:8786"))
    assert not on_here(DaskTaskRunner(cluster_class="dask_jobqueue.SLURMCluster"))
    assert on_here(RayTaskRunner()) and not on_here(RayTaskRunner(address="ray://head:10001"))
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")  # where ray.init() connects without an address
    assert not on_here(RayTaskRunner())


def test_a_cluster_runner_without_its_extra_is_refused_in_one_line_before_any_flow(monkeypatch, capsys):
    """`make setup` installs the pipeline alone: `--runner ray` or `dask` without the `cluster` extra stops at the
    argument check, naming the missing modules and the install, instead of a traceback from inside the flow."""
    runners = flow_mod.runners
    monkeypatch.setitem(runners.EXTRA, "ray", ("prefect_ray", "scalelab_no_such_module"))
    monkeypatch.setattr(flow_mod, "pipeline", None)  # reaching the flow would fail differently
    with pytest.raises(SystemExit) as exit_:
        flow_mod.main(["--runner", "ray"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and err.endswith(
        "--runner ray needs scalelab_no_such_module: pip install -e '.[cluster]' (or make test, which installs it)")
    assert runners.missing_extra("dask") is None and runners.missing_extra("threads") is None  # installed here

"""flows/pipeline.py on a tiny DVC project: a -> b -> c (matrix over x, y), stages tracked with stage_run."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import FAST_TMP
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.testing.utilities import prefect_test_harness

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("scalelab_flow", ROOT / "flows" / "pipeline.py")
flow_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(flow_mod)

STAGE = """\
import os, sys, time
from pathlib import Path
import yaml
from scalelab import tracking

name, dep, out = sys.argv[1:]
params = yaml.safe_load(open("params.yaml"))
if params.get("fail") == os.environ["DVC_STAGE"]:
    sys.exit("failing on purpose")
with tracking.stage_run(os.environ["DVC_STAGE"], params=params, deps=[dep] if dep != "-" else []) as run:
    text = (Path(dep).read_text() if dep != "-" else "") + f"{name}={params['value'][name]};"
    Path(out).write_text(text)
    run.record(Path(out).stem + "_run")
with open("order.log", "a") as f:
    f.write(f"{os.environ['DVC_STAGE']} {time.time()}\\n")
"""

DVC_YAML = """\
stages:
  a:
    cmd: python stage.py a - a.txt
    deps: [stage.py]
    params: [value.a]
    outs: [a.txt, a_run]
  b:
    cmd: python stage.py b a.txt b.txt
    deps: [a.txt]
    params: [value.b, fail]
    outs: [b.txt, b_run]
  c:
    matrix:
      name: [x, y]
    cmd: python stage.py ${item.name} b.txt c_${item.name}.txt
    deps: [b.txt]
    params:
      - value.${item.name}
    outs:
      - c_${item.name}.txt
      - c_${item.name}_run
"""


def write_params(root: Path, x: int = 1, y: int = 1, fail: str = "none") -> None:
    (root / "params.yaml").write_text(f"value: {{a: 1, b: 1, x: {x}, y: {y}}}\nfail: {fail}\n")


@pytest.fixture(scope="session")
def harness():
    with prefect_test_harness():
        yield


@pytest.fixture(scope="module")
def project(tmp_path_factory, harness):
    """The tiny project, after a first flow run; yields (root, results, flow run id)."""
    root = tmp_path_factory.mktemp("proj")
    sh = lambda *cmd: subprocess.run(cmd, cwd=root, check=True, capture_output=True)  # noqa: E731
    sh("git", "init", "-q")
    sh(sys.executable, "-m", "dvc", "init", "-q")
    sh(sys.executable, "-m", "dvc", "config", "core.check_update", "false")
    sh(sys.executable, "-m", "dvc", "config", "core.analytics", "false")
    (root / "stage.py").write_text(STAGE)
    (root / "dvc.yaml").write_text(DVC_YAML)
    write_params(root)
    # MLflow creates its schema with dozens of fsyncs: on tmpfs the store is ready several times faster
    fast_dir = Path(tempfile.mkdtemp(dir=FAST_TMP))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("SCALELAB_ROOT", str(root))
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{fast_dir / 'mlflow.db'}")
        for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID"):
            mp.delenv(var, raising=False)
        state = flow_mod.pipeline(return_state=True)
        yield root, state.result(), str(state.state_details.flow_run_id)
    shutil.rmtree(fast_dir)


def pipeline_artifact(flow_run_id: str):
    with get_client(sync_client=True) as client:
        flt = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        (artifact,) = [a for a in client.read_artifacts(artifact_filter=flt) if a.key == "scalelab-pipeline"]
    return artifact


def order(root: Path) -> list[str]:
    return [line.split()[0] for line in (root / "order.log").read_text().splitlines()]


def test_first_run_builds_everything_in_dependency_order(project):
    root, results, _ = project
    assert [r["status"] for r in results] == ["ran"] * 4
    assert order(root) == ["a", "b", "c@x", "c@y"]
    assert (root / "c_x.txt").read_text() == "a=1;b=1;x=1;" and (root / "c_y.txt").exists()


def test_mlflow_parent_has_one_child_per_stage(project):
    root, _, flow_run_id = project
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("scalelab")
    runs = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1
    assert sorted(c.data.tags["dvc.stage"] for c in children) == ["a", "b", "c@x", "c@y"]
    assert all(c.data.tags["prefect.flow_run_id"] == flow_run_id and c.info.status == "FINISHED" for c in children)
    assert parent.info.status == "FINISHED"


def test_markdown_artifact_links_the_runs(project):
    root, _, flow_run_id = project
    artifact = pipeline_artifact(flow_run_id)
    assert artifact.type == "markdown"
    run_id = json.loads((root / "c_y_run" / "mlflow_run.json").read_text())["run_id"]
    assert "| `c@y` | ran |" in artifact.data and run_id in artifact.data


def test_second_run_reruns_nothing(project):
    root, _, _ = project
    before = {p: p.stat().st_mtime_ns for p in root.glob("*.txt")}
    results = flow_mod.pipeline()
    assert [r["status"] for r in results] == ["up to date"] * 4
    assert {p: p.stat().st_mtime_ns for p in root.glob("*.txt")} == before


def test_selecting_one_matrix_cell_runs_only_it(project):
    root, _, _ = project
    write_params(root, x=2, y=2)  # both cells are now stale
    results = flow_mod.pipeline(targets=["c@x"])
    assert {r["stage"]: r["status"] for r in results} == {"a": "up to date", "b": "up to date", "c@x": "ran"}
    assert (root / "c_x.txt").read_text().endswith("x=2;") and (root / "c_y.txt").read_text().endswith("y=1;")
    assert order(root)[-1] == "c@x"


def test_selection_rules(project):
    root, _, _ = project
    graph = flow_mod.stage_graph(root)
    assert flow_mod.select(graph, ["c"]) == ["a", "b", "c@x", "c@y"]
    assert flow_mod.select(graph, ["b"], downstream=True) == ["b", "c@x", "c@y"]
    with pytest.raises(ValueError, match="unknown stage 'nope'"):
        flow_mod.select(graph, ["nope"])


def test_a_failed_stage_stops_what_depends_on_it(project, monkeypatch):
    root, _, _ = project
    monkeypatch.setattr(flow_mod, "DEFAULT_RETRIES", 0)
    write_params(root, fail="b")
    state = flow_mod.pipeline(return_state=True)
    assert state.is_failed()
    artifact = pipeline_artifact(str(state.state_details.flow_run_id))
    assert "| `b` | failed |" in artifact.data and "| `c@y` | not run |" in artifact.data
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("scalelab")
    runs = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{state.state_details.flow_run_id}'")
    assert [r.info.status for r in runs] == ["FAILED"]  # the flow's parent run; b failed before opening a child

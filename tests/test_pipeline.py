"""The whole DAG on the micro profile in a temporary git repo, built by the main command (the Prefect flow, 2 cells at
once, stages started warm): every stage ran once and learned, DVC's state is complete (`dvc status` clean, a plain
`dvc repro` reruns nothing), MLflow holds one child run per stage under the flow's parent, and changing one variant's
params reruns only its cells (the invariants of a concurrent run, on the real stages). The DAG is built once per test
run (conftest's micro_build, which other files share); this module reads and changes a copy of its own."""

import importlib.util
import json
import math
import os
import subprocess
import sys
import time

import networkx as nx
import pytest
import yaml
from conftest import ROOT
from mlflow import MlflowClient
from mutants import assert_caught, mutant
from workspace import copy_workspace

from scalelab.runtime import yamlio

pytestmark = pytest.mark.slow
DVC = [sys.executable, "-m", "dvc"]
spec = importlib.util.spec_from_file_location("scalelab_flow", ROOT / "flows" / "pipeline.py")
flow_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(flow_mod)


def _run(cmd, cwd, env):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory, micro_build):
    """The micro workspace after one flow run with 2 workers (conftest's micro_build: built once per test run), as this
    module's own copy: (the build, the copy, its env)."""
    ws = tmp_path_factory.mktemp("pipeline") / "ws"
    return micro_build, ws, copy_workspace(micro_build.ws, ws)


def test_the_flow_builds_every_stage_once_then_nothing(built):
    build, ws, env = built
    statuses = {r["stage"]: r["status"] for r in build.statuses}
    stages = set(yamlio.safe_load((ws / "dvc.lock").read_text())["stages"])
    assert {"prepare", "tokenizer", "tokenize", "scaling", "pretrain@unified-c-0", "pretrain_recipe@muon-standard-a-0",
            "optimizers@muon-a", "leaderboard", "compress@0", "hidden_decoding@n2-0",
            "evaluate@unified-c-0", "report"} <= stages
    assert set(statuses) == stages and set(statuses.values()) == {"ran"}  # every stage, each once, in dvc.lock
    # the cells learned: validation loss clearly below a uniform guess, ln(vocab)
    cell = json.loads((ws / "metrics/pretrain/standard-c-base-0.json").read_text())
    assert cell["val_loss"] < math.log(384) - 0.5
    assert set(json.loads((ws / "metrics/scaling.json").read_text())["fits"]) == {"none", "standard", "unified"}
    report = (ws / "data/report/report.md").read_text()  # the ledger gathers every method's claims
    assert "## This run's claims ledger" in report
    assert all(f"This run: metrics/claims_{key}.json. Rule:" in report for key in "abcd"), report

    # MLflow: the flow's parent run has exactly one finished child per stage that tracks a run
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(yamlio.safe_load((ws / "params.yaml").read_text())["tracking"]["experiment"])
    found = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{build.info['flow_run_id']}'")
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    children = [r.data.tags["dvc.stage"] for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(set(children)) and {s for s in stages if "@" in s} <= set(children)
    assert all(r.info.status == "FINISHED" for r in found)
    logs = build.info["logs"]  # the flow run's last log lines, as the Prefect API served them after the run
    # every stage script's process started warm (the params check `python -m scalelab.pipeline.check` starts cold)
    assert any(f"served {len(stages) - 1} stage(s)" in m for m in logs)
    # its temporary Prefect server started without Prefect's server package in the flow's process (flows/tempserver.py)
    assert build.info["prefect_server_package"] is False

    assert "up to date" in _run(DVC + ["status"], ws, env)
    assert "Running stage" not in _run(DVC + ["repro"], ws, env)  # a plain `dvc repro` agrees: nothing to do


def test_the_dashboards_show_this_flow_run_its_cells_and_the_columns_researchers_compare(built, tmp_path):
    """`make ui`'s two servers over this module's real flow run (every stage of dvc.yaml on the micro profile): the
    MLflow parent run with its pretrain cells and the saved view's columns (variant, size, seed, validation loss),
    their validation-loss curves, and the Prefect flow run with its task graph and artifacts and the nightly
    deployment, each seen in headless Chromium (REST checks through both servers' APIs). These are the README's
    screenshots (SCALELAB_DOCS_SCREENSHOTS=1 copies them to docs/img/)."""
    import sqlite3

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
    from test_ui import SHOTS, _browser, _docs_screenshot, _free_ports, _json, _wait_text

    from scalelab.tracking import dashboard, ui

    build, ws, env = built
    browser = _browser()
    home = tmp_path / "prefect"
    home.mkdir()
    with sqlite3.connect(build.prefect_db) as src, sqlite3.connect(home / "prefect.db") as dst:
        src.backup(dst)  # the database of the Prefect server the build's flow ran on
    servers_env = {"MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"], "PREFECT_HOME": str(home)}
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with ui.servers(*_free_ports(2), env=servers_env, log_dir=tmp_path, timeout=240) as urls:
            api = f"{urls['mlflow']}/api/2.0/mlflow"
            exp = _json(f"{api}/experiments/get-by-name?experiment_name=scalelab-test")["experiment"]
            runs = _json(f"{api}/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 500})["runs"]
            tags = {t["key"]: t["value"] for t in exp["tags"]}
            assert tags["mlflow.experimentKind"] == "custom_model_development"  # opens on the training runs
            (parent,) = [r for r in runs if r["info"]["run_name"].startswith("pipeline ")]
            children = [r for r in runs if {"key": "mlflow.parentRunId", "value": parent["info"]["run_id"]}
                        in r["data"]["tags"]]
            cells = {r["stage"] for r in build.statuses if r["stage"].startswith(("pretrain@", "evaluate@"))}
            assert cells and cells <= {r["info"]["run_name"] for r in children}  # a child run per cell
            cell = next(r for r in children if r["info"]["run_name"] == "pretrain@unified-c-0")
            assert {"key": "mlflow.source.name", "value": "stages/pretrain.py"} in cell["data"]["tags"]
            browser.set_window_size(1920, 1000)
            browser.get(dashboard.view_url(urls["mlflow"], exp["experiment_id"]))
            _wait_text(browser, "Training runs", parent["info"]["run_name"])
            search = browser.find_element(By.CSS_SELECTOR, "input[placeholder*='metrics.rmse']")
            search.send_keys("attributes.run_name LIKE 'pretrain@%'" + Keys.ENTER)  # the training cells
            for label in ("Close", "Toggle sidebar"):  # the assistant panel and the sidebar would cover the columns
                for button in browser.find_elements(By.XPATH, f"//button[@aria-label='{label}']"):
                    button.click()
            browser.find_element(By.CSS_SELECTOR, "[col-id='attributes.`Run Name`'] button").click()  # expand
            _wait_text(browser, "cell.variant", "cell.size", "cell.seed", "val/loss", "unified-c-base-0")
            browser.save_screenshot(str(SHOTS / "pipeline_mlflow_runs.png"))
            _docs_screenshot("pipeline_mlflow_runs.png", "mlflow.png")
            # the same cells' validation loss, one curve each (the chart view, its charts narrowed to val/loss)
            browser.execute_script("arguments[0].click()",
                                   browser.find_element(By.XPATH, "//input[@type='radio' and @value='CHART']"))
            browser.find_element(By.CSS_SELECTOR, "input[placeholder='Search metric charts']").send_keys("val/loss")
            WebDriverWait(browser, 90).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".js-plotly-plot svg.main-svg"))
            _wait_text(browser, "(val/loss)")  # a legend entry: a curve of the cells drawn
            browser.save_screenshot(str(SHOTS / "pipeline_mlflow_chart.png"))
            _docs_screenshot("pipeline_mlflow_chart.png", "mlflow-chart.png")

            papi = f"{urls['prefect']}/api"
            flow_run = _json(f"{papi}/flow_runs/{build.info['flow_run_id']}")
            assert flow_run["state_type"] == "COMPLETED"
            tasks = _json(f"{papi}/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}},
                                                       "limit": 200})
            assert {r["stage"] for r in build.statuses} <= {t["name"] for t in tasks}  # a task per stage cell
            artifacts = _json(f"{papi}/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}}})
            assert {a["key"]: a["type"] for a in artifacts} == {"scalelab-pipeline": "markdown",
                                                                "scalelab-report": "markdown"}
            # the nightly deployment `make serve` keeps, as the Prefect UI lists it
            deploy = ("import sys; sys.path.insert(0, 'flows'); from pipeline import pipeline; "
                      "pipeline.to_deployment(name='scalelab-nightly', cron='0 3 * * *').apply()")
            subprocess.run([sys.executable, "-c", deploy], cwd=ROOT, check=True, capture_output=True, timeout=300,
                           env={**os.environ, **servers_env, "PREFECT_API_URL": f"{papi}"})
            assert [d["name"] for d in _json(f"{papi}/deployments/filter", {})] == ["scalelab-nightly"]
            browser.get(f"{urls['prefect']}/deployments")
            _wait_text(browser, "scalelab-nightly")
            browser.save_screenshot(str(SHOTS / "pipeline_prefect_deployments.png"))
            browser.get(f"{urls['prefect']}/runs/flow-run/{flow_run['id']}")
            _wait_text(browser, flow_run["name"], "Completed")
            WebDriverWait(browser, 90).until(lambda b: b.find_elements(By.CSS_SELECTOR, "canvas"))  # the graph
            time.sleep(3)  # its nodes are drawn on the canvas after it appears
            browser.save_screenshot(str(SHOTS / "pipeline_prefect_flow_run.png"))
            _docs_screenshot("pipeline_prefect_flow_run.png", "prefect.png")
    finally:
        browser.quit()


def test_a_study_of_hidden_decoding_cells_is_decided_as_the_summary_stage_decides_the_pipelines(built, tmp_path):
    """The generator of a `scalelab study` of hidden_decoding cells (scalelab.hidden_decoding.ledger:study) reads
    each cell's files where the study keeps them (results/<name>/cells/<cell>/) and writes the ledger the summary
    stage wrote from the same files in this flow run."""
    import shutil

    from scalelab.ledger import claims
    from scalelab.hidden_decoding import ledger as hidden_decoding

    _, ws, _ = built
    folder = tmp_path / "hd-study"
    for metrics in sorted((ws / "metrics" / "hidden_decoding").glob("*.json")):
        name = metrics.stem
        files = {f"metrics/hidden_decoding/{name}.json": "-", f"plots/hidden_decoding/{name}.csv": "-"}
        for rel in files:
            (folder / "cells" / name / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ws / rel, folder / "cells" / name / rel)
        (folder / "cells" / name / "cell.json").write_text(json.dumps({"files": files}))
    shutil.copyfile(ws / "params.yaml", folder / "params.yaml")
    assert hidden_decoding.study(folder) == claims.read_claims(ws / "metrics" / "claims_c.json")


def test_changing_one_variant_reruns_only_its_cells(built, prefect_harness, monkeypatch):
    """One variant's params edited: the main command reruns exactly that variant's cells and the stages downstream of
    them (by the DAG), and the params check; every other stage is up to date."""
    _, ws, env = built
    for key in ("SCALELAB_ROOT", "MLFLOW_TRACKING_URI", "PYTHONPATH"):  # the flow runs in this process, on the copy
        monkeypatch.setenv(key, env[key])
    for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(ws)
    params = yamlio.safe_load((ws / "params.yaml").read_text())
    params["model"]["variants"]["none"] = {"scales": True}  # a real change: its cells train another model
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cells = {f"pretrain@none-{size}-{seed}" for size in params["pretrain"]["grid"]["sizes"]
             for seed in params["pretrain"]["grid"]["seeds"]}
    status = _run(DVC + ["status"], ws, env)
    changed = {line.rstrip(":").strip() for line in status.splitlines() if line and not line.startswith("\t")
               and line.rstrip().endswith(":")}
    graph = flow_mod.stage_graph(ws)  # edges point from a stage to what it depends on
    downstream = set().union(*(nx.ancestors(graph, cell) for cell in cells))
    assert {"scaling", "report", "evaluate@none-c-0"} <= downstream and "pretrain@standard-a-0" not in downstream
    # `validate` (the params check at the DAG head) reruns on any params edit; its out never changes, so it reruns
    # nothing downstream. Besides the variant's cells, only stages downstream of them may read the edited params
    # themselves (scaling: its ledger reads the variants' decay settings); no other cell and no other stage.
    assert {"validate"} | cells <= changed <= {"validate"} | cells | downstream, sorted(changed)
    statuses = {r["stage"]: r["status"] for r in flow_mod.pipeline(workers=2)}
    ran = {stage for stage, status in statuses.items() if status == "ran"}
    assert ran == {"validate"} | cells | downstream, {"missing": sorted(({"validate"} | cells | downstream) - ran),
                                                      "extra": sorted(ran - cells - downstream - {"validate"})}
    assert set(statuses.values()) == {"ran", "up to date"} and set(statuses) == set(graph)


@mutant("flow-reruns-whole-matrix")
def _(monkeypatch):  # a changed cell reruns every cell of its matrix stage, as if the matrix were one stage
    real_changed, real_stream, whole = flow_mod.changed_stages, flow_mod._stream, set()

    def changed_stages(root, targets=None, repo=None):
        found = real_changed(root, targets, repo)
        if found:
            matrices = {s.split("@")[0] for s in found if "@" in s}
            whole.update(s for s in flow_mod.stage_graph(root) if s.split("@")[0] in matrices)
        return None if found is None else found | whole

    def stream(cmd, root, env, stage, logger):
        return real_stream([*cmd[:-1], "--force", stage] if stage in whole else cmd, root, env, stage, logger)
    monkeypatch.setattr(flow_mod, "changed_stages", changed_stages)
    monkeypatch.setattr(flow_mod, "_stream", stream)


@pytest.mark.mutation
def test_the_rerun_test_catches_a_flow_that_reruns_the_whole_matrix():
    """Slow (builds the micro DAG, then reruns 9 cells and their dependents): opt-in with the other mutation checks."""
    assert_caught("tests/test_pipeline.py::test_changing_one_variant_reruns_only_its_cells", "flow-reruns-whole-matrix")

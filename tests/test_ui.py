"""The dashboards as a person sees them: `make ui`'s two servers over a project's stores, after a real flow run of
a tiny DVC project and its deployment; headless Chromium (Debian's `chromium` + `chromium-driver`, installed by .ci/run)
checks the MLflow runs table (parent with its children, the saved view), a metric chart, the Prefect deployment and
the last flow run's tasks; REST checks go through both servers' APIs. Screenshots land in test-artifacts/ui/."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from conftest import FAST_TMP, ROOT

pytestmark = pytest.mark.slow
CHROMIUM, DRIVER = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or "/usr/bin/chromedriver"
SHOTS = ROOT / "test-artifacts" / "ui"
STAGES = ["a", "b", "c@x", "c@y"]

STAGE = """\
import os, sys
from pathlib import Path
from scalelab import tracking

name, dep, out = sys.argv[1:]
with tracking.stage_run(os.environ["DVC_STAGE"], params={"name": name}, experiment="ui-test",
                        deps=[dep] if dep != "-" else []) as run:
    for step, loss in enumerate((3.0, 2.5, 2.2)):
        run.log_metrics({"val/loss": loss + len(name) * 0.01}, step=step)
    Path(out).write_text((Path(dep).read_text() if dep != "-" else "") + name)
"""
DVC_YAML = """\
stages:
  a:
    cmd: python stage.py a - a.txt
    deps: [stage.py]
    outs: [a.txt]
  b:
    cmd: python stage.py b a.txt b.txt
    deps: [a.txt]
    outs: [b.txt]
  c:
    matrix: {name: [x, y]}
    cmd: python stage.py ${item.name} b.txt c_${item.name}.txt
    deps: [b.txt]
    outs:
      - c_${item.name}.txt
"""


def _browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[dev]')")
    if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
        pytest.skip("no headless browser: apt-get install chromium chromium-driver (.ci/run does)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def _json(url: str, body: dict | None = None) -> dict | list:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _run(cmd, cwd, env):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{cmd} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def dashboards(tmp_path_factory):
    browser = _browser()
    from scalelab import ui

    proj, state = tmp_path_factory.mktemp("uiproj"), Path(tempfile.mkdtemp(dir=FAST_TMP))
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=proj, check=True, capture_output=True)
    (proj / "stage.py").write_text(STAGE)
    (proj / "dvc.yaml").write_text(DVC_YAML)
    (proj / "params.yaml").write_text("tracking: {experiment: ui-test}\n")
    (proj / "data/report").mkdir(parents=True)  # as the report stage leaves it: the flow publishes it to Prefect
    (proj / "data/report/report.md").write_text("# scalelab report\n\n| claim | verdict |\n|---|---|\n| x | reproduced |\n")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{state / 'mlflow.db'}", "PREFECT_HOME": str(state / "prefect")}
    ports = (15000 + os.getpid() % 1000, 14200 + os.getpid() % 1000)
    try:
        with ui.servers(*ports, env=env, log_dir=state, timeout=240) as urls:
            run_env = {**os.environ, **env, "SCALELAB_ROOT": str(proj), "PREFECT_API_URL": f"{urls['prefect']}/api"}
            for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID"):
                run_env.pop(var, None)
            _run([sys.executable, str(ROOT / "flows/pipeline.py")], proj, run_env)
            deploy = ("import sys; sys.path.insert(0, 'flows'); from pipeline import pipeline; "
                      "pipeline.to_deployment(name='scalelab-nightly', cron='0 3 * * *').apply()")
            _run([sys.executable, "-c", deploy], ROOT, run_env)
            SHOTS.mkdir(parents=True, exist_ok=True)
            yield urls, browser
    finally:
        browser.quit()
        shutil.rmtree(state, ignore_errors=True)


def _wait_text(browser, *texts, timeout=120):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(browser, timeout).until(
            lambda b: all(t in b.find_element("tag name", "body").text for t in texts))
    except TimeoutException:
        browser.save_screenshot(str(SHOTS / "timeout.png"))
        body = browser.find_element("tag name", "body").text
        pytest.fail(f"{browser.current_url}: {[t for t in texts if t not in body]} not shown within {timeout} s "
                    f"(screenshot {SHOTS / 'timeout.png'}); page text: {body[:800]!r}")


def test_mlflow_lists_the_parent_run_with_its_children_and_draws_a_metric(dashboards):
    (urls, browser), api = dashboards, f"{dashboards[0]['mlflow']}/api/2.0/mlflow"
    exp = _json(f"{api}/experiments/get-by-name?experiment_name=ui-test")["experiment"]
    tags = {t["key"]: t["value"] for t in exp["tags"]}
    assert tags["mlflow.experimentKind"] == "custom_model_development"  # opens on the training runs
    runs = _json(f"{api}/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 100})["runs"]
    (parent,) = [r for r in runs if r["info"]["run_name"].startswith("pipeline ")]
    children = [r for r in runs if {"key": "mlflow.parentRunId", "value": parent["info"]["run_id"]}
                in r["data"]["tags"]]
    assert sorted(r["info"]["run_name"] for r in children) == sorted(STAGES)
    assert all({"key": "mlflow.source.name", "value": "stage.py"} in r["data"]["tags"] for r in children)

    from selenium.webdriver.common.by import By

    browser.get(f"{urls['mlflow']}/#/experiments/{exp['experiment_id']}/runs?viewStateShareKey=scalelab")
    _wait_text(browser, "Training runs", parent["info"]["run_name"])
    browser.find_element(By.CSS_SELECTOR, "[col-id='attributes.`Run Name`'] button").click()  # expand the parent
    _wait_text(browser, *[f"\n{s}\n" for s in STAGES])
    browser.save_screenshot(str(SHOTS / "mlflow_runs.png"))
    child = children[0]["info"]["run_id"]
    browser.get(f"{urls['mlflow']}/#/experiments/{exp['experiment_id']}/runs/{child}/model-metrics")
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 90).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".js-plotly-plot svg.main-svg"))
    _wait_text(browser, "val/loss")
    browser.save_screenshot(str(SHOTS / "mlflow_metric_chart.png"))


def test_prefect_shows_the_deployment_and_the_last_flow_run_with_a_task_per_stage(dashboards):
    (urls, browser), api = dashboards, f"{dashboards[0]['prefect']}/api"
    deployments = _json(f"{api}/deployments/filter", {})
    assert [d["name"] for d in deployments] == ["scalelab-nightly"]
    ran = {"flow_runs": {"state": {"type": {"not_any_": ["SCHEDULED"]}}}}  # the deployment's cron schedules more
    (flow_run,) = _json(f"{api}/flow_runs/filter", {**ran, "sort": "START_TIME_DESC", "limit": 1})
    assert flow_run["state_type"] == "COMPLETED"
    tasks = _json(f"{api}/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}}})
    assert sorted(t["name"] for t in tasks) == sorted(STAGES)
    artifacts = _json(f"{api}/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}}})
    assert {a["key"]: a["type"] for a in artifacts} == {"scalelab-pipeline": "markdown", "scalelab-report": "markdown"}

    browser.get(f"{urls['prefect']}/deployments")
    _wait_text(browser, "scalelab-nightly")
    browser.save_screenshot(str(SHOTS / "prefect_deployments.png"))
    browser.get(f"{urls['prefect']}/runs/flow-run/{flow_run['id']}")
    _wait_text(browser, flow_run["name"], "Completed")
    browser.save_screenshot(str(SHOTS / "prefect_flow_run.png"))
    browser.get(f"{urls['prefect']}/runs?tab=task-runs")
    _wait_text(browser, *STAGES)
    browser.save_screenshot(str(SHOTS / "prefect_task_runs.png"))

"""The dashboards as a person sees them: `make ui`'s two servers over a project's stores, after a real flow run of
a tiny DVC project and its deployment; headless Chromium (Debian's `chromium` + `chromium-driver`, installed by .ci/run)
checks the MLflow runs table (parent with its children, the saved view), a metric chart, the Prefect deployment and
the last flow run's tasks; REST checks go through both servers' APIs. Screenshots land in test-artifacts/ui/."""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from conftest import FAST_TMP, ROOT
from mutants import assert_caught, mutant
from workspace import seed_prefect_home

pytestmark = pytest.mark.slow
CHROMIUM, DRIVER = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or "/usr/bin/chromedriver"
SHOTS = ROOT / "test-artifacts" / "ui"
DOCS_IMG = ROOT / "docs" / "img"  # SCALELAB_DOCS_SCREENSHOTS=1: one screenshot per dashboard for the README


def _docs_screenshot(shot: str, name: str) -> None:
    """Copy one saved screenshot into docs/img/<name> when asked (the README shows what these tests saw)."""
    if os.environ.get("SCALELAB_DOCS_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHOTS / shot, DOCS_IMG / name)
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


def _unavailable(why: str):
    """Skip on a developer's machine; under CI (CI=true, set by .ci/run) fail: a green CI means the UIs were checked."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI: {why}; the browser tests cannot be skipped in CI", pytrace=False)
    pytest.skip(why)


def _browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed (pip install -e '.[dev]')")
    if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
        _unavailable("no headless browser: apt-get install chromium chromium-driver (.ci/run does)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def _free_ports(n: int) -> list[int]:
    """`n` distinct ports that are free now: the kernel's choice for port 0 (held open together, so distinct)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


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
def dashboards(tmp_path_factory, prefect_db):
    browser = _browser()
    from scalelab.tracking import ui

    proj, state = tmp_path_factory.mktemp("uiproj"), Path(tempfile.mkdtemp(dir=FAST_TMP))
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=proj, check=True, capture_output=True)
    (proj / "stage.py").write_text(STAGE)
    (proj / "dvc.yaml").write_text(DVC_YAML)
    (proj / "params.yaml").write_text("tracking: {experiment: ui-test}\n")
    (proj / "data/report").mkdir(parents=True)  # as the report stage leaves it: the flow publishes it to Prefect
    (proj / "data/report/report.md").write_text("# scalelab report\n\n| claim | verdict |\n|---|---|\n| x | reproduced |\n")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{state / 'mlflow.db'}",
           "PREFECT_HOME": str(seed_prefect_home(state / "prefect"))}  # migrated: the dashboards are tested here
    ports = _free_ports(2)  # free when chosen (ports derived from the pid collided across processes)
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


# ---------------------------------------------------------------- the rules above, without a browser
def test_ports_are_free_when_chosen_even_where_the_pid_would_point(monkeypatch):
    """Two distinct ports that bind, neither held by another process: here one holds the ports the old pid-derived
    choice (15000 + pid % 1000, 14200 + pid % 1000) gave this process, as another user's run could."""
    pid_ports = (15000 + os.getpid() % 1000, 14200 + os.getpid() % 1000)
    with contextlib.ExitStack() as stack:
        for port in pid_ports:
            held = stack.enter_context(socket.socket())
            held.bind(("127.0.0.1", port))
            held.listen()
        ports = _free_ports(2)
        assert len(set(ports)) == 2 and not set(ports) & set(pid_ports), (ports, pid_ports)
        for port in ports:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))


@mutant("ui-ports-from-pid")
def _(monkeypatch):  # the ports before: derived from the pid, unchecked
    monkeypatch.setattr(sys.modules[__name__], "_free_ports",
                        lambda n: [15000 + os.getpid() % 1000, 14200 + os.getpid() % 1000][:n])


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_browser_fails_under_ci_and_skips_elsewhere(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    try:  # a skip must not escape as the test's own outcome: caught and compared
        _browser()
    except BaseException as err:  # noqa: BLE001  (pytest's outcomes are BaseExceptions)
        raised = err
    assert type(raised) is outcome and "no headless browser" in str(raised), repr(raised)


@mutant("ui-skips-in-ci")
def _(monkeypatch):  # the rule before: skip whatever CI says
    monkeypatch.setattr(sys.modules[__name__], "_unavailable", lambda why: pytest.skip(why))


def test_ci_fails_when_it_cannot_install_a_browser(tmp_path):
    """.ci/run stops with an error, before the tests, when chromium cannot be had (here: no root, no apt-get)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "id"):  # what the script needs before it would install; no chromium, no apt-get
        (bin_dir / tool).symlink_to(shutil.which(tool))
    suite = tmp_path / "suite-ran"
    (bin_dir / "make").write_text(f"#!/bin/sh\ntouch {suite}\n")  # a suite that would pass
    (bin_dir / "make").chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    res = subprocess.run(["/bin/bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1 and "UI tests cannot run" in res.stderr, (res.returncode, res.stdout, res.stderr)
    assert not suite.exists()  # stopped before the suite, not green without the UI checks


@pytest.mark.mutation
@pytest.mark.parametrize("name, test", [
    ("ui-ports-from-pid", "test_ports_are_free_when_chosen_even_where_the_pid_would_point"),
    ("ui-skips-in-ci", "test_a_missing_browser_fails_under_ci_and_skips_elsewhere[true-Failed]")])
def test_the_ui_rule_tests_catch(name, test):
    assert_caught(f"tests/test_ui.py::{test}", name)

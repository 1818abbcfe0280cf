"""The dashboards' browser and the rules around it: headless Chromium (Debian's `chromium` + `chromium-driver`,
installed by .ci/run), free ports for `make ui`'s two servers, and a missing browser failing CI rather than skipping.
tests/test_pipeline.py drives them over its real flow run (the MLflow runs table with the saved view, a metric chart,
the Prefect flow run, its artifacts and the deployment); screenshots land in test-artifacts/ui/."""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request

import pytest
from conftest import ROOT
from mutants import assert_caught, mutant

pytestmark = pytest.mark.slow
CHROMIUM, DRIVER = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or "/usr/bin/chromedriver"
SHOTS = ROOT / "test-artifacts" / "ui"
DOCS_IMG = ROOT / "docs" / "img"  # SCALELAB_DOCS_SCREENSHOTS=1: one screenshot per dashboard for the README


def _docs_screenshot(shot: str, name: str) -> None:
    """Copy one saved screenshot into docs/img/<name> when asked (the README shows what these tests saw)."""
    if os.environ.get("SCALELAB_DOCS_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHOTS / shot, DOCS_IMG / name)


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

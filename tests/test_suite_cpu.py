"""tools/suite_cpu.py: a command's processes' CPU, by kind and by the test that started them."""

import importlib.util
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("suite_cpu", ROOT / "tools" / "suite_cpu.py")
suite_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite_cpu)

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.8:\n    pass\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_marked_child_is_counted_under_its_kind_and_test_and_an_unmarked_one_is_not(tmp_path, monkeypatch):
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "burn.py").write_text(BURN)
    parent = (
        "import os, subprocess, sys\n"
        "subprocess.run([sys.executable, 'stages/burn.py'],"
        " env={**os.environ, 'PYTEST_CURRENT_TEST': 'tests/test_x.py::test_y (call)'}, check=True)\n"
        "env = {k: v for k, v in os.environ.items() if k != 'SCALELAB_SUITE_CPU'}\n"  # not the command's any more
        "subprocess.run([sys.executable, 'stages/burn.py'], env=env, check=True)\n")
    (tmp_path / "parent.py").write_text(parent)
    monkeypatch.chdir(tmp_path)
    result = suite_cpu.measure([sys.executable, "parent.py"], every=0.05)
    assert result["exit"] == 0
    burns = [p for p in result["processes"] if "burn.py" in p["cmd"]]
    assert len(burns) == 1  # the unmarked one is not the command's
    assert 0.6 <= burns[0]["cpu_s"] <= 1.2 and burns[0]["test"] == "tests/test_x.py::test_y"
    text = suite_cpu.report(result)
    assert "tests/test_x.py::test_y" in text and " stage" in text


def test_a_process_forked_by_the_warm_server_counts_as_a_stage():
    server = "/venv/bin/python -m scalelab.pipeline.warm --socket /tmp/w.sock"
    rows = [{"pid": 10, "ppid": 1, "cmd": server, "test": "", "cpu_s": 5.0},
            {"pid": 11, "ppid": 10, "cmd": server, "test": "t::a", "cpu_s": 2.0},
            {"pid": 12, "ppid": 1, "cmd": "/venv/bin/python -m scalelab.pipeline.dvcrun repro -s x", "test": "t::a",
             "cpu_s": 1.0},
            {"pid": 13, "ppid": 10, "cmd": server, "comm": "scalelab-dvc", "test": "t::a", "cpu_s": 0.5},
            # a test's temporary paths are no pytest worker, and a server's preloads no DVC command
            {"pid": 14, "ppid": 1, "cmd": "/venv/bin/python /tmp/pytest-of-root/pytest-3/ws/stages/pretrain.py",
             "test": "t::b", "cpu_s": 4.0},
            {"pid": 15, "ppid": 1, "cmd": server + " --preload scalelab.pipeline.dvcrun", "test": "", "cpu_s": 3.0}]
    text = suite_cpu.report({"exit": 0, "wall_s": 1.0, "machine_cpu_s": 9.0, "processes": rows})
    by_kind = {line.split("  ")[-1].strip(): float(line.split()[0]) for line in text.splitlines()
               if line[:7].strip().replace(".", "").isdigit() and "  " in line}
    assert by_kind["warm server"] == 8.0 and by_kind["stage"] == 6.0 and by_kind["dvc (the flow's, per stage)"] == 1.5
    assert "pytest worker" not in by_kind
    assert "3.5  t::a" in text  # a test's subprocesses: the forked stage, its DVC forked and cold


@pytest.mark.parametrize("cmd, kind", [
    # MLflow's server is a uvicorn as Prefect's temporary one is: each counted by its app
    ("/v/bin/python -m uvicorn --log-config /v/mlflow/server/uvicorn_log_config.yaml --host 127.0.0.1 --port 1 "
     "--workers 1 mlflow.server.fastapi_app:app", "mlflow server"),
    ("/v/bin/python -m uvicorn --app-dir /v/site-packages --factory prefect.server.api.server:create_app "
     "--host 127.0.0.1 --port 2", "prefect server"),
    ("/v/bin/python /v/bin/prefect server start --host 127.0.0.1 --port 3", "prefect server"),
    ("/v/bin/python /v/bin/mlflow server --backend-store-uri postgresql://x", "mlflow server"),
])
def test_each_server_is_counted_as_its_own_kind(cmd, kind):
    assert suite_cpu.kind_of(cmd) == kind

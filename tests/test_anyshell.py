"""`dvc repro` from any shell: DVC started from the venv runs every stage with the venv's
interpreter whatever PATH the user's shell has (no python at all, or a foreign one first), and a stage interpreter
running other code than the project's refuses at the head of the DAG with one line, before any result is touched.
Also: changing machine settings leaves `dvc status` clean.

A throwaway venv stands for the project's .venv after `make setup`: this interpreter's base, this venv's packages on
its path, the path hook `make setup` writes (scalelab.pipeline.interpreter), and a `dvc` console script."""

import json
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import yaml
from conftest import MICRO
from mutants import mutant, mutation_checks
from workspace import workspace_copy

from scalelab.pipeline import interpreter
from scalelab.runtime import yamlio

CLEAN_PATH = "/usr/bin:/bin"  # git and a shell; no `python` (Debian ships python3 only)


def _venv(where: Path) -> Path:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    site = Path(sysconfig.get_paths(vars={"base": str(where), "platbase": str(where)})["purelib"])
    # this venv's packages (DVC, torch, ...) as a path: their own .pth files (an editable scalelab) not processed
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (where / "bin" / "dvc").write_text(f"#!{where}/bin/python\nimport sys\nfrom dvc.cli import main\nsys.exit(main())\n")
    (where / "bin" / "dvc").chmod(0o755)
    return site  # without the path hook: each test installs it, as `make setup` does


def _foreign(where: Path, body: str) -> Path:
    """A folder holding a `python` that is not the project's: it logs each call, then runs `body`."""
    where.mkdir()
    (where / "python").write_text(f"#!/bin/sh\necho \"$0 $*\" >> {where}/calls.log\n{body}\n")
    (where / "python").chmod(0o755)
    return where


def _dvc(ws: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ws.parent / "venv" / "bin" / "dvc"), *args], cwd=ws, env=env, capture_output=True,
                          text=True, timeout=600)


def _outs(ws: Path) -> dict:
    """prepare's results (its folder's mlflow_run.json names a new run on each run: not compared by content)."""
    files = sorted((ws / "data/prepared").iterdir())
    return {"prepared": {p.name: p.read_bytes() for p in files if p.name != "mlflow_run.json"},
            "files": [p.name for p in files], "metrics": json.loads((ws / "metrics/prepare.json").read_text())}


@pytest.fixture(scope="module")
def shell_ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("anyshell")
    site = _venv(root / "venv")
    ws = root / "ws"
    env = workspace_copy(ws, MICRO)
    env = {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "SCALELAB_MACHINE")} | {"SHELL": "/bin/sh"}
    return ws, env, site


def test_dvc_from_the_venv_runs_its_python_from_a_clean_path_and_past_a_foreign_one(shell_ws, tmp_path):
    ws, env, site = shell_ws
    interpreter.install(site)
    res = _dvc(ws, env | {"PATH": CLEAN_PATH}, "repro", "validate", "prepare")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    built = _outs(ws)
    assert built["files"] == ["mlflow_run.json", "train.parquet", "val.parquet"] and built["metrics"]["val"]
    # machine settings changed: nothing to rerun (they are no DVC params, and machine.yaml no dependency)
    (ws / "machine.yaml").write_text(yaml.safe_dump({"pretrain": {"threads": 7, "devices": 2, "compile": True},
                                                     "evaluate": {"device": "cpu", "threads": 7}}))
    status = _dvc(ws, env | {"PATH": CLEAN_PATH}, "status", "--json", "validate", "prepare")
    assert status.returncode == 0 and json.loads(status.stdout) == {}, status.stdout + status.stderr
    # a foreign `python` first on PATH: never called, the same results
    foreign = _foreign(tmp_path / "foreign", "exit 1")
    res = _dvc(ws, env | {"PATH": f"{foreign}:{CLEAN_PATH}"}, "repro", "--force", "validate", "prepare")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Running stage 'prepare'" in res.stdout and not (foreign / "calls.log").exists()
    assert _outs(ws) == built


def test_a_stage_interpreter_with_other_code_refuses_before_any_result_is_touched(shell_ws, tmp_path):
    """No path hook (a venv set up before it) and a foreign `python` first on PATH, one that imports another copy of
    scalelab (another clone's): the `validate` stage refuses with one line, exit 2, and DVC stops there: prepare's
    outs and dvc.lock keep their bytes."""
    ws, env, site = shell_ws
    if not (ws / "data/prepared/train.parquet").exists():  # run alone
        interpreter.install(site)
        res = _dvc(ws, env | {"PATH": CLEAN_PATH}, "repro", "validate", "prepare")
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    other = tmp_path / "other-clone"
    subprocess.run(["cp", "-r", str(ws / "src"), str(other)], check=True)
    (other / "scalelab" / "pipeline" / "check.py").write_text(
        (other / "scalelab" / "pipeline" / "check.py").read_text() + "\n# another clone's version\n")
    foreign = _foreign(tmp_path / "foreign", f'PYTHONPATH={other} exec {sys.executable} "$@"')
    (site / interpreter.PTH_NAME).unlink(missing_ok=True)
    try:
        before = {p: p.read_bytes() for p in [ws / "dvc.lock", *(ws / "data/prepared").iterdir()]}
        # prepare must rerun too (its params changed), so only the refusal at the head keeps its outs
        params = yamlio.safe_load((ws / "params.yaml").read_text())
        params["prepare"]["min_chars"] = 2
        (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        res = _dvc(ws, env | {"PATH": f"{foreign}:{CLEAN_PATH}"}, "repro", "validate", "prepare")
    finally:
        interpreter.install(site)
    assert res.returncode != 0 and (foreign / "calls.log").exists()
    refusal = [line for line in res.stderr.splitlines() if "check:" in line]
    assert len(refusal) == 1 and "not this project's" in refusal[0] and "make setup" in refusal[0], res.stderr
    assert "exited with 2" in res.stderr and "Running stage 'prepare'" not in res.stdout
    assert {p: p.read_bytes() for p in before} == before


@mutant("no-path-hook")
def _(monkeypatch):
    monkeypatch.setattr(interpreter, "PTH_LINE", "import os\n")


def test_the_guard_compares_the_loaded_code_with_the_projects(tmp_path, monkeypatch):
    """In a stage DVC runs (DVC_ROOT set): the project's own src/scalelab byte for byte passes, wherever it lies (a
    `dvc exp --temp` copy); one edited file among the loaded modules refuses; outside DVC nothing is compared."""
    import shutil

    import scalelab

    here = Path(scalelab.__file__).resolve().parent
    shutil.copytree(here, tmp_path / "src" / "scalelab", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.delenv("DVC_ROOT", raising=False)
    interpreter.check_project_code()
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    interpreter.check_project_code()  # the same code elsewhere
    edited = tmp_path / "src" / "scalelab" / "config" / "params.py"
    edited.write_text(edited.read_text() + "# edited\n")
    with pytest.raises(interpreter.WrongInterpreter, match=r"not this project's .*config/params\.py differs"):
        interpreter.check_project_code()


@mutant("guard-trusts-any-scalelab")
def _(monkeypatch):
    monkeypatch.setattr(interpreter, "check_project_code", lambda: None)


test_the_anyshell_tests_are_caught = mutation_checks([
    ("no-path-hook",
     "tests/test_anyshell.py::test_dvc_from_the_venv_runs_its_python_from_a_clean_path_and_past_a_foreign_one"),
    ("guard-trusts-any-scalelab", "tests/test_anyshell.py::test_the_guard_compares_the_loaded_code_with_the_projects"),
])

"""The `scalelab` console script: its commands, their help, a bad params file as one line and exit
2, the params check before the flow starts, and push/pull delegated to the remote module when there is one."""

import os
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest
import yaml
from conftest import MICRO, ROOT
from mutants import mutant, mutation_checks
from workspace import seed_check_verdicts

from scalelab.pipeline import cli
from scalelab.runtime import yamlio

COMMANDS = ["repro", "check", "ui", "report", "profile", "push", "pull", "study"]


def test_the_console_script_is_the_cli_and_its_help_lists_every_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["scalelab"].split(":")
    assert (module, func) == ("scalelab.pipeline.cli", "main")
    res = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    listed = res.stdout.split("commands:")[1]
    for command in COMMANDS:
        assert f"\n    {command} " in listed, (command, res.stdout)
    assert set(cli.COMMANDS) == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_from_its_docstring(command, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # `ui` hands its parser sys.argv
    with pytest.raises(SystemExit) as done:
        code = cli.main([command, "--help"])
        raise SystemExit(code)
    out = capsys.readouterr().out
    assert done.value.code == 0 and "usage:" in out, out
    if command in ("repro", "report"):  # the others hand their arguments to their modules, whose help is theirs
        first = " ".join(cli.COMMANDS[command].__doc__.split()[:4])
        assert first in " ".join(out.split()), out


def _project(tmp_path: Path, params: str) -> Path:
    """A project folder: dvc.yaml, params.yaml, the corpus folder it names, and a flows/pipeline.py that records its
    arguments instead of running anything."""
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "params.yaml").write_text(params)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "pipeline.py").write_text(
        "import sys; from pathlib import Path; Path('flow_started').write_text(' '.join(sys.argv[1:]))\n")
    # the test run's remembered verdicts on the micro profile: its optimizers are not built again for each project
    # (their check has tests of its own: test_bad_params.py, test_hardening.py)
    seed_check_verdicts(tmp_path, dict(os.environ))
    return tmp_path


@pytest.mark.parametrize("bad", ["typo", "machine-inline"])
def test_check_on_a_bad_params_file_exits_2_with_one_line(tmp_path, bad):
    raw = yamlio.safe_load(MICRO.read_text())
    if bad == "typo":
        raw["pretrain"]["max_step"] = 3
    else:
        raw["pretrain"]["threads"] = 2
    root = _project(tmp_path, yaml.safe_dump(raw))
    res = subprocess.run([sys.executable, "-m", "scalelab.pipeline.cli", "check"], cwd=root, capture_output=True,
                         text=True, timeout=120, env={**__import__("os").environ, "SCALELAB_ROOT": str(root)})
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1, (res.returncode, err)
    assert ("pretrain.max_step: unknown key" if bad == "typo" else "pretrain.threads") in err, err


# What the schema accepts and the stages could not run here (scalelab.pipeline.runnable): the params mutation, the
# machine file, and what the one line must name (each was passed by `scalelab check` and failed a stage, issue 59)
UNRUNNABLE = {
    "a model name with a dot": (lambda r: r["evaluate"].update(models={"sigmascale-0.8": {"path": "m"}}), None,
                                "evaluate.models.sigmascale-0.8: a name with a dot"),
    "cuda without CUDA": (lambda r: None, {"compress": {"device": "cuda"}},
                          "compress.device: cuda, but this machine has no CUDA device: for a CPU run put "
                          "`compress: {device: cpu}` in"),
    "a hub split offline": (lambda r: r["compress"]["eval"].update(
        hub={"hub_id": "scalelab-tests/never-cached", "hub_config": "raw", "hub_split": "test"}), None,
        "compress.eval.hub: scalelab-tests/never-cached/raw:test cannot be read offline"),
}


@pytest.mark.parametrize("case", list(UNRUNNABLE))
def test_check_refuses_params_this_machine_cannot_run_in_one_line(tmp_path, case):
    """`scalelab check` on the project's dvc.yaml, offline (the suite's HF_*_OFFLINE): exit 2, one line naming the
    setting and what to write instead. Each refusal is the mutation's: the same project without it passes."""
    import os

    mutate, machine, needle = UNRUNNABLE[case]
    if case == "cuda without CUDA":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    raw = yamlio.safe_load(MICRO.read_text())
    raw.pop("machine")  # the file layer below is this test's machine
    root = _project(tmp_path, yaml.safe_dump(raw))
    (root / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    env = {**os.environ, "SCALELAB_ROOT": str(root), "SCALELAB_MACHINE": str(root / "machine.yaml"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    (root / "machine.yaml").write_text(yaml.safe_dump({"pretrain": {"threads": 1}}))
    cmd = [sys.executable, "-m", "scalelab.pipeline.cli", "check"]
    res = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    mutate(raw)
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    if machine is not None:
        (root / "machine.yaml").write_text(yaml.safe_dump(machine))
    res = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120, env=env)
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1 and needle in err, (res.returncode, err)


def test_repro_checks_params_before_it_starts_the_flow(tmp_path, monkeypatch):
    """A bad params file: exit 2, the flow never started (DVC would delete outs before a stage refuses); a good one:
    the flow starts with the options passed on."""
    monkeypatch.chdir(_project(tmp_path, MICRO.read_text().replace("seed: 0", "seed: 0\nseeed: 1", 1)))
    monkeypatch.setenv("SCALELAB_ROOT", str(tmp_path))
    assert cli.main(["repro", "--workers", "2"]) == 2
    assert not (tmp_path / "flow_started").exists()
    (tmp_path / "params.yaml").write_text(MICRO.read_text())
    assert cli.main(["repro", "--workers", "2", "--target", "prepare"]) == 0
    assert (tmp_path / "flow_started").read_text() == "--target=prepare --workers=2"


def test_push_and_pull_call_the_remote_module_or_say_it_is_missing(monkeypatch, capsys):
    for name in cli.REMOTE_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(cli, "REMOTE_MODULES", ("scalelab_test_no_such_remote",))
    assert cli.main(["push"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not available" in err and "dvc push" in err, err
    calls = []
    fake = types.ModuleType("scalelab_test_remote")
    fake.main = lambda argv: calls.append(argv) or 0
    monkeypatch.setitem(sys.modules, "scalelab_test_remote", fake)
    monkeypatch.setattr(cli, "REMOTE_MODULES", ("scalelab_test_no_such_remote", "scalelab_test_remote"))
    assert cli.main(["pull", "-r", "team"]) == 0 and cli.main(["push"]) == 0
    assert calls == [["pull", "-r", "team"], ["push"]]


@mutant("cli-repro-without-check")
def _(monkeypatch):
    run = cli._run
    monkeypatch.setattr(cli, "_run", lambda cmd, cwd, env: 0 if "scalelab.pipeline.check" in cmd else run(cmd, cwd, env))


test_the_cli_tests_are_caught = mutation_checks([
    ("cli-repro-without-check", "tests/test_cli.py::test_repro_checks_params_before_it_starts_the_flow"),
])

"""A bad param costs nothing under any DVC command. DVC deletes a stage's outs right before running its command, and
with `dvc repro -s STAGE` (or `dvc exp run -s STAGE`) the `validate` stage at the head of the DAG does not run: the
venv's hook (scalelab.pipeline.interpreter) checks params.yaml and machine.yaml in DVC's own process first, and
refuses with one line naming the key, before DVC touches a file. Library kwargs are checked for their type (and each
optimizer is built), and prepare's out hashes to its data alone (its MLflow pointer is outside the hash).

A throwaway venv stands for the project's .venv after `make setup` (tests/test_anyshell.py's): this venv's packages
on its path, the hook `make setup` writes, a `dvc` console script. One micro project, `prepare` built once."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import MICRO
from test_anyshell import _venv
from workspace import workspace_copy

from scalelab.pipeline import check, interpreter
from scalelab.runtime import yamlio


def _run(cmd, ws, env, check_rc=True):
    res = subprocess.run([str(c) for c in cmd], cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    if check_rc and res.returncode:
        raise AssertionError(f"{cmd} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(workspace, env, venv bin): a micro project whose `validate` and `prepare` ran through the hooked venv."""
    root = tmp_path_factory.mktemp("badparams")
    interpreter.install(_venv(root / "venv"))
    ws = root / "ws"
    env = workspace_copy(ws, MICRO)
    env = {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "SCALELAB_MACHINE")}
    bin_ = root / "venv" / "bin"
    _run([bin_ / "dvc", "repro", "prepare"], ws, env)
    return ws, env, bin_


def _snapshot(ws: Path) -> dict[str, bytes]:
    """Every output of the work tree (data/, metrics/, plots/), dvc.lock and params.yaml, by content."""
    files = [p for d in ("data", "metrics", "plots") for p in sorted((ws / d).rglob("*")) if p.is_file()]
    return {str(p.relative_to(ws)): p.read_bytes() for p in [*files, ws / "dvc.lock", ws / "params.yaml"]}


def _commands(bin_: Path) -> dict[str, list]:
    """Each DVC entry point, on the `prepare` stage, forced where it takes -f (prepare would run whatever changed)."""
    return {
        "repro -s": [bin_ / "dvc", "repro", "-f", "-s", "prepare"],
        "python -m dvc repro --single-item": [bin_ / "python", "-m", "dvc", "repro", "-f", "--single-item", "prepare"],
        "repro STAGE": [bin_ / "dvc", "repro", "prepare"],
        "exp run -s": [bin_ / "dvc", "exp", "run", "-f", "-s", "prepare"],
        "dvcrun repro -s": [bin_ / "python", "-m", "scalelab.pipeline.dvcrun", "repro", "-f", "-s", "prepare"],
    }


MUTATIONS = {  # name: (mutation of params.yaml, what the one line must name)
    "unknown key": (lambda r: r["prepare"].update(val_fractoin=0.1), "prepare.val_fractoin: unknown key"),
    "wrong type": (lambda r: r["prepare"].update(val_fraction="a tenth"), "prepare.val_fraction: Input should be"),
    "negative size": (lambda r: r["model"]["sizes"]["a"].update(d_model=-32), "model.sizes.a.d_model"),
    "library kwarg of the wrong type": (lambda r: r["optim"]["galore"]["kwargs"].update(rank_ratio="not-a-number"),
                                        "optim.galore.kwargs: rank_ratio: Input should be a valid number"),
    # valid to the schema; DVC would read `evaluate.models.sigmascale-0.8` as a nested key (scalelab.pipeline.runnable)
    "a model name DVC cannot address": (lambda r: r["evaluate"].update(models={"sigmascale-0.8": {"path": "m"}}),
                                        "evaluate.models.sigmascale-0.8: a name with a dot"),
}


def _refused(res, prog: str, needle: str) -> None:
    """Refused by the hook: exit 2, one line `<prog>: ...` naming the key, no stage run."""
    lines = [line for line in res.stderr.splitlines() if line.startswith(f"{prog}:")]
    assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], res.stdout[-2000:] + res.stderr[-2000:]
    assert "Running stage" not in res.stdout and "Traceback" not in res.stderr, res.stdout[-2000:] + res.stderr


def _mutated(ws: Path, mutate) -> str:
    good = (ws / "params.yaml").read_text()
    raw = yamlio.safe_load(good)
    mutate(raw)
    (ws / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return good


@pytest.mark.slow  # DVC commands in a workspace copy
@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_bad_param_is_refused_before_dvc_touches_anything(built, mutation):
    ws, env, bin_ = built
    mutate, needle = MUTATIONS[mutation]
    commands = _commands(bin_)
    # every mutation under `repro -s` and `exp run -s`; the library kwarg under every entry point
    names = list(commands) if mutation == "library kwarg of the wrong type" else ["repro -s", "exp run -s"]
    good = _mutated(ws, mutate)
    try:
        before = _snapshot(ws)
        for name in names:
            res = _run(commands[name], ws, env, check_rc=False)
            _refused(res, "dvc exp run" if "exp run" in name else "dvc repro", needle)
            assert _snapshot(ws) == before, name
    finally:
        (ws / "params.yaml").write_text(good)


@pytest.mark.slow
def test_an_exp_run_override_is_checked_as_dvc_would_write_it(built):
    """`dvc exp run -S key=value` writes params.yaml itself, after the process started: the hook applies the
    overrides (DVC's own code, on a copy) and checks the result; params.yaml keeps its bytes."""
    ws, env, bin_ = built
    before = _snapshot(ws)
    res = _run([bin_ / "dvc", "exp", "run", "-s", "prepare", "-S", "model.sizes.a.d_model=-32"], ws, env, False)
    _refused(res, "dvc exp run", "model.sizes.a.d_model")
    assert _snapshot(ws) == before


@pytest.mark.slow
def test_a_bad_machine_file_and_a_value_the_library_refuses_are_refused(built):
    """machine.yaml is checked with params.yaml; a kwarg of the right type that the library's constructor refuses
    (Sophia's negative clip `p`) is refused too: the hook builds each optimizer once per setting, in a child
    process (DVC's own process imports no torch)."""
    ws, env, bin_ = built
    before = _snapshot(ws)
    (ws / "machine.yaml").write_text(yaml.safe_dump({"pretrain": {"threads": -2}}))
    try:
        res = _run(_commands(bin_)["repro -s"], ws, env, check_rc=False)
    finally:
        (ws / "machine.yaml").unlink()
    _refused(res, "dvc repro", "pretrain.threads")
    good = _mutated(ws, lambda r: r["optim"]["sophia"]["kwargs"].update(p=-1.0))
    try:
        res = _run(_commands(bin_)["repro -s"], ws, env, check_rc=False)
    finally:
        (ws / "params.yaml").write_text(good)
    _refused(res, "dvc repro", "optim.sophia: sophia refuses these settings: p (gradient clip) must be non-negative")
    assert _snapshot(ws) == before


@pytest.mark.slow
def test_the_hook_imports_no_torch_and_nothing_outside_dvc(built):
    """In DVC's process the check of params it has not seen (the whole schema) leaves torch and Lightning unimported
    (the optimizers it has not built are built in a child: the test above); a process of the venv that is not DVC's
    imports nothing of scalelab."""
    ws, env, bin_ = built
    good = _mutated(ws, lambda r: r["prepare"].update(val_fraction=0.2))  # valid, and new to the stamp
    probe = ("import json, sys; from scalelab.pipeline.interpreter import dvc_refusal; "
             "print(json.dumps([dvc_refusal(['repro', '-s', 'prepare']), "
             "[m for m in ('torch', 'lightning', 'pytorch_optimizer') if m in sys.modules]]))")
    try:
        seen = len(json.loads((ws / check.STAMP).read_text())["params"])
        out = _run([bin_ / "python", "-c", probe], ws, env).stdout
        assert json.loads(out.splitlines()[-1]) == [None, []], out
        assert len(json.loads((ws / check.STAMP).read_text())["params"]) == seen + 1  # checked, and remembered
    finally:
        (ws / "params.yaml").write_text(good)
    res = _run([bin_ / "python", "-c", "import sys; print([m for m in sys.modules if m.startswith('scalelab')])"],
               ws, env)
    assert res.stdout.strip() == "[]" and res.stderr == "", res.stdout + res.stderr
    # a DVC process of a venv where scalelab is not importable: DVC as it was, no noise
    bare = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    res = _run([bin_ / "dvc", "--version"], ws, bare)
    assert res.stderr == "", res.stderr


def test_only_a_scalelab_project_with_params_is_checked(tmp_path, monkeypatch):
    """No params.yaml, or a DVC project that is not scalelab's: the hook checks nothing, whatever its params say."""
    (tmp_path / ".dvc").mkdir()
    monkeypatch.chdir(tmp_path)
    assert interpreter.dvc_refusal(["repro", "-s", "prepare"]) is None
    (tmp_path / "params.yaml").write_text("prepare: {val_fractoin: 0.1}\n")
    (tmp_path / "dvc.yaml").write_text("stages:\n  train: {cmd: python train.py}\n")
    assert interpreter.dvc_refusal(["repro", "-s", "train"]) is None
    (tmp_path / "dvc.yaml").write_text("stages:\n  validate: {cmd: python -m scalelab.pipeline.check --stage}\n")
    refusal = interpreter.dvc_refusal(["repro", "-s", "validate"])
    assert refusal is not None and refusal[0] == 2 and "prepare.val_fractoin: unknown key" in refusal[1], refusal
    assert interpreter.dvc_refusal(["status"]) is None and interpreter.dvc_refusal(["repro", "--help"]) is None


@pytest.mark.slow
def test_prepare_hashes_to_its_data_alone(built):
    """Two runs of prepare on the same params: a new MLflow run each time, the same out hash in dvc.lock (the run's
    pointer, mlflow_run.json, is outside DVC's hash), and the pointer names the store relative to the project."""
    ws, env, bin_ = built
    hashes, pointers = [], []
    for _ in range(2):
        _run([bin_ / "dvc", "repro", "-f", "-s", "prepare"], ws, env)
        lock = yamlio.safe_load((ws / "dvc.lock").read_text())
        hashes.append({o["path"]: o["md5"] for o in lock["stages"]["prepare"]["outs"]})
        pointers.append(json.loads((ws / "data/prepared/mlflow_run.json").read_text()))
    assert pointers[0]["run_id"] and pointers[1]["run_id"] and pointers[0]["run_id"] != pointers[1]["run_id"]
    assert hashes[0] == hashes[1], f"data/prepared's hash changed with its mlflow_run.json: {hashes}"
    assert {p["tracking_uri"] for p in pointers} == {"sqlite:///mlflow.db"}, pointers
    assert str(ws) not in (ws / "data/prepared/mlflow_run.json").read_text()


def test_the_installed_hook_is_the_one_this_code_writes():
    """`make setup` must be rerun when the hook's line changes: this venv's (when it has one) is the current one."""
    import sysconfig

    installed = Path(sysconfig.get_paths()["purelib"]) / interpreter.PTH_NAME
    if sys.prefix == sys.base_prefix or not installed.is_file():
        pytest.skip("not a venv with the hook installed")
    assert installed.read_text() == interpreter.PTH_LINE, "the venv's hook is stale: run `make setup`"

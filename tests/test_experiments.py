"""`dvc exp run` on the micro profile: a workspace experiment (-S), a queue of two run by
`dvc queue start -j 2`, and a `--temp` one all log to the project's MLflow store (the queued and temp ones run in a
copy under .dvc/tmp/exps that DVC deletes), each under a parent run of its own params, and `dvc exp show` lists their
metrics. The environment is a user's shell: no SCALELAB_ROOT, no MLFLOW_TRACKING_URI; scalelab resolves both."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mutants import mutant, mutation_checks
from workspace import copy_workspace, seed_mlflow_store

import scalelab
from scalelab.runtime import yamlio

pytestmark = pytest.mark.slow
DVC = [sys.executable, "-m", "dvc"]
CELL, METRICS = "pretrain@standard-a-0", "metrics/pretrain/standard-a-base-0.json"
STEPS = {"ws-exp": 6, "q-one": 8, "q-two": 10, "tmp-exp": 4}  # experiment name -> pretrain.max_steps


def _run(cmd, cwd, env):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout


def _exp_refs(ws, env) -> int:
    """How many experiments DVC has saved (a ref under refs/exps each): a git call of milliseconds, where a
    `dvc queue status` costs about a CPU second, and the queue's two runs take minutes."""
    return len(_run(["git", "for-each-ref", "refs/exps"], ws, env).splitlines())


def _queue_drained(ws, env, saved, timeout=600.0):
    """Wait until both queued experiments ended, then stop DVC's workers and wait until they are gone (an idle one
    is meant to exit 10 s after the queue empties, but under load one was seen idle for minutes). `dvc queue status`
    is asked every 2 s once `saved` experiments have their refs (a failed one has none: then every 15 s)."""
    deadline, stopped, asked = time.monotonic() + timeout, False, -math.inf
    while time.monotonic() < deadline:
        if not (stopped or _exp_refs(ws, env) >= saved) and time.monotonic() - asked < 15:
            time.sleep(0.5)
            continue
        asked, out = time.monotonic(), _run(DVC + ["queue", "status"], ws, env)
        if "0 active, 0 idle" in out and not any(s in out for s in ("Queued", "Running")):
            return out
        if not stopped and out.count("Success") + out.count("Failed") == 2:
            _run(DVC + ["queue", "stop"], ws, env)  # after their tasks, which have all ended
            stopped = True
        time.sleep(2)
    raise AssertionError(f"queue not drained in {timeout:.0f} s:\n{out}")


@pytest.fixture(scope="module")
def experiments(tmp_path_factory, micro_build):
    """A committed baseline (the micro DAG, its pretrain cell last run by a plain `dvc repro`) and the four experiments
    run from it."""
    ws = tmp_path_factory.mktemp("experiments") / "ws"
    # the micro DAG as built once per test run (conftest's micro_build), in a copy of this module's own; the baseline's
    # cell is run again by a plain `dvc repro`, as a user's baseline is, into an empty store: the store then holds its
    # run and the experiments' alone, each under the parent run of its own params (the flow's parent run has none)
    env = copy_workspace(micro_build.ws, ws)
    (ws / "mlflow.db").unlink()
    seed_mlflow_store(ws / "mlflow.db")
    for var in ("SCALELAB_ROOT", "MLFLOW_TRACKING_URI"):  # a user's shell: scalelab finds the root and the store
        env.pop(var)
    assert f"Running stage '{CELL}'" in _run(DVC + ["repro", "--force", "--single-item", CELL], ws, env)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    _run(["git", "add", "-A"], ws, env)
    _run(git + ["commit", "-qm", "baseline"], ws, env)
    baseline = _run(["git", "rev-parse", "HEAD"], ws, env).strip()
    exp = DVC + ["exp", "run", CELL]
    _run(exp + ["-n", "ws-exp", "-S", f"pretrain.max_steps={STEPS['ws-exp']}"], ws, env)
    for name in ("q-one", "q-two"):
        _run(exp + ["--queue", "-n", name, "-S", f"pretrain.max_steps={STEPS[name]}"], ws, env)
    _run(DVC + ["queue", "start", "-j", "2"], ws, env)
    _run(exp + ["--temp", "-n", "tmp-exp", "-S", f"pretrain.max_steps={STEPS['tmp-exp']}"], ws, env)
    status = _queue_drained(ws, env, saved=len(STEPS))  # ws-exp and tmp-exp saved already, the queue's two to come
    assert status.count("Success") == 2, status
    return ws, env, baseline


def _cell_runs(ws):
    client = MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    exp = client.get_experiment_by_name(yamlio.safe_load((ws / "params.yaml").read_text())["tracking"]["experiment"])
    return client, client.search_runs([exp.experiment_id], f"tags.`dvc.stage` = '{CELL}'")


def test_every_experiment_logs_to_the_project_store(experiments):
    ws, env, _ = experiments
    client, runs = _cell_runs(ws)
    by_steps = {int(r.data.params["pretrain.max_steps"]): r for r in runs}
    # the baseline's run and one per experiment, each finished, in the repo's own store (the temp copies are gone)
    assert set(by_steps) == {12, *STEPS.values()} and len(runs) == len(by_steps)
    assert all(r.info.status == "FINISHED" for r in runs)
    assert not list((ws / ".dvc" / "tmp").rglob("mlflow.db"))
    # each run nests under the parent run of its own params (the pipeline key hashes the params it ran with):
    # an experiment is not filed under the baseline's repro
    parents = {steps: r.data.tags["mlflow.parentRunId"] for steps, r in by_steps.items()}
    assert len(set(parents.values())) == len(parents)
    for steps, parent in parents.items():
        assert client.get_run(parent).data.tags["scalelab.pipeline_key"]

    shown = json.loads(_run(DVC + ["exp", "show", "--json"], ws, env))
    exps = {e["name"]: e for base in shown for e in (base.get("experiments") or []) for e in e["revs"]}
    assert set(STEPS) <= set(exps)
    for name, steps in STEPS.items():
        data = exps[name]["data"]
        assert data["params"]["params.yaml"]["data"]["pretrain"]["max_steps"] == steps
        val_loss = data["metrics"][METRICS]["data"]["val_loss"]  # the same model in both: its final validation loss
        assert val_loss == pytest.approx(by_steps[steps].data.metrics["val/loss"], rel=1e-6)


def test_experiment_runs_are_tagged_with_name_and_baseline(experiments):
    ws, _, baseline = experiments
    _, runs = _cell_runs(ws)
    tagged = {r.data.tags.get("dvc.exp_name"): r for r in runs}
    assert set(STEPS) <= set(tagged)
    for name, steps in STEPS.items():
        assert tagged[name].data.tags["dvc.exp_baseline_rev"] == baseline
        assert int(tagged[name].data.params["pretrain.max_steps"]) == steps


def test_an_experiment_copy_reads_its_params_and_writes_the_repo_store(tmp_path, monkeypatch):
    """In <repo>/.dvc/tmp/exps/<tmp> with DVC_ROOT=<repo> (how DVC runs a queued or temp experiment's stages): the
    workspace is the copy, the store the repo's; the experiment's name and baseline become tags."""
    repo = tmp_path / "repo"
    copy = repo / ".dvc" / "tmp" / "exps" / "standalone" / "tmpab12"
    (copy / "src").mkdir(parents=True)
    for d in (repo, copy):
        (d / "params.yaml").write_text("seed: 0\n")
    for var in ("SCALELAB_ROOT", "MLFLOW_TRACKING_URI", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    env = {"DVC_ROOT": str(repo), "DVC_EXP_NAME": "lean-pike", "DVC_EXP_BASELINE_REV": "a" * 40}
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.chdir(copy / "src")
    scalelab.offline_defaults()
    assert (scalelab.project_root(), scalelab.store_root()) == (copy, repo)
    assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{repo / 'mlflow.db'}"
    assert os.environ["HF_HOME"] == str(repo / ".cache" / "huggingface")
    assert scalelab.experiment_tags() == {"dvc.exp_name": "lean-pike", "dvc.exp_baseline_rev": "a" * 40}
    monkeypatch.chdir(repo)  # the repo itself (a workspace experiment, a plain repro): its own workspace and store
    assert scalelab.project_root() == scalelab.store_root() == repo
    monkeypatch.delenv("DVC_EXP_NAME")
    monkeypatch.delenv("DVC_EXP_BASELINE_REV")
    assert scalelab.experiment_tags() == {}


@mutant("exp-store-in-copy")
def _(monkeypatch):  # the store follows the workspace: a temp experiment's runs land in the copy DVC deletes
    monkeypatch.setattr(scalelab, "store_root", scalelab.project_root)


@mutant("exp-workspace-is-repo")
def _(monkeypatch):  # DVC_ROOT taken as the workspace: an experiment copy's stages read the repo's params and data
    real = scalelab.project_root
    monkeypatch.setattr(scalelab, "project_root",
                        lambda: Path(os.environ["DVC_ROOT"]).resolve() if "DVC_ROOT" in os.environ else real())


test_mutants_are_caught = mutation_checks([
    ("exp-store-in-copy", "tests/test_experiments.py::test_an_experiment_copy_reads_its_params_and_writes_the_repo_store"),
    ("exp-workspace-is-repo",
     "tests/test_experiments.py::test_an_experiment_copy_reads_its_params_and_writes_the_repo_store"),
])

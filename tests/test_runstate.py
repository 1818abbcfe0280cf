"""Run states stay true under concurrency and kills: every run ends in the state its process gave it.

Many tiny cells run at once against one sqlite store, each a stage run with nested runs (as an optimizer cell's LR
runs: `nested_under`) that ends normally, fails with an exception (FAILED) or is killed with SIGKILL (RUNNING, then
KILLED at a later contact's sweep). Most are forked from this process, which has imported MLflow and scalelab as the
warm server (scalelab.pipeline.warm) has; a few are real interpreter starts. Every cell opens the store, so every cell sweeps
while the others are writing: the race of a sweep closing a concurrent cell's FINISHED runs is exercised
hundreds of times. Each cell reports its run ids as it opens them; the test compares every run's terminal state
with what its cell's exit status says it must be.
"""

import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mutants import assert_caught
from test_orphans import old_sweep  # noqa: F401  (registers the mutant "sweep-stale-search": the old sweep)
from test_tracking import db, project  # noqa: F401  (fixtures: a shared sqlite store, a project root per test)

from scalelab import tracking
from scalelab.runtime import yamlio

# One cell: its run, a nested run that ends FINISHED, a second nested run that ends as the cell's kind says.
# Source text, so the cold cells run exactly what the forked ones run.
CELL = '''
import os, signal
from scalelab import tracking

def cell(i, kind, experiment, report):
    """Exit status of the cell: 0 ok, 1 failed; a killed cell never returns."""
    def opened(role, run):
        with open(report, "a") as f:
            f.write(f"{role} {run.run_id}\\n")
    try:
        with tracking.stage_run(f"cell@{i}", params={"i": i}, experiment=experiment) as run, \\
                tracking.nested_under(run):
            opened("cell", run)
            for j in range(2):
                with tracking.stage_run(f"cell@{i} lr{j}", params={"j": j}, experiment=experiment) as lr:
                    opened(f"lr{j}", lr)
                    lr.log_metrics({"loss": 1.0 / (j + 1)}, step=j)
                    if j == 1 and kind == "fail":
                        raise ValueError("a failing cell")
                    if j == 1 and kind == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)  # kill -9: nothing below runs
            run.log_metrics({"best": 0.5})
    except ValueError:
        return 1
    return 0
'''
_ns: dict = {}
exec(CELL, _ns)
cell = _ns["cell"]

KINDS = ("ok", "ok", "fail", "kill")  # cell i is KINDS[i % 4]
EXIT = {"ok": 0, "fail": 1, "kill": -signal.SIGKILL}
STATES = {"ok": {"cell": "FINISHED", "lr0": "FINISHED", "lr1": "FINISHED"},
          "fail": {"cell": "FAILED", "lr0": "FINISHED", "lr1": "FAILED"},
          "kill": {"cell": "KILLED", "lr0": "FINISHED", "lr1": "KILLED"}}
ROUNDS, PER_ROUND, AT_ONCE = 3, 68, 16  # 204 forked cells, 16 running at any time
COLD = ("ok", "kill")  # real interpreter starts, in the first round


def _fork(i: int, kind: str, exp: str, report: Path) -> int:
    pid = os.fork()
    if pid == 0:  # the cell: never returns into pytest
        code = 70
        try:
            for engine in SqlAlchemyStore._engine_map.values():  # the parent's pooled sqlite connections stay its own
                engine.dispose(close=False)
            warnings.simplefilter("error", RuntimeWarning)  # tracking's warnings (a sweep given up, the store lost)
            code = cell(i, kind, exp, str(report))              # end the cell with 70: a failure of the check
        finally:
            os._exit(code)
    return pid


def _cold(i: int, kind: str, exp: str, report: Path) -> int:
    """A cell in a fresh interpreter (its pid: reaped with the forked ones)."""
    code = f"{CELL}\nimport sys\nsys.exit(cell({i}, {kind!r}, {exp!r}, {str(report)!r}))\n"
    argv = [sys.executable, "-W", "error::RuntimeWarning", "-c", code]  # as the forked cells: a warning fails it
    return os.posix_spawn(sys.executable, argv, dict(os.environ))


def _exit_status(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _round(first: int, exp: str, reports: Path, cold: tuple[str, ...]) -> dict[int, tuple[str, int]]:
    """Run cells first..first+PER_ROUND (AT_ONCE at a time, plus the cold ones): {cell: (kind, exit status)}."""
    todo, running, done = list(range(first, first + PER_ROUND)), {}, {}
    for k, kind in enumerate(cold):
        i = first + PER_ROUND + k
        running[_cold(i, kind, exp, reports / f"{i}")] = (i, kind)
    while todo or running:
        while todo and len(running) < AT_ONCE + len(cold):
            i = todo.pop(0)
            running[_fork(i, KINDS[i % len(KINDS)], exp, reports / f"{i}")] = (i, KINDS[i % len(KINDS)])
        pid, status = os.wait()
        if pid in running:
            i, kind = running.pop(pid)
            done[i] = (kind, _exit_status(status))
    return done


def _check(client: MlflowClient, done: dict, reports: Path) -> list[str]:
    """Every way a cell's runs differ from what its exit status says: one line each (empty: all true)."""
    wrong = []
    for i, (kind, code) in sorted(done.items()):
        if code != EXIT[kind]:
            wrong.append(f"cell {i} ({kind}) exited {code}")
            continue
        runs = dict(line.split() for line in (reports / f"{i}").read_text().splitlines())
        if set(runs) != set(STATES[kind]) or "None" in runs.values():
            wrong.append(f"cell {i} ({kind}): runs {runs} (tracking went down?)")
            continue
        for role, run_id in runs.items():
            if (got := client.get_run(run_id).info.status) != STATES[kind][role]:
                wrong.append(f"cell {i} ({kind}) {role}: {got}, not {STATES[kind][role]}")
    return wrong


def test_every_run_ends_in_the_state_its_cell_exited_with(project, monkeypatch):
    root, exp = project
    reports = root / "reports"
    reports.mkdir()
    tracking.git_commit()  # cached before the forks: no `git` per cell
    with tracking.pipeline_run("stress", experiment=exp) as parent:
        monkeypatch.setenv(tracking.PARENT_ENV, parent.run_id)
        client = MlflowClient(tracking.tracking_uri())
        # One cell here first: SQLAlchemy's statement cache is then filled once, not in each fork; gc.freeze keeps
        # the collector from touching (copying) the parent's pages in every child.
        cells = {-1: ("ok", cell(-1, "ok", exp, str(reports / "-1")))}
        gc.freeze()
        try:
            for r in range(ROUNDS):
                done = _round(r * (PER_ROUND + len(COLD)), exp, reports, COLD if r == 0 else ())
                tracking.store._connect(exp)  # a later contact: its sweep closes the killed cells' runs
                cells |= done
                wrong = _check(client, done, reports)
                assert not wrong, f"round {r}: {len(wrong)} wrong of {len(done)} cells:\n" + "\n".join(wrong[:20])
        finally:
            gc.unfreeze()
        wrong = _check(client, cells, reports)  # and no later round's sweep closed an earlier round's runs
        assert not wrong, f"{len(wrong)} wrong of {len(cells)} cells:\n" + "\n".join(wrong[:20])
        assert client.get_run(parent.run_id).info.status == "RUNNING"  # a live owner's run is never closed
    assert len(cells) >= 200 and {kind for kind, _ in cells.values()} == set(STATES)
    # every run of the experiment is the parent or a reported cell run: nothing opened that the check missed
    reported = {line.split()[1] for f in reports.iterdir() for line in f.read_text().splitlines()}
    every = {r.info.run_id for r in client.search_runs([parent.experiment_id], max_results=5000)}
    assert every == reported | {parent.run_id}


@pytest.mark.mutation
def test_the_old_sweep_is_caught():
    """The sweep of b2d4a37 (no re-read after the owner is seen dead) closes some concurrent cells' runs KILLED."""
    assert_caught("tests/test_runstate.py::test_every_run_ends_in_the_state_its_cell_exited_with",
                  "sweep-stale-search")


# ---------------------------------------------------------------- FINISHED means done
# stages/pretrain.py, run as DVC runs it, with its Hugging Face export replaced by a rendezvous: it writes the barrier
# file (its first argument) and waits there to be killed. fit has returned; the export and metrics are not written.
BLOCKED_EXPORT = """
import runpy, sys, time
from pathlib import Path
import scalelab.model.export as export

barrier = Path(sys.argv.pop(1))

def export_cell(*args, **kwargs):
    barrier.write_text("fit returned")
    time.sleep(600)

export.export_cell = export_cell
sys.argv[0] = {stage!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_stage_killed_after_fit_is_never_finished(tmp_path, monkeypatch):
    """Killed between `fit` and the export, a pretrain cell's run is RUNNING (Lightning's finalize, which marked it
    FINISHED right after fit, writes no state now), then KILLED at the next contact; its metrics do not exist."""
    import yaml
    from conftest import FAST_TMP, MICRO, ROOT
    from test_train import make_shards

    raw = yamlio.safe_load(MICRO.read_text())
    raw["pretrain"].update(max_steps=2, val_every=2, ckpt_every=2, gamma_every=2)
    raw["pretrain"]["sharpness"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    make_shards(tmp_path / "data" / "tokens", n_train=2000, n_val=2100)
    (tmp_path / "data" / "tokenizer").mkdir()
    (tmp_path / "data" / "tokenizer" / "tokenizer.json").write_text("{}")  # checked for; read only by the export
    store = Path(tempfile.mkdtemp(dir=FAST_TMP))
    monkeypatch.setenv("SCALELAB_ROOT", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    for var in (tracking.PARENT_ENV, tracking.FLOW_RUN_ENV, tracking.RUN_ENV, "DVC_STAGE"):
        monkeypatch.delenv(var, raising=False)
    barrier = tmp_path / "fit-returned"
    code = BLOCKED_EXPORT.format(stage=str(ROOT / "stages" / "pretrain.py"))
    cmd = [sys.executable, "-c", code, str(barrier), "--variant", "standard", "--size", "a", "--recipe", "base",
           "--seed", "0"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=dict(os.environ))
    try:
        while not barrier.exists() and proc.poll() is None:  # the rendezvous: the stage is past fit
            time.sleep(0.1)
        assert barrier.exists(), f"the stage exited {proc.returncode} before its export"
        client = MlflowClient(tracking.tracking_uri())
        exp = client.get_experiment_by_name(raw["tracking"]["experiment"])
        (run,) = client.search_runs([exp.experiment_id], "tags.`dvc.stage` = 'pretrain@standard-a-0'")
        assert run.info.status == "RUNNING"  # fit returned, nothing of the stage's outs written: not FINISHED
    finally:
        proc.kill()
        proc.wait()
    assert not (tmp_path / "metrics" / "pretrain" / "standard-a-base-0.json").exists()
    tracking.store._connect(raw["tracking"]["experiment"])  # the next contact
    assert client.get_run(run.info.run_id).info.status == "KILLED"
    shutil.rmtree(store)

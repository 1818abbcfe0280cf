"""scalelab.tracking: parent/child runs, tags, params, resume, and tracking failures that never stop a stage."""

import hashlib
import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import FAST_TMP
from mlflow import MlflowClient
from mutants import assert_caught, mutant

from scalelab import tracking


@pytest.fixture(scope="module")
def db():
    # MLflow creates its schema with dozens of fsyncs: on tmpfs the store is ready several times faster
    folder = Path(tempfile.mkdtemp(dir=FAST_TMP))
    yield f"sqlite:///{folder / 'mlflow.db'}"
    shutil.rmtree(folder)


@pytest.fixture
def project(tmp_path, monkeypatch, db, request):
    """A project root with params.yaml, a shared sqlite store, one experiment per test, no flow in the env."""
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCALELAB_ROOT", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", db)
    for var in (tracking.PARENT_ENV, tracking.FLOW_RUN_ENV, tracking.RUN_ENV, "DVC_STAGE"):
        monkeypatch.delenv(var, raising=False)
    tracking.git_commit.cache_clear()
    return tmp_path, request.node.name


def run(run_id):
    return MlflowClient(tracking.tracking_uri()).get_run(run_id)


def test_child_nested_under_repro_parent_with_tags_and_flat_params(project):
    root, exp = project
    (root / "dep").mkdir()
    (root / "dep" / "x.bin").write_bytes(b"abc")
    params = {"model": {"d_model": 64, "sizes": [1, 2]}, "name": "x" * 7000}
    with tracking.stage_run("pretrain@standard-s-0", params=params, experiment=exp, deps=["dep"]) as r1:
        r1.log_metrics({"loss": 2.5, "bad key!": 1, "note": "text"}, step=3)
    with tracking.stage_run("evaluate", params={}, experiment=exp) as r2:
        pass
    c1, c2 = run(r1.run_id), run(r2.run_id)
    parent = c1.data.tags["mlflow.parentRunId"]
    assert tracking.parent_run_id(exp) == parent
    assert c2.data.tags["mlflow.parentRunId"] == parent  # same commit + params.yaml: one parent per repro
    assert run(parent).data.tags["scalelab.pipeline_key"] == tracking.pipeline_key()
    assert run(parent).info.status == "FINISHED" and c1.info.status == "FINISHED"
    assert c1.info.run_name == c1.data.tags["dvc.stage"] == "pretrain@standard-s-0"
    assert c1.data.tags["git.commit"] == "nogit"
    assert c1.data.tags["scalelab.deps_hash"] == tracking.deps_hash(params, ["dep"])
    assert c1.data.params["model.d_model"] == "64" and c1.data.params["model.sizes"] == "[1, 2]"
    assert len(c1.data.params["name"]) == tracking.MAX_PARAM
    assert c1.data.metrics == {"loss": 2.5, "bad key_": 1.0}
    (root / "params.yaml").write_text("seed: 1\n")  # new params: a new pipeline execution
    with tracking.stage_run("evaluate", params={}, experiment=exp) as r3:
        pass
    assert run(r3.run_id).data.tags["mlflow.parentRunId"] != parent


def test_flow_parent_from_env_and_batches_over_mlflow_limits(project, monkeypatch):
    _, exp = project
    with tracking.pipeline_run("pipeline test", experiment=exp) as parent:
        monkeypatch.setenv(tracking.PARENT_ENV, parent.run_id)
        monkeypatch.setenv(tracking.FLOW_RUN_ENV, "flow-123")
        params = {f"p{i}": i for i in range(250)}  # > 100 params per log_batch
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a rejected batch would warn
            with tracking.stage_run("tokenize", params=params, experiment=exp) as child:
                child.log_metrics({f"m{i}": i for i in range(1500)}, step=1)  # > 1000 metrics per log_batch
        assert run(parent.run_id).info.status == "RUNNING"  # the flow owns its parent's status
    c = run(child.run_id)
    assert c.data.tags["mlflow.parentRunId"] == parent.run_id and c.data.tags["prefect.flow_run_id"] == "flow-123"
    assert len(c.data.params) == 250 and len(c.data.metrics) == 1500
    assert run(parent.run_id).info.status == "FINISHED"
    assert [(k["stage"], k["run_id"]) for k in tracking.child_runs(parent.run_id)] == [("tokenize", child.run_id)]


def test_reopen_by_run_id_continues_the_run(project):
    _, exp = project
    with tracking.stage_run("pretrain@a", params={"lr": 1}, experiment=exp) as first:
        first.log_metrics({"loss": 3.0}, step=10)
    with tracking.stage_run("pretrain@a", params={"lr": 1}, experiment=exp, run_id=first.run_id) as again:
        again.log_metrics({"loss": 2.0}, step=20)
    assert again.run_id == first.run_id
    history = MlflowClient(tracking.tracking_uri()).get_metric_history(first.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(10, 3.0), (20, 2.0)]
    assert run(first.run_id).info.status == "FINISHED"


def test_a_reopened_run_and_parent_are_owned_before_they_are_running(project, monkeypatch):
    """A resume's run and a repro parent taken by the next stage become RUNNING only once this process is their
    owner (scalelab.tracking.orphans' rule): a sweep in between never sees them RUNNING under the process that left them."""
    from scalelab.tracking import orphans

    _, exp = project
    with tracking.stage_run("pretrain@r", params={}, experiment=exp) as first:
        pass
    seen = []

    class Watched(MlflowClient):
        def update_run(self, run_id, status=None, *args, **kwargs):
            if status == "RUNNING":
                seen.append((run_id, self.get_run(run_id).data.tags[orphans.OWNER_TAG]))
            return super().update_run(run_id, status, *args, **kwargs)

    monkeypatch.setattr(tracking.store, "MlflowClient", Watched)
    monkeypatch.setattr(orphans, "owner", lambda: "host:1:resumer")  # another process than the first stage's
    with tracking.stage_run("pretrain@r", params={}, experiment=exp, run_id=first.run_id) as again:
        assert run(again.run_id).data.tags[orphans.OWNER_TAG] == "host:1:resumer"
    assert sorted(seen) == sorted([(first.parent_id, "host:1:resumer"), (first.run_id, "host:1:resumer")])


@mutant("open-running-before-owner")
def _(monkeypatch):
    from scalelab.tracking import orphans

    def claim(client, run_id):  # b2d4a37's order in StageRun._open: status first, the new owner after
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, orphans.OWNER_TAG, orphans.owner())

    monkeypatch.setattr(orphans, "claim", claim)


def test_body_raising_marks_failed_and_reraises(project):
    _, exp = project
    with pytest.raises(ZeroDivisionError):
        with tracking.stage_run("compress@x", params={}, experiment=exp) as r:
            1 / 0
    assert run(r.run_id).info.status == "FAILED"
    assert run(run(r.run_id).data.tags["mlflow.parentRunId"]).info.status == "FAILED"


@pytest.mark.parametrize("uri", ["http://127.0.0.1:9", "nosuchscheme://x"])
def test_unreachable_tracking_warns_and_the_stage_finishes(project, monkeypatch, uri):
    root, exp = project
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ran, start = False, time.monotonic()
    with pytest.warns(RuntimeWarning, match="tracking unavailable") as caught:
        with tracking.stage_run("prepare", params={"a": 1}, experiment=exp) as r:
            r.log_params({"b": 2})
            r.log_metrics({"loss": 1.0})
            r.set_tags({"t": 1})
            ran = True
            r.record(root / "out")
    assert ran and r.run_id is None and r.lightning_logger() is None
    assert len(caught) == 1  # once, not a flood
    assert time.monotonic() - start < 20
    assert json.loads((root / "out" / "mlflow_run.json").read_text())["run_id"] is None


def test_failure_mid_run_warns_once_and_logging_becomes_a_noop(project):
    _, exp = project
    with tracking.stage_run("pretrain@b", params={}, experiment=exp) as r:
        def down(*args, **kwargs):
            raise ConnectionError("server gone")

        r._client.log_batch = down
        with pytest.warns(RuntimeWarning, match="server gone") as caught:
            for step in range(5):
                r.log_metrics({"loss": 1.0}, step=step)
    assert len(caught) == 1


def test_record_and_lightning_logger_bound_to_the_run(project):
    root, exp = project
    with tracking.stage_run("pretrain@c", params={}, experiment=exp) as r:
        path = r.record(root / "model")
        logger = r.lightning_logger()
    assert json.loads(path.read_text()) == {
        "run_id": r.run_id,
        "experiment_id": r.experiment_id,
        "tracking_uri": tracking.tracking_uri(),
    }
    assert logger.run_id == r.run_id and logger._tracking_uri == tracking.tracking_uri()


def test_deps_hash_follows_content_and_params(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("1")
    base = tracking.deps_hash({"x": 1}, [tmp_path / "d"])
    assert tracking.deps_hash({"x": 1}, [tmp_path / "d"]) == base
    assert tracking.deps_hash({"x": 2}, [tmp_path / "d"]) != base
    (tmp_path / "d" / "a.txt").write_text("2")
    assert tracking.deps_hash({"x": 1}, [tmp_path / "d"]) != base


def test_lightning_logger_survives_an_outage_mid_training(project):
    """A tracking failure never stops training (docs/reliability.md); the logger warns once, then stays quiet."""
    from mlflow.entities import Metric

    root, exp = project
    with tracking.stage_run("pretrain@x", params={}, experiment=exp) as r:
        logger = r.lightning_logger()
        logger.log_batch([Metric("loss", 3.0, 0, 1)])
        assert run(r.run_id).data.metrics["loss"] == 3.0

        def gone(*args, **kwargs):
            raise ConnectionError("server gone")

        logger.experiment.log_batch = logger.experiment.log_metric = gone
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # every warning recorded, none folded by the once-per-place filter
            logger.log_batch([Metric("loss", 2.0, 0, 2)])
            logger.log_metrics({"loss": 1.0}, step=3)  # no second warning, no exception
            logger.log_hyperparams({"lr": 1})
            logger.finalize("success")
        down = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(down) == 1 and "unavailable" in down[0] and "server gone" in down[0], down


def test_lightning_finalize_leaves_the_terminal_state_to_the_stage(project):
    """Lightning's finalize, right after fit, once marked the run FINISHED before the stage's export and
    metrics existed; the stage's exit is the only writer of a terminal state."""
    _, exp = project
    with tracking.stage_run("pretrain@f", params={}, experiment=exp) as r:
        logger = r.lightning_logger()
        logger.log_metrics({"loss": 1.0}, step=1)
        logger.finalize("success")  # what Trainer.fit does as it returns
        assert run(r.run_id).info.status == "RUNNING"
    assert run(r.run_id).info.status == "FINISHED"


def _token_shards(folder: Path) -> Path:
    """A tokenize stage's out: two uint16 shards and their meta.json."""
    folder.mkdir()
    shards = {}
    for split, n in (("train", 300), ("val", 40)):
        path = folder / f"{split}.bin"
        np.arange(n, dtype=np.uint16).tofile(path)
        shards[split] = {"file": path.name, "tokens": n, "bytes": 2 * n,
                         "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    (folder / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 512, "shards": shards}))
    return folder / "meta.json"


def test_token_shards_are_the_runs_dataset_inputs(project):
    """The Dataset column: each split of a token-shard dep is an mlflow.data dataset named <folder>/<split>, its
    digest the shard's sha256 (a re-tokenized corpus is another dataset), its profile the shard's tokens and bytes,
    its source the shard's path, its context training or validation."""
    root, exp = project
    meta = _token_shards(root / "tokens")
    with tracking.stage_run("pretrain@d", params={}, experiment=exp, deps=[meta, root / "params.yaml"]) as r:
        pass
    inputs = {d.dataset.name: d for d in run(r.run_id).inputs.dataset_inputs}
    shards = json.loads(meta.read_text())["shards"]
    assert set(inputs) == {"tokens/train", "tokens/val"}
    for split, context in (("train", "training"), ("val", "validation")):
        d, shard = inputs[f"tokens/{split}"], shards[split]
        assert d.dataset.digest == shard["sha256"][:16]
        profile = json.loads(d.dataset.profile)
        assert (profile["features_size"], profile["features_nbytes"]) == (shard["tokens"], shard["bytes"])
        assert json.loads(d.dataset.source) == {"uri": str(root / "tokens" / shard["file"])}
        assert {t.key: t.value for t in d.tags} == {"mlflow.data.context": context}


def test_a_resumed_run_continues_its_system_metric_steps(project, monkeypatch):
    """A reopened run (a resumed cell) logs its system metrics after the steps it holds, as mlflow.start_run does
    for an existing run, instead of logging step 0 again; MLflow's switch turns the sampler off."""
    _, exp = project
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.05")  # MLflow's own knob, honoured
    run_id = None
    for _ in range(2):
        with tracking.stage_run("pretrain@s", params={}, experiment=exp, run_id=run_id) as r:
            r.lightning_logger()
            start, deadline = r._system._logging_step, time.monotonic() + 120
            while r._system._logging_step < start + 2 and time.monotonic() < deadline:  # two samples published
                time.sleep(0.02)
        run_id = r.run_id
    steps = [m.step for m in MlflowClient(tracking.tracking_uri()).get_metric_history(
        run_id, "system/cpu_utilization_percentage")]
    assert len(steps) >= 4 and len(set(steps)) == len(steps), steps
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
    assert tracking.dashboard.system_metrics(run_id, tracking.tracking_uri()) is None


@mutant("datasets-digest-by-mlflow")
def _(monkeypatch):  # the digest MLflow computes from a sample of the array, not the shard's sha256
    from mlflow.data.numpy_dataset import from_numpy

    monkeypatch.setattr(tracking.dashboard, "from_numpy",
                        lambda features, source, name, digest: from_numpy(features, source=source, name=name))


@mutant("system-metrics-restart-at-zero")
def _(monkeypatch):  # what the sampler does without resume_logging: a reopened run logs from step 0 again
    from mlflow.system_metrics import system_metrics_monitor as smm

    init = smm.SystemMetricsMonitor.__init__
    monkeypatch.setattr(smm.SystemMetricsMonitor, "__init__",
                        lambda self, run_id, **kw: init(self, run_id, **{**kw, "resume_logging": False}))


@mutant("logger-warns-every-time")
def _(monkeypatch):
    cls = tracking.runs._safe_logger_class()

    def _safe(self, fn, *args):
        try:
            fn(*args)
        except Exception as err:
            tracking.runs._warn_down(err)

    monkeypatch.setattr(cls, "_safe", _safe)


@mutant("logger-finalize-terminates")
def _(monkeypatch):
    cls = tracking.runs._safe_logger_class()
    monkeypatch.setattr(cls, "finalize", lambda self, status="success": self._safe(super(cls, self).finalize, status))


@pytest.mark.mutation
@pytest.mark.parametrize("test,name", [
    ("test_lightning_logger_survives_an_outage_mid_training", "logger-warns-every-time"),
    ("test_lightning_finalize_leaves_the_terminal_state_to_the_stage", "logger-finalize-terminates"),
    ("test_a_reopened_run_and_parent_are_owned_before_they_are_running", "open-running-before-owner"),
    ("test_token_shards_are_the_runs_dataset_inputs", "datasets-digest-by-mlflow"),
    ("test_a_resumed_run_continues_its_system_metric_steps", "system-metrics-restart-at-zero"),
])
def test_mutants_are_caught(test, name):
    assert_caught(f"tests/test_tracking.py::{test}", name)


def test_artifact_into_the_parent_run(project):
    root, exp = project
    (root / "scaling.png").write_bytes(b"png")
    with tracking.stage_run("scaling", params={}, experiment=exp) as r:
        r.log_artifact(root / "scaling.png", parent=True)
    client = MlflowClient(tracking.tracking_uri())
    assert [a.path for a in client.list_artifacts(r.parent_id)] == ["scaling.png"]
    assert client.list_artifacts(r.run_id) == []


def _create_store_then_kill(db: Path, delay: float | None) -> float:
    """Fork a process that creates the store at `db` (tracking._connect: a mutant applies to it) and SIGKILL it `delay`
    s after a new file appears there. Returns, with `delay` None, the time from that file's appearance to the
    creator's exit; else 1.0 if the kill landed before the creator finished, 0.0 if not."""
    import os
    import signal

    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the creator
        try:
            tracking.store._connect("scalelab")
        finally:
            os._exit(0)
    while not any(db.parent.iterdir()):
        assert time.monotonic() - start < 120, "no store file appeared"
        time.sleep(0.001)
    appeared = time.monotonic()
    if delay is None:
        os.waitpid(pid, 0)
        return time.monotonic() - appeared
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    return float(os.WIFSIGNALED(os.waitpid(pid, 0)[1]))


def test_a_process_killed_while_creating_the_store_leaves_none_or_a_whole_one(tmp_path, monkeypatch):
    """kill -9 while MLflow migrates a new sqlite store: the next process opens the store, never a half-migrated file
    ('table ... already exists': seen in about 4 of 10 such kills when the store was created in place). Kills spread
    over one creation's time, each into a fresh folder."""
    import os

    base = Path(FAST_TMP or tmp_path) / f"killed-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("SCALELAB_ROOT", str(tmp_path))
    try:
        def at(name: str) -> Path:
            db = base / name / "mlflow.db"
            db.parent.mkdir(parents=True)
            monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
            return db

        # Kills spread over one measured creation's window; a kill that came too late (this creation ran faster than
        # the measured one: the machine's speed drifts, CI run 17) narrows the window and one more kill is tried.
        window, landed, tried = _create_store_then_kill(at("whole"), None), 0, 0
        while tried < 8 or (landed < 4 and tried < 24):
            tried += 1
            db = at(f"kill{tried}")
            hit = _create_store_then_kill(db, window * ((tried - 1) % 8 + 1) / 10)
            landed += hit
            window *= 1.0 if hit else 0.7
            assert MlflowClient(f"sqlite:///{db}").search_experiments(), tried  # opens, created anew if none was left
        assert landed >= 4, f"only {landed} of {tried} kills landed before the store was complete: nothing tested"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@mutant("store-created-in-place")
def _(monkeypatch):  # the old way: MLflow migrates the new store at its final path
    monkeypatch.setattr(tracking.store, "_create_sqlite_store", lambda db: None)


@pytest.mark.mutation
def test_the_killed_store_creation_test_catches_an_in_place_store():
    assert_caught("tests/test_tracking.py::test_a_process_killed_while_creating_the_store_leaves_none_or_a_whole_one",
                  "store-created-in-place")


def test_a_dataset_row_created_meanwhile_by_another_cell_is_retried_once():
    """Two cells reading the same shards both insert the dataset row; the loser's UNIQUE failure (found by the Dask
    runner test: it turned tracking off for that cell, whose run then never ended) is retried once, anything else
    raises as before."""
    from mlflow.exceptions import MlflowException

    from scalelab.tracking import dashboard

    class Client:
        def __init__(self, errors):
            self.errors, self.calls = list(errors), 0

        def log_inputs(self, run_id, datasets=None, models=None):
            self.calls += 1
            if self.errors:
                raise self.errors.pop(0)

    raced = Client([MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.name")])
    dashboard.log_inputs(raced, "r", [], None)
    assert raced.calls == 2
    for errors in ([MlflowException("UNIQUE constraint failed")] * 2, [MlflowException("database is locked")]):
        with pytest.raises(MlflowException):
            dashboard.log_inputs(Client(errors), "r", [], None)

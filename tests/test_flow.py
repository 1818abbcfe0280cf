"""flows/pipeline.py on a tiny DVC project: a -> b -> c (matrix over x, y), stages tracked with stage_run; the cells
of c run concurrently and every invariant of a concurrent run holds."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import FAST_TMP
from mutants import assert_caught, mutant
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId, TaskRunFilter, TaskRunFilterFlowRunId,
)
from prefect.logging.handlers import APILogHandler

from scalelab.runtime import placement
from scalelab.runtime import yamlio


ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("scalelab_flow", ROOT / "flows" / "pipeline.py")
flow_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(flow_mod)
crash_spec = importlib.util.spec_from_file_location("flow_crash", ROOT / "benchmarks" / "flow_crash.py")
crash = importlib.util.module_from_spec(crash_spec)  # the flow's process tree: marked(), kill_tree()
crash_spec.loader.exec_module(crash)
DVC = [sys.executable, "-m", "dvc"]
STAGES = ["a", "b", "c@x", "c@y"]

# Each stage logs "<stage> <start> <end> <threads>"; the cells of c log their pid when they start, and with
# STAGE_BARRIER set each waits until the other has started (they ran at the same time, or the stage fails).
STAGE = """\
import os, sys, time
from pathlib import Path
import yaml
from scalelab import tracking

start = time.time()
name, dep, out = sys.argv[1:]
params = yaml.safe_load(open("params.yaml"))
if params.get("fail") == os.environ["DVC_STAGE"]:
    with open("attempts.log", "a") as f:
        f.write(os.environ["DVC_STAGE"] + "\\n")
    print("failing on purpose", file=sys.stderr)
    sys.exit(int(os.environ.get("STAGE_EXIT", "1")))
with tracking.stage_run(os.environ["DVC_STAGE"], params=params, deps=[dep] if dep != "-" else []) as run:
    text = (Path(dep).read_text() if dep != "-" else "") + f"{name}={params['value'][name]};"
    if name in ("x", "y"):
        with open("started.log", "a") as f:
            f.write(f"{os.environ['DVC_STAGE']} {os.getpid()}\\n")
        if barrier := os.environ.get("STAGE_BARRIER"):  # a rendezvous: this cell waits until the other one runs
            Path(barrier, name).touch()
            other = Path(barrier, "y" if name == "x" else "x")
            deadline = time.monotonic() + 120
            while not other.exists():
                if time.monotonic() > deadline:  # (a retry would find the other's file: the test looks for this)
                    Path(barrier, name + ".timeout").touch()
                    sys.exit(f"{name}: the other cell never started while this one ran")
                time.sleep(0.05)
        time.sleep(float(os.environ.get("STAGE_SLEEP", "0")))
    Path(out).write_text(text)
    run.record(Path(out).stem + "_run")
with open("order.log", "a") as f:
    f.write(f"{os.environ['DVC_STAGE']} {start} {time.time()} {os.environ.get('SCALELAB_THREADS')}\\n")
"""

DVC_YAML = """\
stages:
  a:
    cmd: python stage.py a - a.txt
    deps: [stage.py]
    params: [value.a]
    outs: [a.txt, a_run]
  b:
    cmd: python stage.py b a.txt b.txt
    deps: [a.txt]
    params: [value.b, fail]
    outs: [b.txt, b_run]
  c:
    matrix:
      name: [x, y]
    cmd: python stage.py ${item.name} b.txt c_${item.name}.txt
    deps: [b.txt]
    params:
      - value.${item.name}
    outs:
      - c_${item.name}.txt
      - c_${item.name}_run
"""


def write_params(root: Path, x: int = 1, y: int = 1, fail: str = "none") -> None:
    (root / "params.yaml").write_text(f"value: {{a: 1, b: 1, x: {x}, y: {y}}}\nfail: {fail}\n")


def dvc(root: Path, *args: str) -> str:
    res = subprocess.run(DVC + list(args), cwd=root, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_harness):
    """The tiny project, after a first flow run with 2 workers; yields (root, results, flow run id)."""
    root = tmp_path_factory.mktemp("proj")
    sh = lambda *cmd: subprocess.run(cmd, cwd=root, check=True, capture_output=True)  # noqa: E731
    sh("git", "init", "-q")
    sh(*DVC, "init", "-q")
    sh(*DVC, "config", "core.check_update", "false")
    sh(*DVC, "config", "core.analytics", "false")
    (root / "stage.py").write_text(STAGE)
    (root / "dvc.yaml").write_text(DVC_YAML)
    write_params(root)
    # MLflow creates its schema with dozens of fsyncs: on tmpfs the store is ready several times faster
    fast_dir = Path(tempfile.mkdtemp(dir=FAST_TMP))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("SCALELAB_ROOT", str(root))
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{fast_dir / 'mlflow.db'}")
        for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID"):
            mp.delenv(var, raising=False)
        mp.setenv("STAGE_BARRIER", str(root / ".barrier"))
        (root / ".barrier").mkdir()
        state = flow_mod.pipeline(return_state=True, workers=2)
        mp.delenv("STAGE_BARRIER")
        yield root, state.result(), str(state.state_details.flow_run_id)
    shutil.rmtree(fast_dir)


def pipeline_artifact(flow_run_id: str):
    with get_client(sync_client=True) as client:
        flt = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        (artifact,) = [a for a in client.read_artifacts(artifact_filter=flt) if a.key == "scalelab-pipeline"]
    return artifact


def task_runs(flow_run_id: str) -> dict[str, str]:
    """Each task run of a flow run: its name -> its state's name."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(
            flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id])))
    return {r.name: r.state.name for r in runs}


def flow_logs(flow_run_id: str) -> list[str]:
    APILogHandler().flush()  # the API log worker sends in batches from its own thread: what is queued, sent first
    with get_client(sync_client=True) as client:
        return [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]


def runs(root: Path) -> list[tuple[str, float, float, str]]:
    rows = [line.split() for line in (root / "order.log").read_text().splitlines()]
    return [(stage, float(start), float(end), threads) for stage, start, end, threads in rows]


def test_first_run_builds_everything_cells_at_once(project):
    root, results, _ = project
    assert [r["status"] for r in results] == ["ran"] * 4
    spans = {stage: (start, end) for stage, start, end, _ in runs(root)}
    assert spans["a"][1] <= spans["b"][0] and spans["b"][1] <= min(spans["c@x"][0], spans["c@y"][0])
    # the two cells ran at the same time: each went on only once the other had started (the fixture's STAGE_BARRIER);
    # one at a time, the first would have timed out waiting
    assert sorted(p.name for p in (root / ".barrier").iterdir()) == ["x", "y"]
    assert (root / "c_x.txt").read_text() == "a=1;b=1;x=1;" and (root / "c_y.txt").exists()


def test_each_cell_gets_its_share_of_the_cores(project):
    root, _, _ = project
    expected = str(max(1, (os.cpu_count() or 1) // 2))
    assert {threads for *_, threads in runs(root)} == {expected}


def test_after_a_concurrent_run_dvc_lock_is_complete_and_status_clean(project):
    root, _, _ = project
    assert sorted(yamlio.safe_load((root / "dvc.lock").read_text())["stages"]) == STAGES
    assert "up to date" in dvc(root, "status")


def test_mlflow_parent_has_one_child_per_stage(project):
    root, _, flow_run_id = project
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("scalelab")
    found = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(found) - 1
    assert sorted(c.data.tags["dvc.stage"] for c in children) == STAGES
    assert all(c.data.tags["prefect.flow_run_id"] == flow_run_id and c.info.status == "FINISHED" for c in children)
    assert parent.info.status == "FINISHED"


def test_markdown_artifact_links_the_runs(project):
    root, _, flow_run_id = project
    artifact = pipeline_artifact(flow_run_id)
    assert artifact.type == "markdown"
    run_id = json.loads((root / "c_y_run" / "mlflow_run.json").read_text())["run_id"]
    assert "| `c@y` | ran |" in artifact.data and run_id in artifact.data


def test_second_run_reruns_nothing_and_shows_every_stage(project):
    root, _, _ = project
    before = {p: p.stat().st_mtime_ns for p in root.glob("*.txt")}
    state = flow_mod.pipeline(return_state=True, workers=2)
    assert [r["status"] for r in state.result()] == ["up to date"] * 4
    assert task_runs(str(state.state_details.flow_run_id)) == dict.fromkeys(STAGES, "Completed")
    assert {p: p.stat().st_mtime_ns for p in root.glob("*.txt")} == before
    assert "Running stage" not in dvc(root, "repro")  # nor does a plain dvc repro


def test_selecting_one_matrix_cell_runs_only_it(project):
    root, _, _ = project
    write_params(root, x=2, y=2)  # both cells are now stale
    results = flow_mod.pipeline(targets=["c@x"])
    assert {r["stage"]: r["status"] for r in results} == {"a": "up to date", "b": "up to date", "c@x": "ran"}
    assert (root / "c_x.txt").read_text().endswith("x=2;") and (root / "c_y.txt").read_text().endswith("y=1;")
    assert runs(root)[-1][0] == "c@x"


def test_the_status_of_some_stages_is_dvc_status_read_for_them(project):
    """What the flow reads after a run (the stages it ran, from one index) agrees with `dvc status` of the whole
    project; here after the selection above left c@y's changed params behind."""
    root, _, _ = project
    assert flow_mod.changed_stages(root) == {"c@y"}
    for only in (STAGES, ["c@x", "c@y"], ["a", "b", "c@x"]):
        assert flow_mod.changed_stages(root, only) == {"c@y"} & set(only)


def test_selection_rules(project):
    root, _, _ = project
    graph = flow_mod.stage_graph(root)
    assert flow_mod.select(graph, ["c"]) == ["a", "b", "c@x", "c@y"]
    assert flow_mod.select(graph, ["b"], downstream=True) == ["b", "c@x", "c@y"]
    with pytest.raises(ValueError, match="unknown stage 'nope'"):
        flow_mod.select(graph, ["nope"])


def test_a_stage_that_only_met_a_lock_is_retried(project, monkeypatch):
    """Another live process holds DVC's write lock on c@y's out: the task's first `dvc repro` fails on the lock, the
    holder then ends, and the retry runs the stage."""
    root, _, _ = project
    holder = subprocess.Popen(["sleep", "120"])
    rwlock = root / ".dvc" / "tmp" / "rwlock"
    rwlock.write_text(json.dumps({"write": {str(root / "c_y.txt"): {"pid": holder.pid, "cmd": "test holder"}}}))
    attempts, real_stream = [], flow_mod._stream

    def stream(cmd, cwd, env, stage, logger):
        returncode, outcome, tail = real_stream(cmd, cwd, env, stage, logger)
        if stage == "c@y":
            attempts.append(returncode)
            holder.kill()  # released after the first attempt; DVC drops a dead holder's entries by itself
            holder.wait()
        return returncode, outcome, tail

    monkeypatch.setattr(flow_mod, "_stream", stream)
    try:
        state = flow_mod.pipeline(targets=["c@y"], return_state=True)
    finally:
        holder.kill()
    assert {r["stage"]: r["status"] for r in state.result()}["c@y"] == "ran"
    assert attempts[0] != 0 and attempts[-1] == 0 and (root / "c_y.txt").read_text().endswith("y=2;")
    logs = flow_logs(str(state.state_details.flow_run_id))
    assert any("DVC lock held by another process; retrying" in m for m in logs)


def test_a_failed_stage_stops_what_depends_on_it(project, monkeypatch):
    """b exits 3 (a data error, scalelab.pipeline.stage.EXIT_DATA): deterministic, so one attempt although the task allows
    retries; the log and the task's state name the stage's own code, not DVC's 255; what needs b does not run."""
    root, _, _ = project
    assert flow_mod.retries_for("b") > 0
    monkeypatch.setenv("STAGE_EXIT", "3")
    write_params(root, fail="b")
    (root / "attempts.log").unlink(missing_ok=True)
    state = flow_mod.pipeline(return_state=True, workers=2)
    assert state.is_failed()
    assert _read(root / "attempts.log").split() == ["b"]  # one attempt
    flow_run_id = str(state.state_details.flow_run_id)
    logs = flow_logs(flow_run_id)
    assert any("b: exit 3, a data error: not retried" in m for m in logs), logs
    with get_client(sync_client=True) as client:
        (b,) = [r for r in client.read_task_runs(task_run_filter=TaskRunFilter(
            flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]))) if r.name == "b"]
    assert "exit 3 (data error: deterministic, not retried)" in b.state.message
    artifact = pipeline_artifact(flow_run_id)
    assert "| `b` | failed |" in artifact.data and "| `c@y` | not run |" in artifact.data
    assert task_runs(flow_run_id) == {"a": "Completed", "b": "Failed", "c@x": "NotReady", "c@y": "NotReady"}
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("scalelab")
    found = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
    assert [r.info.status for r in found] == ["FAILED"]  # the flow's parent run; b failed before opening a child


def test_a_params_key_dvc_cannot_find_is_tried_once(project, monkeypatch):
    """c@y's params key missing from params.yaml (as `evaluate.models.sigmascale-0.8`, which DVC reads as nested):
    DVC refuses before the command runs and exits 255 like a crash; its message makes it deterministic, so DVC runs
    once although the task allows retries (it ran 1 + retries times), and the task says why."""
    root, _, _ = project
    assert flow_mod.retries_for("c@y") > 0
    (root / "params.yaml").write_text("value: {a: 1, b: 1, x: 1}\nfail: none\n")  # no value.y
    attempts, real_stream = [], flow_mod._stream

    def stream(cmd, cwd, env, stage, logger):
        attempts.append(stage)
        return real_stream(cmd, cwd, env, stage, logger)

    monkeypatch.setattr(flow_mod, "_stream", stream)
    monkeypatch.setattr(flow_mod, "changed_stages", lambda root, only=None, repo=None: None)  # DVC's status fails on the same key
    try:
        state = flow_mod.pipeline(targets=["c@y"], return_state=True)
    finally:
        write_params(root)
    assert state.is_failed() and attempts.count("c@y") == 1, attempts
    with get_client(sync_client=True) as client:
        (c,) = [r for r in client.read_task_runs(task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(
            any_=[str(state.state_details.flow_run_id)]))) if r.name == "c@y"]
    assert "(params key DVC cannot find: deterministic, not retried)" in c.state.message, c.state.message


def test_only_crashes_and_locks_are_retried():
    """The retry rule on DVC's real message: the stage's exit code, not DVC's 255, decides."""
    from prefect.states import Failed

    tail = ["ERROR: failed to reproduce 'b': failed to run: python stage.py b a.txt b.txt, exited with 3"]
    assert flow_mod.stage_exit(255, tail) == 3 and flow_mod.stage_exit(255, ["ERROR: unexpected error"]) == 255
    verdict = {code: flow_mod.retryable(None, None, Failed(data=flow_mod.StageFailed("b", code, tail)))
               for code in (1, 2, 3, 4, 255, -9)}
    assert verdict == {1: True, 2: False, 3: False, 4: False, 255: True, -9: True}
    assert flow_mod.retryable(None, None, Failed(data=OSError("crash")))
    # DVC's own error before the command: its message decides, and only where no command ran
    missing = ["ERROR: failed to reproduce 'c@y': Parameters 'value.y' are missing from 'params.yaml'."]
    assert not flow_mod.retryable(None, None, Failed(data=flow_mod.StageFailed("c@y", 255, missing)))
    crashed = [*missing, "ERROR: failed to reproduce 'b': failed to run: python stage.py b a.txt b.txt, exited with 1"]
    assert flow_mod.retryable(None, None, Failed(data=flow_mod.StageFailed("b", 1, crashed)))
    import cloudpickle  # to Dask/Ray workers and back (this module travels by value)

    again = cloudpickle.loads(cloudpickle.dumps(flow_mod.StageFailed("b", 3, tail)))
    assert again.code == 3 and "not retried" in str(again)


def test_shares_divide_cores_and_gpus():
    assert placement.shares(2, cores=2, gpus=[]) == [placement.thread_env(1)] * 2
    eight = placement.shares(2, cores=16, gpus=[str(i) for i in range(8)])
    assert [s["CUDA_VISIBLE_DEVICES"] for s in eight] == ["0,1,2,3", "4,5,6,7"]
    assert {s["OMP_NUM_THREADS"] for s in eight} == {"8"}
    one_each = placement.shares(8, cores=16, gpus=[str(i) for i in range(8)])
    assert [s["CUDA_VISIBLE_DEVICES"] for s in one_each] == [str(i) for i in range(8)]
    assert [s["CUDA_VISIBLE_DEVICES"] for s in placement.shares(4, cores=4, gpus=["0", "1"])] == ["0", "1", "0", "1"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_flow_stops_its_stages(project, monkeypatch, sig):
    """SIGTERM (or Ctrl-C's SIGINT) to `python flows/pipeline.py` while a cell runs: the process ends within seconds,
    its running stage (DVC and the stage's process) is stopped, nothing queued starts, and no process of the flow's
    tree is left: not its temporary Prefect server (it gets no PREFECT_API_URL, as a user's flow), nor its warm
    server. Before the fixes the thread pool went on starting queued cells (Prefect re-raises SIGTERM only after the
    task runner shut down), and the Prefect server outlived the flow (SIGTERM killed it before its exit hook)."""
    root, _, _ = project
    tag = f"{sig.name}-{os.getpid()}-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"STAGE_SLEEP": "120", crash.TREE_ENV: tag}
    write_params(root, x=7 + sig, y=7 + sig)
    (root / "started.log").unlink(missing_ok=True)
    # SIGINT as in a terminal: a shell's background job (a CI runner's, this harness's) inherits it ignored
    flow = subprocess.Popen([sys.executable, str(spec.origin), "--workers", "1"], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while "c@" not in _read(root / "started.log") and time.monotonic() < deadline:
            assert flow.poll() is None, "the flow ended before any cell started"
            time.sleep(0.2)
        assert crash.marked(tag), "the flow's processes carry no marker"
        flow.send_signal(sig)
        flow.wait(timeout=60)  # not the 120 s the cell sleeps, nor both cells one after the other
        left = crash.wait_gone(tag, timeout=20)  # what the flow started, reparented or in other sessions included
        assert not left, f"outlived the flow: {[_cmdline(pid) for pid in left]}"
    finally:
        flow.kill()
        crash.kill_tree(tag)
    (name, pid), = [line.split() for line in _read(root / "started.log").splitlines()]  # the other never started
    out = root / f"c_{name.split('@')[1]}.txt"
    assert not out.exists() or f"={7 + sig};" not in out.read_text()  # it never finished


# A launcher that starts the flow in a session of its own, the marker in its environment only (the launcher is not
# counted), and waits
PARENT = ("import os, subprocess, sys, time; key, _, value = sys.argv[1].partition('='); "
          "subprocess.Popen(sys.argv[2:], start_new_session=True, env={**os.environ, key: value}); time.sleep(600)")


@pytest.mark.slow  # a flow process with its temporary Prefect server: ~25 s each, mostly its start
@pytest.mark.parametrize("end", ["parent killed", "prefect server dead, then SIGTERM"])
def test_a_flow_ends_with_its_parent_or_a_dead_server_and_leaves_no_process(project, end):
    """The flow started in a session of its own (no signal to its parent's group reaches it), a cell running:
    - its parent is SIGKILLed (as `timeout` ended `scalelab repro`): the flow stops and its whole tree is gone (it
      ran on alone before PR_SET_PDEATHSIG);
    - its temporary Prefect server is SIGKILLed, then the flow gets SIGTERM: its exit path would wait on Prefect's
      retries of the dead server, so after the grace (5 s here) the rest of the tree is ended and the flow exits.
    Counted: the processes carrying the test's marker, the stage's included."""
    root, _, _ = project
    tag = f"parent-{end[:6]}-{os.getpid()}-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"STAGE_SLEEP": "120", "SCALELAB_FLOW_GRACE_S": "5"}
    write_params(root, x=30 + len(end), y=30 + len(end))
    (root / "started.log").unlink(missing_ok=True)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, f"{crash.TREE_ENV}={tag}", sys.executable, str(spec.origin),
                               "--workers", "1"],
                              cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while "c@" not in _read(root / "started.log") and time.monotonic() < deadline:
            assert parent.poll() is None, "the parent ended before any cell started"
            time.sleep(0.2)
        assert "c@" in _read(root / "started.log"), "no cell started"
        if end == "parent killed":
            parent.kill()
        else:
            servers = [p for p in crash.marked(tag) if b"prefect" in crash._cmdline(p) and b"server" in crash._cmdline(p)]
            assert servers, [_cmdline(p) for p in crash.marked(tag)]
            for pid in servers:
                os.kill(pid, signal.SIGKILL)
            (flow,) = [p for p in crash.marked(tag) if b"pipeline.py" in crash._cmdline(p)]
            os.kill(flow, signal.SIGTERM)
        left = crash.wait_gone(tag, timeout=45)
        assert not left, f"outlived: {[_cmdline(pid) for pid in left]}"
    finally:
        parent.kill()
        parent.wait()
        crash.kill_tree(tag)
        write_params(root)


def _cmdline(pid: int) -> str:
    try:
        return f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"{pid}: (gone)"


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


@mutant("flow-retries-deterministic")
def _(monkeypatch):  # every failure retried (none deterministic): the rule lives in failures, the log in the flow
    monkeypatch.setattr(flow_mod.failures, "DETERMINISTIC", {})
    monkeypatch.setattr(flow_mod, "DETERMINISTIC", {})


@mutant("flow-dvc-exit-code")
def _(monkeypatch):  # the task sees DVC's 255, not the stage's code
    monkeypatch.setattr(flow_mod, "stage_exit", lambda dvc_code, tail: dvc_code)


@pytest.mark.mutation
@pytest.mark.parametrize("name", ["flow-retries-deterministic", "flow-dvc-exit-code"])
def test_the_failed_stage_test_catches(name):
    assert_caught("tests/test_flow.py::test_a_failed_stage_stops_what_depends_on_it", name)


@pytest.mark.mutation
def test_the_retry_rule_test_catches_retrying_everything():
    assert_caught("tests/test_flow.py::test_only_crashes_and_locks_are_retried", "flow-retries-deterministic")

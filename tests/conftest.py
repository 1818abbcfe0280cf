"""Test isolation: no test writes to the project's mlflow.db, .prefect or caches; no network."""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

# tmpfs when there is one: creating an MLflow sqlite store there takes ~3 s instead of ~8 s.
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None
_STATE = Path(tempfile.mkdtemp(prefix="scalelab-tests-", dir=FAST_TMP))
atexit.register(shutil.rmtree, _STATE, ignore_errors=True)
# Set before scalelab is imported anywhere, so its setdefault()s keep these.
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_STATE / 'mlflow.db'}"
os.environ["PREFECT_HOME"] = str(_STATE / "prefect")
os.environ["HF_HOME"] = str(_STATE / "hf")
for key, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "DVC_NO_ANALYTICS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                   "MLFLOW_ENABLE_TELEMETRY": "false", "DO_NOT_TRACK": "1"}.items():
    os.environ.setdefault(key, value)

ROOT = Path(__file__).resolve().parents[1]


def assert_same_ledger(regenerated: list[dict], committed: list[dict]) -> None:
    """A ledger regenerated today equals the committed one: the same entries in order, every field equal, floats to
    1e-9 relative (curve fits and t intervals move in the last digits with the BLAS and thread count), and the
    regenerated values as JSON holds them (tuples as lists, numpy scalars as floats)."""
    import json

    def close(a, b, path):
        if isinstance(a, dict):
            assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
            for k in a:
                close(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, list):
            assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths {len(a)} != {len(b)}"
            for i, (x, y) in enumerate(zip(a, b)):
                close(x, y, f"{path}[{i}]")
        elif isinstance(a, float) and not isinstance(b, bool):
            assert b == pytest.approx(a, rel=1e-9, abs=1e-12, nan_ok=True), path
        else:
            assert a == b, f"{path}: {a!r} != {b!r}"

    regenerated = json.loads(json.dumps(regenerated, default=float))
    assert [e["id"] for e in regenerated] == [e["id"] for e in committed]
    for new, old in zip(regenerated, committed):
        close(new, old, new["id"])
MICRO = ROOT / "tests" / "micro_params.yaml"

# Every process a test starts inherits this variable (one name per test process: each xdist worker, each nested
# pytest run, has its own; a nested run's children carry both marks), so its leftovers are found by their environment
# even once reparented to init, which a walk of descendants would miss.
LEAK_MARK = f"SCALELAB_TEST_PROCESS_{uuid.uuid4().hex.upper()}"
os.environ[LEAK_MARK] = "1"
# a server stopped by its fixture's teardown may take a few seconds to exit
LEAK_GRACE_S = float(os.environ.get("SCALELAB_LEAK_GRACE_S", "5"))


def marked_processes(mark: str = LEAK_MARK) -> dict[int, str]:
    """{pid: command line} of the live processes (not this one) whose environment holds `mark`."""
    needle, found = f"{mark}=".encode(), {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if any(v.startswith(needle) for v in (proc / "environ").read_bytes().split(b"\0")):
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or a zombie: not alive
            continue
    return {pid: cmd for pid, cmd in found.items() if _alive(pid) and not _own_helper(pid)}


def _own_helper(pid: int) -> bool:
    """This interpreter's multiprocessing resource tracker (torch, Ray and forking tests start it): it exits with
    this process (its pipe closes), so it is no leftover of a test. Only that one pid is spared."""
    from multiprocessing import resource_tracker

    return pid == getattr(resource_tracker._resource_tracker, "_pid", None)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_leftovers(grace: float = LEAK_GRACE_S) -> dict[int, str]:
    """The marked processes still alive after `grace` seconds, each then killed (SIGTERM, SIGKILL 2 s later)."""
    deadline = time.monotonic() + grace
    while (left := marked_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [p for p in left if _alive(p)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 2
        while any(_alive(p) for p in left) and time.monotonic() < end:
            time.sleep(0.1)
    return left


@pytest.fixture(autouse=True, scope="session")
def no_process_left_behind():
    """The test run fails if a process its tests started outlives them (servers, workers, stages): set up before any
    other session-scoped fixture, so torn down after them all (a harness's server stops first)."""
    yield
    if left := kill_leftovers():
        lines = "\n".join(f"  pid {pid}: {cmd[:300]}" for pid, cmd in sorted(left.items()))
        pytest.fail(f"{len(left)} process(es) started by the tests still alive {LEAK_GRACE_S:g} s after the "
                    f"last test (now killed):\n{lines}", pytrace=False)


# The files that take longest (their summed --durations on the idle 2-core machine), longest first: with
# --no-loadscope-reorder (pyproject) xdist's loadfile hands files to the two workers in this order, so no long file
# starts late and runs alone at the end (LPT scheduling; xdist's own order, by number of tests, put them last).
# By the per-file seconds the suite prints (pytest_terminal_summary below); test_study.py (its kill-mid-cell test
# alone ~146 s on CI) had been left out, so it started among the last files.
# The files that need the micro DAG's one build (conftest's micro_build) come first on one worker, test_pipeline.py
# building it; the other worker meanwhile runs the longest files that need none (test_flow.py, test_rehearsal.py),
# instead of waiting on the build's lock, and the rest of the files that need the build follow. test_remote.py copies
# the build too (a slice of it), but runs late on either worker, long after the build is done.
NEED_BUILD = ("test_pipeline.py", "test_crash.py", "test_experiments.py", "test_study.py", "test_runners.py")
LONGEST_FIRST = ("test_pipeline.py", "test_flow.py", "test_rehearsal.py", *NEED_BUILD[1:], "test_runstate.py",
                 "test_teamserver.py", "test_ui.py", "test_hardening.py", "test_bad_params.py", "test_remote.py",
                 "test_warm.py")


def pytest_collection_modifyitems(config, items):
    import torch

    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


FILE_SECONDS: dict[str, float] = {}
# (seconds, test) of every setup and every call: the slowest of each printed beside the per-file table, so a fixture
# that grew (a shared build, a server) is told apart from a test body that did
PHASE_SECONDS: dict[str, list[tuple[float, str]]] = {"setup": [], "call": []}
SLOWEST = 5


def pytest_runtest_logreport(report):
    """Each test file's seconds (setup, call and teardown of its tests), gathered where the reports arrive (xdist's
    controller): the per-file table below, which LONGEST_FIRST is ordered by."""
    FILE_SECONDS[report.nodeid.split("::")[0]] = FILE_SECONDS.get(report.nodeid.split("::")[0], 0.0) + report.duration
    if report.when in PHASE_SECONDS:
        PHASE_SECONDS[report.when].append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if not FILE_SECONDS or len(FILE_SECONDS) < 2:
        return
    total = sum(FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"seconds per test file (all workers: {total:.0f} s)")
    for path, seconds in sorted(FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        if seconds >= 0.01 * total:
            terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    for when, rows in PHASE_SECONDS.items():
        terminalreporter.write_sep("-", f"the {SLOWEST} slowest {when}s")
        for seconds, nodeid in sorted(rows, reverse=True)[:SLOWEST]:
            terminalreporter.write_line(f"{seconds:8.1f} s  {nodeid}")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Micro models gain nothing from threads, and lose a lot to spinning when the cores are shared."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _mutant(monkeypatch):
    """Under a mutation check (tests/mutants.py) the named broken implementation replaces the real one."""
    if name := os.environ.get("SCALELAB_MUTANT"):
        import mutants

        mutants.apply(name, monkeypatch)
    yield


@pytest.fixture
def micro_params():
    from scalelab.config import load_params

    return load_params(MICRO)


# workspace.MLFLOW_DB_ENV, spelled out: an autouse fixture must not import workspace (tests/test_hardening.py runs a copy
# of this conftest in a folder of its own, where there is none)
MLFLOW_DB_ENV = "SCALELAB_TEST_MLFLOW_DB"
CHECKED_ENV = "SCALELAB_TEST_CHECKED"  # workspace.CHECKED_ENV, likewise


@pytest.fixture(autouse=True, scope="session")
def mlflow_db(tmp_path_factory):
    """Where the test run's migrated MLflow store goes (workspace.seed_mlflow_store builds it there on first use, so
    a run that makes no workspace never imports MLflow for it): the xdist workers share it (their basetemps' common
    folder), one per MLflow version."""
    from importlib.metadata import version

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    db = shared / f"mlflow-{version('mlflow')}.db"
    os.environ[MLFLOW_DB_ENV] = str(db)
    # the remembered check verdicts on the micro profile (workspace.seed_check_verdicts), shared the same way
    os.environ[CHECKED_ENV] = str(shared / "checked.json")
    yield db
    os.environ.pop(MLFLOW_DB_ENV, None)
    os.environ.pop(CHECKED_ENV, None)


@pytest.fixture(scope="session")
def prefect_db(tmp_path_factory):
    """A Prefect database migrated once per test run, for every Prefect home the tests start a server on
    (workspace.seed_prefect_home; this process's own home seeded here). Built by Prefect's own command, aside, and
    moved into place under a lock: the xdist workers share it (their basetemps' common folder)."""
    import fcntl

    import prefect
    from workspace import PREFECT_DB_ENV, seed_prefect_home

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    db = shared / f"prefect-{prefect.__version__}.db"
    with open(shared / "prefect-db.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not db.exists():
            home = Path(tempfile.mkdtemp(dir=shared))
            env = {**os.environ, "PREFECT_HOME": str(home),
                   "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}"}
            subprocess.run([str(Path(sys.executable).parent / "prefect"), "server", "database", "upgrade", "-y"],
                           env=env, check=True, capture_output=True)
            os.replace(home / "prefect.db", db)
            shutil.rmtree(home)
    os.environ[PREFECT_DB_ENV] = str(db)
    seed_prefect_home(Path(os.environ["PREFECT_HOME"]))
    return db


@pytest.fixture(scope="session")
def micro_build(tmp_path_factory, prefect_db):
    """The whole micro DAG built once per test run (workspace.build_micro), shared by the xdist workers (their
    basetemps' common folder): the tests that need a built workspace each take a copy (workspace.copy_workspace)."""
    from workspace import build_micro

    base = tmp_path_factory.getbasetemp()
    return build_micro(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory, prefect_db):
    """One Prefect server for every flow the tests run in this process, shared by the xdist workers (tests/harness.py),
    on a copy of the migrated database. Yields that database's path (what a dashboard over the flow runs of the tests
    reads a copy of)."""
    from harness import serve

    base = tmp_path_factory.getbasetemp()
    with serve(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base, prefect_db, FAST_TMP) as db:
        yield db

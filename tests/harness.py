"""One Prefect server for every flow the tests run in their own process, shared by the xdist workers (conftest's
`prefect_harness`), in place of a `prefect_test_harness` per worker.

The worker that first needs it starts it (flows/tempserver.py: the flow's own temporary server, on a copy of the test
run's migrated database) and records its URL in the workers' common folder; another worker reads the URL and uses the
same server. Each user holds a shared lock on `users` while its session runs; the starter stops the server at its
session's end once it can take that lock exclusively, that is once no other worker uses it (a worker that comes later
starts a new one). Saved, measured on this 2-core machine: a second server's start (~5 CPU s) and idling (~1 CPU s a
minute, all run long), and in each worker the import of Prefect's server package that `prefect_test_harness` brings
(~3 CPU s).

The flows a test starts as a user would, in a process of their own (tests/test_flow.py, test_crash.py), are given no
PREFECT_API_URL and start their own temporary server: this one is set in this process's Prefect settings only, never
in its environment."""

import contextlib
import fcntl
import json
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATIENCE_S = 180  # a busy 2-core machine starts it slowly


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _answering(state: Path) -> str | None:
    """The recorded server's API URL when it answers, else None."""
    try:
        url = json.loads(state.read_text())["url"]
        with urllib.request.urlopen(f"{url}/health", timeout=10) as res:
            return url if res.status == 200 else None
    except (OSError, ValueError, KeyError):
        return None


@contextlib.contextmanager
def serve(shared: Path, seed_db: Path, fast_tmp: str | None = None) -> Iterator[Path]:
    """This worker's Prefect settings pointed at the run's shared server (started here when none answers), until the
    end of the block; yields the server's database."""
    import prefect.context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    sys.path.insert(0, str(ROOT / "flows"))
    import tempserver

    lock, state, users = (shared / f"prefect-harness.{name}" for name in ("lock", "json", "users"))
    folder = None
    with _locked(lock):
        if (url := _answering(state)) is None:  # none yet, or its starter stopped it
            folder = Path(tempfile.mkdtemp(prefix="prefect-harness-", dir=fast_tmp))
            shutil.copyfile(seed_db, folder / "prefect.db")
            url = tempserver.start({"PREFECT_SERVER_DATABASE_CONNECTION_URL":
                                    f"sqlite+aiosqlite:///{folder / 'prefect.db'}"}, PATIENCE_S)
            state.write_text(json.dumps({"url": url, "db": str(folder / "prefect.db")}))
        db = Path(json.loads(state.read_text())["db"])
        using = open(users, "a")
        fcntl.flock(using, fcntl.LOCK_SH)
    try:
        # the settings of this process's code, and of its threads that began in an earlier context (Prefect's log and
        # event workers), as prefect_test_harness sets them
        with (temporary_settings(updates={PREFECT_API_URL: url}),
              prefect.context._temporary_global_settings_context(prefect.context.get_settings_context())):
            try:
                yield db
            finally:  # what this worker's flows still queue for the server, sent before it may stop
                with contextlib.suppress(RuntimeError):  # never started
                    APILogWorker.instance().drain()
                EventsWorker.drain_all()
    finally:
        using.close()  # its shared lock released
        if folder is not None:
            with _locked(lock), open(users, "a") as every:
                fcntl.flock(every, fcntl.LOCK_EX)  # once every other worker's session is done with it
                tempserver.stop()
                state.unlink()
                shutil.rmtree(folder, ignore_errors=True)

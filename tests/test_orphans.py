"""scalelab.tracking.orphans: the sweep closes abandoned runs as KILLED and nothing else (its docstring's rule).

Each interleaving the rule guards against is forced deterministically: a search answer that is stale by the time it
is read (a race once seen under load), a resume that claims a run between its owner's death and the sweep's close,
and the journal and owner-tag branches (reused pid, other host, a journaled run reopened by another owner)."""

import fcntl
import os
import socket
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mutants import assert_caught, mutant
from test_tracking import db, project  # noqa: F401  (fixtures: a shared sqlite store, a project root per test)

from scalelab.tracking import orphans
from scalelab import project_root, tracking


def _tag(pid: int, host: str | None = None) -> str:
    return f"{host or socket.gethostname()}:{pid}:{orphans._start_time(pid)}"


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def store(project):
    """(client, experiment id, uri) of this test's experiment."""
    client, exp_id = tracking.store._connect(project[1])
    return client, exp_id, tracking.tracking_uri()


@pytest.fixture
def live():
    """A live process of this host that is not the test's (a run owner that stays alive)."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def _run(client, exp_id, tag: str) -> str:
    return client.create_run(exp_id, tags={orphans.OWNER_TAG: tag}).info.run_id


def _state(client, run_id) -> tuple[str, str]:
    run = client.get_run(run_id)
    return run.info.status, run.data.tags.get(orphans.OWNER_TAG)


class StaleSearch(MlflowClient):
    """A client whose `search_runs` answer is read only after `meanwhile` ran: other processes go on between the
    sweep's query and its decisions."""

    def __init__(self, uri, meanwhile):
        super().__init__(uri)
        self.meanwhile = meanwhile

    def search_runs(self, *args, **kwargs):
        found = super().search_runs(*args, **kwargs)
        self.meanwhile()
        return found


# ---------------------------------------------------------------- the old sweep, kept as a mutant (the race above)
def old_sweep(client, experiment_id, uri):
    """orphans.sweep at b2d4a37: closes what its search found RUNNING once the owner is gone, without a re-read."""
    for e in orphans._take_journal(uri):
        try:
            run = client.get_run(e["run_id"])
        except Exception:
            continue
        if run.info.status == "RUNNING" and run.data.tags.get(orphans.OWNER_TAG) == e["owner"]:
            client.set_terminated(e["run_id"], e["status"], e["end_time"])
    query = f"attributes.status = 'RUNNING' and tags.`{orphans.OWNER_TAG}` LIKE '{socket.gethostname()}:%'"
    for run in client.search_runs([experiment_id], query, max_results=1000):
        if orphans.owner_gone(run.data.tags[orphans.OWNER_TAG]):
            client.set_terminated(run.info.run_id, "KILLED")


@mutant("sweep-stale-search")
def _(monkeypatch):
    monkeypatch.setattr(orphans, "sweep", old_sweep)


def test_a_run_its_owner_ended_after_the_search_keeps_its_status(store, live):
    """The search sees B's run RUNNING; B ends it FINISHED and exits; the sweep must not close it KILLED.
    A run whose owner died without ending it is still closed."""
    client, exp_id, uri = store
    ended, abandoned = _run(client, exp_id, _tag(live.pid)), _run(client, exp_id, _tag(_dead_pid()))

    def owner_ends_and_exits():
        client.set_terminated(ended, "FINISHED")
        live.kill()
        live.wait()

    orphans.sweep(StaleSearch(uri, owner_ends_and_exits), exp_id, uri)
    assert _state(client, ended)[0] == "FINISHED"
    assert _state(client, abandoned)[0] == "KILLED"


def test_a_run_claimed_after_its_owner_was_seen_dead_stays_open(store, monkeypatch):
    """A resume reopens the run between the sweep's liveness check and its close: the resumed run stays RUNNING."""
    client, exp_id, uri = store
    run_id = _run(client, exp_id, _tag(_dead_pid()))
    seen_dead = orphans.owner_gone

    def gone_then_resumed(tag):
        dead = seen_dead(tag)
        orphans.claim(client, run_id)  # another process of this host resumes it meanwhile
        return dead

    monkeypatch.setattr(orphans, "owner_gone", gone_then_resumed)
    orphans.sweep(client, exp_id, uri)
    assert _state(client, run_id) == ("RUNNING", orphans.owner())


@mutant("claim-status-first-unlocked")
def _(monkeypatch):
    def claim(client, run_id):
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, orphans.OWNER_TAG, orphans.owner())

    monkeypatch.setattr(orphans, "claim", claim)


def test_a_claim_writes_its_owner_before_running_under_the_lock(store):
    """Reopening a run never shows it RUNNING under its dead owner, and cannot interleave with a sweep's close."""
    client, exp_id, _ = store
    run_id = _run(client, exp_id, _tag(_dead_pid()))
    client.set_terminated(run_id, "KILLED")
    lock, seen = project_root() / ".cache" / "scalelab" / "runs.lock", []

    class Watched(MlflowClient):
        def _observe(self):
            with open(lock, "a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = False
                except BlockingIOError:
                    held = True
            seen.append((*_state(client, run_id), held))

        def set_tag(self, *args, **kwargs):
            self._observe()
            return super().set_tag(*args, **kwargs)

        def update_run(self, *args, **kwargs):
            self._observe()
            return super().update_run(*args, **kwargs)

    lock.parent.mkdir(parents=True, exist_ok=True)
    orphans.claim(Watched(tracking.tracking_uri()), run_id)
    assert all(held for *_, held in seen), seen
    assert [status for status, *_ in seen] == ["KILLED", "KILLED"]  # nothing RUNNING before the new owner is in
    assert _state(client, run_id) == ("RUNNING", orphans.owner())


@mutant("pid-reuse-ignored")
def _(monkeypatch):
    def owner_gone(tag):
        host, pid, _ = tag.rsplit(":", 2)
        return host == socket.gethostname() and orphans._start_time(int(pid)) is None

    monkeypatch.setattr(orphans, "owner_gone", owner_gone)


def test_a_reused_pid_is_a_dead_owner(store, live):
    """The pid lives, but another process started at another time holds it: its old runs were abandoned."""
    client, exp_id, uri = store
    host, pid, start = _tag(live.pid).rsplit(":", 2)
    reused = f"{host}:{pid}:{int(start) - 1}"
    assert orphans.owner_gone(reused) and not orphans.owner_gone(_tag(live.pid))
    stale, alive = _run(client, exp_id, reused), _run(client, exp_id, _tag(live.pid))
    orphans.sweep(client, exp_id, uri)
    assert _state(client, stale)[0] == "KILLED" and _state(client, alive)[0] == "RUNNING"


@mutant("stat-esrch-raises")
def _(monkeypatch):
    real = orphans._start_time

    def _start_time(pid):
        if not Path(f"/proc/{pid}/stat").exists():
            return real(pid)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]  # ESRCH propagates

    monkeypatch.setattr(orphans, "_start_time", _start_time)


def test_an_owner_exiting_while_its_stat_is_read_is_gone(store, live, monkeypatch):
    """Reading /proc/<pid>/stat of a process that is exiting fails with ESRCH (seen in test_runstate): that owner
    is gone, and the sweep goes on to close its run instead of giving up."""
    client, exp_id, uri = store
    run_id = _run(client, exp_id, _tag(live.pid))
    read = Path.read_text

    def exiting(path, *args, **kwargs):
        if str(path) == f"/proc/{live.pid}/stat":
            raise ProcessLookupError(3, "No such process")
        return read(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", exiting)
    orphans.sweep(client, exp_id, uri)
    assert _state(client, run_id)[0] == "KILLED"


@mutant("other-host-judged")
def _(monkeypatch):
    def owner_gone(tag):
        _, pid, start = tag.rsplit(":", 2)
        return orphans._start_time(int(pid)) != start

    monkeypatch.setattr(orphans, "owner_gone", owner_gone)


def test_runs_of_other_hosts_are_left_to_their_host(store):
    """This host cannot see another's processes: a pid that is gone here says nothing about the owner there."""
    client, exp_id, uri = store
    elsewhere = f"node-{socket.gethostname()}-2:{_dead_pid()}:12345"
    assert not orphans.owner_gone(elsewhere)
    run_id = _run(client, exp_id, elsewhere)
    orphans.sweep(client, exp_id, uri)
    assert _state(client, run_id) == ("RUNNING", elsewhere)


@mutant("journal-ignores-owner")
def _(monkeypatch):
    monkeypatch.setattr(orphans, "_running_under", lambda client, run_id, tag: client.get_run(run_id).info.status
                        == "RUNNING")


def test_a_journaled_end_is_not_applied_to_a_reopened_run(store, live):
    """An outage kept two runs' ends in the journal; one was reopened by another process since: only the other
    gets its journaled status and end time, and the journal is emptied."""
    client, exp_id, uri = store
    reopened, untouched = _run(client, exp_id, orphans.owner()), _run(client, exp_id, orphans.owner())
    orphans.defer(uri, [(reopened, "FINISHED"), (untouched, "FAILED")])
    client.set_tag(reopened, orphans.OWNER_TAG, _tag(live.pid))  # a resume in another live process
    orphans.sweep(client, exp_id, uri)
    assert _state(client, reopened) == ("RUNNING", _tag(live.pid))
    assert _state(client, untouched)[0] == "FAILED" and client.get_run(untouched).info.end_time is not None
    assert orphans._take_journal(uri) == []


@pytest.mark.mutation
@pytest.mark.parametrize("test,name", [
    ("test_a_run_its_owner_ended_after_the_search_keeps_its_status", "sweep-stale-search"),
    ("test_a_run_claimed_after_its_owner_was_seen_dead_stays_open", "sweep-stale-search"),
    ("test_a_claim_writes_its_owner_before_running_under_the_lock", "claim-status-first-unlocked"),
    ("test_a_reused_pid_is_a_dead_owner", "pid-reuse-ignored"),
    ("test_runs_of_other_hosts_are_left_to_their_host", "other-host-judged"),
    ("test_an_owner_exiting_while_its_stat_is_read_is_gone", "stat-esrch-raises"),
    ("test_a_journaled_end_is_not_applied_to_a_reopened_run", "journal-ignores-owner"),
])
def test_mutants_are_caught(test, name):
    assert_caught(f"tests/test_orphans.py::{test}", name)

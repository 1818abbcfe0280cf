"""MLflow runs left RUNNING, closed with the right status on the next contact with the store (scalelab.tracking).

Two ways a run stays RUNNING: its process died (kill -9, OOM, a node lost), or it ended while the store was
unreachable, so its end was never recorded. Every run (and a plain repro's parent, which its latest stage holds)
carries an owner tag `host:pid:start-time`; when a stage ends during an outage, its final status goes into a small
journal beside the project (.cache/scalelab/mlflow-pending.jsonl). At the next contact (`sweep`, from
tracking's connect):

- a journaled run still RUNNING under the same owner gets its recorded status (FINISHED or FAILED) and end time;
- a RUNNING run owned by a process of this host that no longer exists (pid gone, or reused by a process started at
  another time) becomes KILLED, by the rule below.

The rule (without it, a sweep could close a concurrent stage's FINISHED runs as KILLED). A run is abandoned, and the
sweep closes it, only if it is RUNNING under owner O when *re-read after O was observed dead*. Every write of O
happens before O's death, so that re-read sees O's last word: a run O ended, or one O is still working on (O alive),
is never closed. Only a reopen (`claim`: a resume, a repro parent taken by its next stage) writes to a run after its
owner's death; claim and the sweep's re-read-and-close hold one host-local lock (.cache/scalelab/runs.lock, flock),
and claim writes the new owner before the RUNNING status, so a sweep sees either the old owner's final state or a
live owner, never a reopened run under its dead owner. A search result is only a candidate list: it may be stale by
the time it is read. Left to other means: runs of other hosts, whose processes this host cannot see (their own host
closes them on its next contact; a resume on another host is not covered by this host's lock), and an HTTP request
still in flight when its process was killed (the server may apply it after the re-read).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalelab import store_root

OWNER_TAG = "scalelab.owner"


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (Linux /proc), None if it is gone or a zombie;
    "" where /proc does not exist (liveness by signal 0 only)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it exited while its stat was being read
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)", which may hold spaces
    return None if fields[0] == "Z" else fields[19]  # state, ..., starttime (field 22 of proc(5))


def owner() -> str:
    """This process as a run owner: host:pid:start-time."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid) or ''}"


def owner_gone(tag: str) -> bool:
    """The owner is a process of this host that no longer exists (False when alive or on another host)."""
    parts = tag.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    now = _start_time(int(parts[1]))
    return now is None or (parts[2] != "" and now != "" and now != parts[2])  # a reused pid: another start time


def _journal() -> Path:
    return store_root() / ".cache" / "scalelab" / "mlflow-pending.jsonl"  # the store's, not a copy's


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """This host's lock on reopening and closing runs (the rule above): held by `claim` and the sweep's closes."""
    path = store_root() / ".cache" / "scalelab" / "runs.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when f closes
        yield


def claim(client: Any, run_id: str) -> None:
    """Reopen `run_id` as this process's: owner tag first, then RUNNING, under the lock (the rule above)."""
    with _locked():
        client.set_tag(run_id, OWNER_TAG, owner())
        client.update_run(run_id, status="RUNNING")


def defer(uri: str, ends: list[tuple[str, str]]) -> None:
    """Record (run_id, status) pairs whose end the store did not receive, for the next contact to apply."""
    path = _journal()
    path.parent.mkdir(parents=True, exist_ok=True)
    me, now = owner(), int(time.time() * 1000)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        for run_id, status in ends:
            f.write(json.dumps({"uri": uri, "run_id": run_id, "status": status, "end_time": now, "owner": me}) + "\n")


def _take_journal(uri: str) -> list[dict]:
    """The journaled ends for this store, removed from the journal (the others stay)."""
    path = _journal()
    if not path.is_file():
        return []
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        entries = [json.loads(line) for line in f if line.strip()]
        mine = [e for e in entries if e["uri"] == uri]
        if mine:
            f.seek(0)
            f.truncate()
            f.writelines(json.dumps(e) + "\n" for e in entries if e["uri"] != uri)
    return mine


def _running_under(client: Any, run_id: str, tag: str) -> bool:
    """The run, read now, is RUNNING under owner `tag` (False when it is gone)."""
    try:
        run = client.get_run(run_id)
    except Exception:
        return False  # deleted meanwhile, or another experiment's store
    return run.info.status == "RUNNING" and run.data.tags.get(OWNER_TAG) == tag


def sweep(client: Any, experiment_id: str, uri: str) -> None:
    """Close this experiment's runs left RUNNING: journaled ends first, then runs whose owner process is gone.

    The search only finds candidates; each is re-read, under the lock, after its owner was seen dead (the rule)."""
    journaled = _take_journal(uri)
    query = f"attributes.status = 'RUNNING' and tags.`{OWNER_TAG}` LIKE '{socket.gethostname()}:%'"
    found = client.search_runs([experiment_id], query, max_results=1000)
    dead = [(r.info.run_id, r.data.tags[OWNER_TAG]) for r in found if owner_gone(r.data.tags[OWNER_TAG])]
    if not journaled and not dead:
        return  # the common case: nothing to close, no lock taken
    with _locked():
        for e in journaled:
            if _running_under(client, e["run_id"], e["owner"]):  # nobody reopened it
                client.set_terminated(e["run_id"], e["status"], e["end_time"])
        for run_id, tag in dead:
            if _running_under(client, run_id, tag):  # re-read after the owner was seen dead: abandoned
                client.set_terminated(run_id, "KILLED")

"""MLflow runs left RUNNING, closed with the right status on the next contact with the store (scalelab.tracking).

Two ways a run stays RUNNING: its process died (kill -9, OOM, a node lost), or it ended while the store was
unreachable, so its end was never recorded. Every run (and a plain repro's parent, which its latest stage holds)
carries an owner tag `host:pid:start-time`; when a stage ends during an outage, its final status goes into a small
journal beside the project (.cache/scalelab/mlflow-pending.jsonl). At the next contact (`sweep`, from
tracking's connect):

- a journaled run still RUNNING under the same owner gets its recorded status (FINISHED or FAILED) and end time;
- a RUNNING run owned by a process of this host that no longer exists (pid gone, or reused by a process started at
  another time) becomes KILLED.

Runs owned by live processes, e.g. concurrent stages, are left alone; so are runs of other hosts, whose processes
this host cannot see (their own host closes them on its next contact).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from scalelab import project_root

OWNER_TAG = "scalelab.owner"


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (Linux /proc), None if it is gone or a zombie;
    "" where /proc does not exist (liveness by signal 0 only)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
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
    return project_root() / ".cache" / "scalelab" / "mlflow-pending.jsonl"


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


def sweep(client: Any, experiment_id: str, uri: str) -> None:
    """Close this experiment's runs left RUNNING: journaled ends first, then runs whose owner process is gone."""
    for e in _take_journal(uri):
        try:
            run = client.get_run(e["run_id"])
        except Exception:
            continue  # deleted meanwhile, or another experiment's store
        if run.info.status == "RUNNING" and run.data.tags.get(OWNER_TAG) == e["owner"]:  # nobody reopened it
            client.set_terminated(e["run_id"], e["status"], e["end_time"])
    query = f"attributes.status = 'RUNNING' and tags.`{OWNER_TAG}` LIKE '{socket.gethostname()}:%'"
    for run in client.search_runs([experiment_id], query, max_results=1000):
        if owner_gone(run.data.tags[OWNER_TAG]):
            client.set_terminated(run.info.run_id, "KILLED")

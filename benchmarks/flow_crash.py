"""Whole-flow crash trials (issue 21 item 5): `kill -9` of every process of a running pipeline flow (the flow, its
temporary Prefect server, its warm server, DVC and the stages) at a random moment, then the same command again.

    python benchmarks/flow_crash.py [--params configs/x.yaml] [--target T ...] [--kills 3] [--seed 0] [--workers 2]

In a temporary copy of the code (tests/workspace.py) with the given profile (default: the micro profile), it builds
the targets once uninterrupted, for reference, in another copy; then for each trial, in a fresh copy: starts
`python flows/pipeline.py`, SIGKILLs its whole tree at a seeded random time (uniform over the reference run's wall
time: at least one lands while a training cell runs on the micro targets), reruns the same command to the end, and
checks what must hold after the rerun (`check`): the rerun succeeded; every cell's metrics equal the reference's
(timings aside); `dvc status` is clean; dvc.lock holds every stage once; no MLflow run is RUNNING; the rerun's parent
run has one FINISHED child per cell it ran. It prints each trial's kill time, rerun wall time and cells equal /
different, and ends with one JSON line per the benchmarks convention.

The flow's tree is every process carrying TREE_ENV in its environment (set for the flow, inherited by everything it
starts, reparented or in another session): what `kill -9` of a process group would miss (DVC runs each stage in its
own session) and what a crash of the machine or of its cgroup takes down.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from workspace import MICRO, workspace_copy  # noqa: E402  (the tests' copy of the code in a fresh git repo)

TREE_ENV = "SCALELAB_TREE"
DVC = [sys.executable, "-m", "dvc"]
# Metrics fields that measure the machine, not the result: they differ between any two runs
TIMING = ("_s", "per_s", "mfu", "throughput", "tokens_per", "time", "wall", "cpu")


def marked(tag: str) -> list[int]:
    """The pids of the live processes whose environment carries TREE_ENV=tag (Linux /proc)."""
    needle = f"{TREE_ENV}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0") and _alive(int(entry)):
                found.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def kill_tree(tag: str) -> int:
    """SIGKILL every process of the tree until none is left (one started meanwhile is caught by the next pass)."""
    killed = set()
    while pids := marked(tag):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return len(killed)


def wait_gone(tag: str, timeout: float) -> list[int]:
    """Waits up to `timeout` s for the tree to end by itself; returns the pids still alive then."""
    deadline = time.monotonic() + timeout
    while (left := marked(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left

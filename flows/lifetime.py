"""How the flow's process ends: with its parent, and on SIGTERM or Ctrl-C, leaving no process of its own behind.

- Its parent (`scalelab repro`, `scalelab study`, a shell) can die without a word to it: killed by `timeout` or
  kill -9, the flow went on alone (seen: alive after `timeout` ended `scalelab repro`). Linux's PR_SET_PDEATHSIG
  sends this process SIGTERM when its parent dies; it is set here, so every launcher is covered, and a parent gone
  before it was set is seen by getppid.
- SIGTERM and SIGINT end the flow through Python's exit path (`exit_on`): the running stages are stopped and the
  warm server and the temporary Prefect server end with it (flows/pipeline.py). That path can hang: when the Prefect
  server is gone first (killed with its parent's process group), Prefect's client retries every call, and the
  interpreter's exit waits for the task threads stuck in them; seen: alive minutes later, a second SIGTERM and SIGINT
  ignored. So a second signal, or GRACE_S after the first, ends what is left (`end_all`): SIGTERM, then SIGKILL, to
  every process this one started and theirs, then this one at once.
"""

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

GRACE_ENV = "SCALELAB_FLOW_GRACE_S"  # how long the exit path may take after a signal
GRACE_S = 60.0  # a stage stopped by SIGTERM keeps its checkpoint first; the servers stop in seconds
KILL_AFTER_S = 5.0  # between the SIGTERM and the SIGKILL of end_all
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGTERM to this process when its parent dies (Linux; elsewhere nothing); at once if it already has."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # orphaned between the two reads (a parent of pid 1, a container's, is no orphan)
        os.kill(os.getpid(), signal.SIGTERM)


def descendants(pid: int) -> list[int]:
    """Every live process under `pid` by parent links (/proc), children before their own children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():  # none to find without /proc (macOS)
        if not entry.isdigit():
            continue
        try:  # field 4 of stat, after the command name in parentheses (which may hold spaces)
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def end_all(code: int) -> None:
    """SIGTERM to every descendant, SIGKILL to those left after KILL_AFTER_S, then this process exits with `code`
    without Python's exit path (the part that hung)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + KILL_AFTER_S
        while sig == signal.SIGTERM and descendants(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.1)
    os._exit(code)


_seen: list[int] = []  # the signals delivered, counted once each
_passed_on = threading.Event()  # a SIGTERM handed to Prefect's handler, which sends it again to ours when done
_enabled: list[bool] = []


def _count(signum: int) -> int:
    """A delivered signal: the first starts the watchdog, a second ends everything at once. Returns the exit code."""
    code = 128 + signum
    if _seen:
        end_all(code)
    _seen.append(signum)
    grace = float(os.environ.get(GRACE_ENV) or GRACE_S)
    threading.Thread(target=lambda: (time.sleep(grace), end_all(code)), daemon=True,
                     name="scalelab-exit-watchdog").start()
    return code


def _handler(signum, frame):
    if signum == signal.SIGTERM and _passed_on.is_set():  # Prefect's os.kill after it stopped the flow: not a second
        _passed_on.clear()
        sys.exit(128 + signum)
    code = _count(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt  # as Python's own handler: Prefect marks the run as a Ctrl-C
    sys.exit(code)


def exit_on(signums=(signal.SIGTERM, signal.SIGINT)) -> None:
    """The first of these signals exits through Python's exit path (SystemExit or KeyboardInterrupt in the main
    thread: the flow stops its stages and servers on the way out), with a watchdog that calls end_all if that takes
    more than the grace; a second signal calls end_all at once. The flow's process only (flows/pipeline.py's main)."""
    for signum in signums:
        signal.signal(signum, _handler)
    _enabled.append(True)


def watch_prefect() -> None:
    """In the flow's body (the main thread), where Prefect's engine has put its own SIGTERM handler over ours (it
    raises TerminationSignal, reports the run's state, then sends the signal again): the signal is counted first, so
    the watchdog runs while Prefect's reporting waits on a dead server. Nothing where exit_on was not called (a
    served flow, a test calling the flow)."""
    if not _enabled:
        return
    try:
        prefect_handler = signal.getsignal(signal.SIGTERM)
    except ValueError:  # not the main thread
        return
    if not callable(prefect_handler) or prefect_handler is _handler:
        return

    def counted(signum, frame):
        _count(signum)
        _passed_on.set()
        prefect_handler(signum, frame)

    signal.signal(signal.SIGTERM, counted)

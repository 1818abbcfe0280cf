"""Warm stages under a plain `dvc repro`: from its second stage script on, DVC's stages hand off to a warm server.

DVC runs a plain `dvc repro`'s stages one after the other, each `python stages/<name>.py` a fresh interpreter that
imports torch, Lightning and MLflow before it computes anything: 4-9 CPU s a stage, most of a small cell's cost, paid
again by each of the default DAG's stages. The flow starts its stages warm (scalelab.pipeline.warm); this module does
the same for DVC alone. The params guard in DVC's process (scalelab.pipeline.interpreter) calls `install` for `dvc
repro` in a scalelab project (not `--dry`, not `dvc exp run`); DVC's command runner, wrapped, starts a warm server
when DVC is about to run its second stage script and points every later stage at it (SCALELAB_WARM in DVC's
environment, which stage commands inherit). A repro that runs one stage script, or none, starts no server (its imports
would cost as much as the stage's own); the stage that starts it waits for the server's imports instead of doing its
own. The server ends with DVC: stopped at DVC's exit, or on its own once DVC is gone (`--parent`), its forked
stages with it.

Threads: the server imports torch with its default threads, so a forked stage starts with a cold one's torch threads,
then sets the profile's as a cold one does. OpenBLAS (numpy, scipy) keeps the server's one thread: its pool, started
at import, would not survive the fork. Not on GPU nodes (CUDA does not survive a fork), not inside the flow (its
stages already have a server), and SCALELAB_WARM=0 turns it off.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
from pathlib import Path

from scalelab.pipeline.handoff import WARM_ENV

# A command that hands off (scalelab.pipeline.stage.stage_main): a stage script of the project
STAGE_SCRIPT = re.compile(r"^\s*python3?\s+stages/\w+\.py\b")
# The server's log lines a DVC user needs not see: one per stage served, and the count at its end
ROUTINE = re.compile(r"^scalelab\.pipeline\.warm: "
                     r"(.*: exit -?\d+, [\d.]+ CPU s|served \d+ stage\(s\)(, \d+ DVC command\(s\))?)$")


def install(root: Path) -> None:
    """Wrap DVC's command runner in this process (DVC's, about to run `dvc repro` in `root`) to start a warm server
    at its second stage script. Nothing when a server is set already or switched off, or GPUs are visible."""
    from dvc.stage import run as stage_run

    from scalelab.runtime.placement import local_gpus

    if os.environ.get(WARM_ENV) or local_gpus() or getattr(stage_run.cmd_run, "scalelab", False):
        return
    real, scripts = stage_run.cmd_run, []

    def cmd_run(stage, *args, **kwargs):
        commands = stage.cmd if isinstance(stage.cmd, list) else [stage.cmd]
        if not kwargs.get("dry") and any(STAGE_SCRIPT.match(c) for c in commands):
            scripts.append(stage.addressing)
            if len(scripts) == 2 and WARM_ENV not in os.environ:
                _start(root)
        return real(stage, *args, **kwargs)

    cmd_run.scalelab = True
    stage_run.cmd_run = cmd_run  # run_stage looks it up at call time


def _start(root: Path) -> None:
    from scalelab.pipeline import warm

    folder, proc = warm.start(root, threads=None)

    def stop() -> None:
        warm.stop(proc)
        log = (folder / "warm.log").read_text(errors="replace").splitlines()
        for line in (line for line in log if line.strip() and not ROUTINE.match(line)):
            print(line, file=sys.stderr)  # what went wrong: a preload that failed, a refusal, a crash
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    os.environ[WARM_ENV] = str(folder / "warm.sock")

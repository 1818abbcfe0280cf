"""Where the pipeline flow asks whether a study's cell may start (flows/pipeline.py, `run_stage`, once the cell holds
its share of the machine, right before `dvc repro`).

A study run writes a gate file and names it in SCALELAB_STUDY_GATE for the flow (and its Dask or Ray workers, which
share the workspace's filesystem): its deadline, and each of its cells with the cost it is estimated at. A cell is
refused when its estimated cost says it would end past the deadline, or once the deadline has passed (a cell of
unknown cost starts while time is left), or when the study stopped; any other stage (a data stage the cells need)
is never gated. A cell let through leaves a start mark beside the gate file (when, and on which machine): how the
study times cells wherever they run. The study rewrites the gate file (atomically) as measured costs come in.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

GATE_ENV = "SCALELAB_STUDY_GATE"


def write(path: Path, deadline: float | None, costs: dict[str, float | None], stop: bool = False) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"deadline": deadline, "stop": stop, "cells": costs}))
    os.replace(tmp, path)


def refusal(gate: dict, stage: str, now: float) -> str | None:
    """Why `stage` may not start now under `gate`, or None."""
    if stage not in gate.get("cells", {}):
        return None
    if gate.get("stop"):
        return "the study is stopping"
    deadline, cost = gate.get("deadline"), gate["cells"][stage]
    if deadline is None:
        return None
    if now >= deadline:
        return "the study's time budget is spent"
    if cost is not None and now + cost > deadline:
        return f"its estimated {cost:.0f} s would end {now + cost - deadline:.0f} s past the study's time budget"
    return None


def admit(stage: str, share: dict[str, str] | None = None) -> str | None:
    """None when `stage` may start (its start is marked, with the machine and the share of it the cell got); else
    why not. No gate file named: every stage starts."""
    if not (name := os.environ.get(GATE_ENV)):
        return None
    path = Path(name)
    try:
        gate = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    now = time.time()
    if (why := refusal(gate, stage, now)) or stage not in gate.get("cells", {}):
        return why
    marks = started_dir(path)
    marks.mkdir(parents=True, exist_ok=True)
    mark = {"stage": stage, "t": now, "machine": machine(share or {})}
    tmp = marks / f".{stage}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(mark))
    os.replace(tmp, marks / f"{stage}.json")
    return None


def started_dir(path: Path) -> Path:
    return path.with_name(path.name + ".started")


def started(path: Path) -> dict[str, dict]:
    """The start marks: {stage: {"t": time, "machine": ...}} of the cells the gate let through."""
    marks = started_dir(path)
    out = {}
    for f in marks.glob("*.json") if marks.is_dir() else ():
        try:
            mark = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out[mark["stage"]] = mark
    return out


def machine(share: dict[str, str]) -> dict:
    """This machine, as a cell records it: host, CPU model and cores, the threads and GPUs of its share, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus = share.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
            "gpus": [g for g in gpus.split(",") if g.strip()] if gpus else [],
            "threads": share.get("SCALELAB_THREADS", os.environ.get("SCALELAB_THREADS")),
            "python": platform.python_version()}

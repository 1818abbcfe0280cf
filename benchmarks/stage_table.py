"""The pipeline flow's stage table: each stage cell's wall time in one flow run and the run's critical path, read from
that run's Prefect records (nothing is rerun). Run it after `make repro` on a fresh clone, of this commit or another
one (its --root), to compare the default DAG's stages before and after a change:

    python benchmarks/stage_table.py [--root DIR] [--flow-run NAME|ID] [--all]

The flow run: the latest finished run of the flow `scalelab-pipeline` in <root>/.prefect (the project's Prefect home,
read through a temporary Prefect server on that database), or the one named. Per stage cell:
- start: the flow's line "<stage>: dvc repro" (a worker's share of the cores taken), else its task run's start;
- wall: from start to the task run's end (DVC's process, the stage's imports, its work, DVC's bookkeeping); a stage the
  flow found up to date has none;
- wait: from the end of its last upstream task to its start (no worker free: another cell held the cores).
The critical path is the chain of stages through the task graph (each task run's upstream task runs, as the flow
submitted them) whose walls sum highest: how long the flow would take with a worker for every ready stage. Beside it:
the flow's own wall (its first stage's start to its last stage's end) and the sum of the walls (its work for one
worker). The table lists the stages above 1 % of the flow's wall (`--all`: every one), then the totals by stage; the
last lines are JSON, with the goal of issue's default run (`make repro` within 900 s on 2 cores with its install,
about 145 s: the flow within 755 s).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOW = "scalelab-pipeline"
STARTED = re.compile(r"^(?P<stage>\S+): dvc repro, ")  # flows/pipeline.py run_stage, once its share is taken
UP_TO_DATE = re.compile(r"^(?P<stage>\S+): up to date$")
GOAL_FLOW_S = 900 - 145  # make repro's 15 minutes less make setup's measured install (141-148 s on 2 cores)


@dataclass
class Stage:
    name: str
    start: float  # seconds from the flow's first stage start
    end: float
    upstream: list[str]
    ran: bool
    state: str

    @property
    def wall(self) -> float:
        return self.end - self.start if self.ran else 0.0


def critical_path(stages: dict[str, Stage]) -> tuple[float, list[str]]:
    """The longest chain by summed walls through the upstream graph (a DAG): its length and its stages, first first."""
    best: dict[str, tuple[float, list[str]]] = {}

    def longest(name: str) -> tuple[float, list[str]]:
        if name not in best:
            ups = [longest(u) for u in stages[name].upstream if u in stages]
            length, path = max(ups, default=(0.0, []), key=lambda x: x[0])
            best[name] = (length + stages[name].wall, [*path, name])
        return best[name]

    sys.setrecursionlimit(max(1000, 4 * len(stages)))
    return max((longest(n) for n in stages), default=(0.0, []), key=lambda x: x[0])


def read_flow_run(root: Path, which: str | None) -> tuple[str, dict[str, Stage]]:
    """The flow run's name and its stages, from the Prefect home <root>/.prefect."""
    if not (root / ".prefect/prefect.db").is_file():
        sys.exit(f"{root / '.prefect/prefect.db'}: no Prefect database (run `make repro` in {root} first)")
    os.environ["SCALELAB_ROOT"] = str(root)
    for var in ("PREFECT_HOME", "PREFECT_API_URL"):  # that project's database, not a server or home left configured
        os.environ.pop(var, None)
    import scalelab  # noqa: F401  its Prefect home (<root>/.prefect) and the temporary server's startup patience

    from prefect import get_client
    from prefect.client.schemas.filters import (FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState,
                                                FlowRunFilterStateType, LogFilter, LogFilterFlowRunId, TaskRunFilter,
                                                TaskRunFilterFlowRunId)
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort, LogSort

    with get_client(sync_client=True) as client:
        finished = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
            any_=[StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED])))
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW])), flow_run_filter=finished,
                                     sort=FlowRunSort.START_TIME_DESC, limit=200)
        run = next((r for r in runs if which in (None, r.name, str(r.id))), None)
        if run is None:
            known = ", ".join(f"{r.name} ({r.state_type.value.lower()})" for r in runs[:10]) or "none"
            sys.exit(f"no finished {FLOW} flow run {which or ''} in {root / '.prefect'} (finished runs: {known})")
        tasks, logs = [], []
        while page := client.read_task_runs(task_run_filter=TaskRunFilter(
                flow_run_id=TaskRunFilterFlowRunId(any_=[run.id])), limit=200, offset=len(tasks)):
            tasks += page
        flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id]))
        while page := client.read_logs(flt, limit=200, offset=len(logs), sort=LogSort.TIMESTAMP_ASC):
            logs += page
    started: dict[str, datetime] = {}
    fresh: set[str] = set()
    for log in logs:
        if m := STARTED.match(log.message):
            started.setdefault(m["stage"], log.timestamp)  # the first attempt's (a retry keeps the first start)
        elif m := UP_TO_DATE.match(log.message):
            fresh.add(m["stage"])
    by_id = {str(t.id): t.name for t in tasks}
    stamps = {t.name: (started.get(t.name) or t.start_time, t.end_time) for t in tasks if t.start_time and t.end_time}
    if not stamps:
        sys.exit(f"flow run {run.name}: no finished task runs")
    zero = min(s for s, _ in stamps.values())
    stages = {}
    for t in tasks:
        if t.name not in stamps:
            continue
        start, end = stamps[t.name]
        ups = [by_id[str(i.id)] for i in t.task_inputs.get("upstream", []) if str(getattr(i, "id", "")) in by_id]
        stages[t.name] = Stage(t.name, (start - zero).total_seconds(), (end - zero).total_seconds(), ups,
                               ran=t.name in started and t.name not in fresh, state=t.state_name or "?")
    return run.name, stages


def table(stages: dict[str, Stage], path: list[str], flow_wall: float, show_all: bool) -> list[str]:
    rows = sorted(stages.values(), key=lambda s: s.start)
    out = [f"{'stage':44s} {'start':>7s} {'wall':>7s} {'wait':>6s}  state", "-" * 76]
    for s in rows:
        if not show_all and s.wall < 0.01 * flow_wall:
            continue
        ends = [stages[u].end for u in s.upstream if u in stages]
        wait = max(0.0, s.start - max(ends)) if ends else 0.0
        mark = " *" if s.name in path else ""
        out.append(f"{s.name:44s} {s.start:7.1f} {s.wall:7.1f} {wait:6.1f}  {s.state if s.ran else 'up to date'}"
                   f"{mark}")
    groups: dict[str, list[float]] = defaultdict(list)
    for s in rows:
        groups[s.name.split("@")[0]].append(s.wall)
    out += ["", f"{'stage (all cells)':30s} {'cells':>5s} {'sum s':>8s} {'max s':>7s}", "-" * 54]
    out += [f"{g:30s} {len(w):5d} {sum(w):8.1f} {max(w):7.1f}"
            for g, w in sorted(groups.items(), key=lambda kv: -sum(kv[1]))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT, help="the project whose flow run to read (default: this one)")
    ap.add_argument("--flow-run", help="a flow run's name or id (default: the latest finished)")
    ap.add_argument("--all", action="store_true", help="every stage in the table, not only those above 1%% of the wall")
    args = ap.parse_args()
    if not (args.root / ".prefect/prefect.db").is_file() and args.flow_run is None:
        # it reads a flow run and reruns nothing: in `make bench` on a fresh clone there is none to read, which is no
        # failure of the flow (as gpu_check without CUDA); a run named with --flow-run must exist
        print(json.dumps({"benchmark": "stage_table", "skipped": f"no flow run in {args.root.resolve()} "
                          "(run `make repro` there first)"}))
        return
    name, stages = read_flow_run(args.root.resolve(), args.flow_run)
    flow_wall = max(s.end for s in stages.values())
    length, path = critical_path(stages)
    total = sum(s.wall for s in stages.values())
    print(f"flow run {name} in {args.root.resolve()}: {len(stages)} stages, {sum(s.ran for s in stages.values())} ran")
    print("\n".join(table(stages, path, flow_wall, args.all)))
    print(f"\ncritical path ({length:.1f} s, * above): {' -> '.join(path)}")
    lines = [{"benchmark": "stage_table", "metric": "flow_wall_s", "flow_run": name, "value": round(flow_wall, 1),
              "goal": f"<= {GOAL_FLOW_S} (make repro <= 900 s with its install)"},
             {"benchmark": "stage_table", "metric": "critical_path_s", "value": round(length, 1),
              "stages": len(path)},
             {"benchmark": "stage_table", "metric": "stage_walls_sum_s", "value": round(total, 1),
              "parallelism": round(total / flow_wall, 2) if flow_wall else None}]
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()

"""The flow's markdown artifact (flows/pipeline.py): each stage, what happened to it, its MLflow run, the report."""

import json
from pathlib import Path

import networkx as nx
from prefect.states import State

from scalelab import tracking


def recorded_run(outs: list[Path]) -> str | None:
    """The run id a stage recorded in its outs (`mlflow_run.json`): the run that produced a cached result."""
    for out in outs:
        path = out / "mlflow_run.json" if out.is_dir() else out
        if path.name == "mlflow_run.json" and path.is_file():
            return json.loads(path.read_text()).get("run_id")
    return None


def summary(results: list[dict], graph: nx.DiGraph, parent: tracking.StageRun, root: Path) -> str:
    """The markdown artifact: each stage, what happened, its MLflow run; the report when there is one."""
    children = {c["stage"]: c for c in tracking.child_runs(parent.run_id)} if parent.run_id else {}
    lines = [f"MLflow: `{tracking.public_uri()}`, experiment `{parent.experiment}`, parent run `{parent.run_id}`", ""]
    lines += ["| stage | status | MLflow run |", "|---|---|---|"]
    for r in results:
        child = children.get(r["stage"])
        run_id = child["run_id"] if child else recorded_run(graph.nodes[r["stage"]]["outs"])
        url = run_id and parent.experiment_id and tracking.run_url(parent.experiment_id, run_id)
        link = f"[{run_id[:12]}]({url})" if url else f"`{run_id}`" if run_id else ""
        lines.append(f"| `{r['stage']}` | {r['status']} | {link} |")
    reports = [o for s in graph if "report" in s.split("@")[0] for o in graph.nodes[s]["outs"] if o.exists()]
    lines += ["", *(f"Report: `{o.relative_to(root)}`" for o in reports)]
    return "\n".join(lines)


def status(state: State) -> str:
    """A task's final state as the artifact shows it: its result, "failed", or "not run" (upstream failed)."""
    if state.is_completed():
        return state.result()
    return "failed" if state.is_failed() or state.is_crashed() else "not run"

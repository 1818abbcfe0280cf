"""The Prefect flow that runs the DVC pipeline, one task per stage cell (DESIGN "Contracts: Prefect").

    python flows/pipeline.py                                   # every stage
    python flows/pipeline.py --target pretrain                 # every cell of a matrix stage (+ what they need)
    python flows/pipeline.py --target pretrain@standard-s-0 --downstream   # a cell and everything that depends on it

DVC owns the DAG and the cache: the flow reads the stage graph from DVC, so stages added later are picked up, and each
task runs `dvc repro --single-item <stage>` in a subprocess (training owns its process: Lightning's DDP launcher
re-executes the command), one at a time since DVC allows one repro per workspace, its output streamed into the Prefect
log. A stage `dvc status` reports up to date, none of whose dependencies ran in this flow, is skipped without a
subprocess, so a second run reruns nothing. The flow opens the MLflow parent run that the stages' child runs nest
under, and ends with a markdown artifact linking them.
"""

import scalelab  # noqa: I001  first: sets PREFECT_HOME, telemetry off and the MLflow URI before prefect reads them

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
import yaml
from dvc.repo import Repo
from dvc.stage import PipelineStage
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from scalelab import profile, tracking

DEFAULT_RETRIES = 2  # every stage is idempotent: training resumes from its checkpoint
# Stage-name prefix -> retries. Data stages are deterministic: a retry would only repeat the same error.
RETRIES = {"prepare": 0, "tokenize": 0}


def retries_for(stage: str) -> int:
    return next((n for prefix, n in RETRIES.items() if stage.startswith(prefix)), DEFAULT_RETRIES)


def stage_graph(root: Path) -> nx.DiGraph:
    """DVC's pipeline stages by address (`name`, `name@cell`), edges from a stage to the stages it needs, `outs`."""
    with Repo(str(root)) as repo:
        stages = [s for s in repo.index.stages if isinstance(s, PipelineStage)]
        graph = repo.index.graph.subgraph(stages)
        named = nx.relabel_nodes(graph, {s: s.addressing for s in stages})
        for s in stages:
            named.nodes[s.addressing]["outs"] = [Path(o.fs_path) for o in s.outs]
    return named


def select(graph: nx.DiGraph, targets: list[str] | None = None, downstream: bool = False) -> list[str]:
    """The stages to run in dependency order. As `dvc repro`: a target brings the stages it needs, or with
    `downstream` the stages that need it; a matrix stage's name selects all its cells."""
    chosen = set(graph)
    if targets:
        chosen = set()
        for target in targets:
            cells = [s for s in graph if target in (s, s.split("@")[0])]
            if not cells:
                raise ValueError(f"unknown stage {target!r}; known: {', '.join(sorted(graph))}")
            for cell in cells:
                chosen |= {cell} | (nx.ancestors(graph, cell) if downstream else nx.descendants(graph, cell))
    return [s for s in nx.lexicographical_topological_sort(graph.reverse()) if s in chosen]


def changed_stages(root: Path) -> set[str] | None:
    """The stages `dvc status` reports changed; None when it cannot tell (then every stage goes through DVC)."""
    try:
        with Repo(str(root)) as repo:
            return set(repo.status())
    except Exception:
        return None


@task(task_run_name="{stage}", retries=DEFAULT_RETRIES, retry_delay_seconds=5, cache_policy=NO_CACHE)
def run_stage(stage: str, root: str, extra_env: dict[str, str]) -> str:
    """`dvc repro --single-item <stage>` with its output streamed into the Prefect log; returns what DVC did."""
    logger = get_run_logger()
    env = {**os.environ, **extra_env, "PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` in cmds: this venv
    cmd = [sys.executable, "-m", "dvc", "repro", "--single-item", stage]
    outcome, tail = "up to date", []
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace"}
    with subprocess.Popen(cmd, cwd=root, env=env, **pipe) as proc:
        for line in proc.stdout:
            if not (line := line.rstrip()):
                continue
            logger.info(line)
            tail = [*tail[-19:], line]
            if line.startswith(f"Running stage '{stage}'"):
                outcome = "ran"
            elif line.startswith(f"Stage '{stage}' is cached"):
                outcome = "restored from cache"
    if proc.returncode:
        raise RuntimeError(f"stage {stage} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    return outcome


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


def _experiment(root: Path) -> str:
    params = root / "params.yaml"
    raw = yaml.safe_load(params.read_text()) if params.is_file() else None
    return ((raw or {}).get("tracking") or {}).get("experiment", "scalelab")


@flow(name="scalelab-pipeline")
def pipeline(targets: list[str] | None = None, downstream: bool = False, params_file: str | None = None) -> list[dict]:
    """Run the DVC stages (all, or `targets` as `dvc repro` would) as Prefect tasks; returns each stage's status.

    `params_file` switches the profile first (validated, then copied over params.yaml; the old one kept as .prev)."""
    logger, root = get_run_logger(), scalelab.project_root()
    if params_file and Path(params_file).resolve() != (root / "params.yaml").resolve():
        profile.switch(Path(params_file), root / "params.yaml")
        logger.info(f"params.yaml <- {params_file}")
    graph = stage_graph(root)
    order, changed = select(graph, targets, downstream), changed_stages(root)
    logger.info(f"{len(order)} stages: {', '.join(order)}")
    results: list[dict] = []
    tags = {"prefect.flow_run_id": flow_run.id, "scalelab.targets": " ".join(targets or ["all"])}
    with tracking.pipeline_run(f"pipeline {flow_run.name}", experiment=_experiment(root), tags=tags) as parent:
        env = {tracking.FLOW_RUN_ENV: flow_run.id} | ({tracking.PARENT_ENV: parent.run_id} if parent.run_id else {})
        executed, failed = set(), None
        for stage in order:
            if failed:
                status = "not run"
            elif changed is not None and stage not in changed and not executed & set(graph.successors(stage)):
                status = "up to date"
            else:
                try:
                    status = run_stage.with_options(retries=retries_for(stage))(stage, str(root), env)
                except Exception as err:
                    status, failed = "failed", err
            if status in ("ran", "restored from cache"):
                executed.add(stage)
            results.append({"stage": stage, "status": status})
        markdown = summary(results, graph, parent, root)
        create_markdown_artifact(markdown, key="scalelab-pipeline", description="DVC stages and their MLflow runs")
        if (report_md := root / "data/report/report.md").is_file():  # the report and its ledger, in Prefect
            create_markdown_artifact(report_md.read_text(), key="scalelab-report", description=str(report_md))
        if failed:
            raise RuntimeError(f"pipeline stopped: {failed}") from failed
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Run the DVC pipeline as a Prefect flow.")
    ap.add_argument("--target", action="append", dest="targets", help="a stage or matrix cell (repeatable)")
    ap.add_argument("--downstream", action="store_true", help="run the targets and what depends on them")
    ap.add_argument("--params-file", help="a params file (e.g. configs/cpu-study.yaml) to switch in first")
    args = ap.parse_args()
    pipeline(targets=args.targets, downstream=args.downstream, params_file=args.params_file)

"""The DVC pipeline as the flow sees it (flows/pipeline.py): DVC's stage graph, the stages a target selects (as
`dvc repro` would), and what `dvc status` reports changed."""

import contextlib
from pathlib import Path

import networkx as nx
from dvc.repo import Repo
from dvc.stage import PipelineStage


def _repo(root: Path, repo: Repo | None):
    """`repo` itself when given (the caller's open repository and its index, read once), else one opened here."""
    return contextlib.nullcontext(repo) if repo is not None else Repo(str(root))


def stage_graph(root: Path, repo: Repo | None = None) -> nx.DiGraph:
    """DVC's pipeline stages by address (`name`, `name@cell`), edges from a stage to the stages it needs, `outs`
    and `cmd`."""
    with _repo(root, repo) as repo:
        stages = [s for s in repo.index.stages if isinstance(s, PipelineStage)]
        graph = repo.index.graph.subgraph(stages)
        named = nx.relabel_nodes(graph, {s: s.addressing for s in stages})
        for s in stages:
            named.nodes[s.addressing]["outs"] = [Path(o.fs_path) for o in s.outs]
            named.nodes[s.addressing]["cmd"] = s.cmd
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


def changed_stages(root: Path, only: list[str] | None = None, repo: Repo | None = None) -> set[str] | None:
    """The stages `dvc status` reports changed, of `only` when given (their status alone, read from the one index:
    DVC's own targets would read dvc.yaml again for each); None when it cannot tell (then every stage goes through
    DVC). `repo`: an open repository whose index is current (the flow's, just read for its graph)."""
    try:
        with _repo(root, repo) as repo:
            if only is None:
                return set(repo.status())
            wanted = set(only)
            with repo.lock:  # as DVC's own status holds it
                return {s.addressing for s in repo.index.stages if s.addressing in wanted and s.status()}
    except Exception:
        return None

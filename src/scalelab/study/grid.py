"""A study's grid as DVC resolves it: its stage cells, each with its key and the hash of what it reads.

DVC expands the study's profile (with the spec's overrides) into stage cells, as `dvc repro` would; nothing here
reimplements the matrix. For each cell of the grid:

- its params: the params DVC tracks for it (dvc.yaml `params:`, resolved against the profile), and those of every
  stage it needs (prepare, tokenizer, ...): a cell's result depends on its upstream stages' params too;
- its key: sha256 of its address (stage and cell) and those params. Two cells share a key exactly when DVC would
  see the same params for the cell and its upstream stages;
- its inputs: DVC's md5 of every file or folder that it and its upstream stages read and no stage produces (the
  code in src/ and stages/, committed inputs such as the corpus; params files excluded, their values are in the
  key), and its code hash, sha256 of those. Equal keys with different code hashes: the same experiment, run by
  other code (stale).

The keys and code hashes of a committed cell are computed by the same functions from what it recorded (the lock
entries DVC wrote for it), restricted to the params today's pipeline tracks (`Pipeline`), so a key that a stage
stops tracking (a machine setting that stopped being a param) drops out of both sides.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scalelab.study.spec import SpecError, StudySpec

PARAMS_FILE = "params.yaml"


@dataclass(frozen=True)
class Pipeline:
    """What today's dvc.yaml says about the grid's stages: the params keys each tracks ({address: {file: [keys]}}),
    the stages each needs, every out path, and the params files (deps whose content is the key's business)."""

    tracked: dict[str, dict[str, list[str]]]
    upstream: dict[str, list[str]]
    produced: tuple[str, ...]
    params_files: frozenset[str]

    def is_input(self, path: str) -> bool:
        """A dep no stage produces and no params file: code or a committed input."""
        if path in self.params_files:
            return False
        return not any(path == o or path.startswith(o + "/") or o.startswith(path + "/") for o in self.produced)


@dataclass(frozen=True)
class Cell:
    address: str                    # pretrain@none-xs-0
    stage: str                      # pretrain
    item: dict[str, Any]            # its matrix values ({} for a plain stage)
    params: dict[str, dict]         # {params file: {key: value}}, as DVC records them in dvc.lock
    upstream: dict[str, dict]       # {upstream stage: its params}
    inputs: dict[str, str]          # {path: DVC md5} of the code and inputs it and its upstream stages read
    files: tuple[str, ...]          # its small results: the outs kept out of DVC's cache (metrics, curves)
    key: str = field(default="")
    code_hash: str = field(default="")


@dataclass(frozen=True)
class Grid:
    cells: list[Cell]
    pipeline: Pipeline
    group_sizes: dict[str, int] = field(default_factory=dict)   # every cell of each grid stage, before filters


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def restrict(params: dict | None, keys: dict[str, list[str]]) -> dict | None:
    """`params` ({file: {key: value}}) cut to the keys a stage tracks today; None when one of them is absent."""
    params = params or {}
    out = {}
    for file, names in keys.items():
        have = params.get(file) or {}
        if any(k not in have for k in names):
            return None
        out[file] = {k: have[k] for k in names}
    return out


def key_of(address: str, params: dict | None, upstream: dict[str, dict], pipeline: Pipeline) -> str:
    """The cell key: its address and the params of it and its upstream stages, as today's pipeline tracks them."""
    own = restrict(params, pipeline.tracked[address])
    ups = {a: restrict(upstream.get(a), pipeline.tracked[a]) for a in pipeline.upstream[address]}
    return digest({"address": address, "params": own, "upstream": ups})


def code_hash(inputs: dict[str, str], pipeline: Pipeline) -> str:
    return digest(sorted((p, md5) for p, md5 in inputs.items() if pipeline.is_input(p)))


def write_params(spec: StudySpec, root: Path, target: Path) -> None:
    """The study's params: its profile with the spec's overrides set, validated as the stages will load it (with
    this machine's machine.yaml beside `target` when there is one), then written over `target` whole."""
    from scalelab.config import ParamsError, machine, parse_params, profiles
    from scalelab.config.params import read_yaml

    source = root / spec.profile
    try:
        raw = read_yaml(source)
    except ParamsError as err:
        raise SpecError(f"study {spec.name}: profile: {err}") from None
    try:
        machine.refuse_inline(raw, str(spec.profile))
    except ParamsError as err:
        raise SpecError(f"study {spec.name}: {err}") from None
    text = profiles.complete_text(source)
    overrides = {f"params.{k}": (k, v) for k, v in spec.params.items()}
    if spec.store is not None:  # the project-relative folder: the same path in the project and (linked) the workspace
        overrides["store.param"] = (spec.store.param, str(spec.store_folder()))
    for where, (dotted, value) in overrides.items():
        node, parts = raw, dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                raise SpecError(f"study {spec.name}: {where}: {'.'.join(parts[:i + 1])} is not a "
                                f"section of {spec.profile}")
        node[parts[-1]] = value
    if overrides:
        text = f"# {spec.profile} with the study's params (configs/studies/{spec.name}.yaml)\n"
        text += yaml.safe_dump(raw, sort_keys=False)
    local = machine.read_machine(machine.machine_path(target))
    try:
        parse_params(raw, f"{spec.profile} with the study's params", local)
    except ParamsError as err:
        raise SpecError(f"study {spec.name}: {err}") from None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


def dvc_workdir(path: Path, dvc_yaml: Path) -> None:
    """A folder DVC can resolve the pipeline in: dvc.yaml and a .dvc/ without git (params.yaml: write_params)."""
    (path / ".dvc").mkdir(parents=True, exist_ok=True)
    (path / ".dvc" / "config").write_text("[core]\n    no_scm = true\n    analytics = false\n")
    (path / "dvc.yaml").write_bytes(dvc_yaml.read_bytes())


def resolve(spec: StudySpec, workdir: Path, code_root: Path) -> Grid:
    """The study's cells as DVC resolves `workdir` (its dvc.yaml and params.yaml); inputs hashed in `code_root`."""
    import networkx as nx
    from dvc.dependency.param import ParamsDependency
    from dvc.dvcfile import load_file
    from dvc.parsing import EntryDefinition
    from dvc.repo import Repo
    from dvc.stage import PipelineStage
    from dvc.utils.serialize import parse_yaml

    with Repo(str(workdir)) as repo:
        dvcfile = load_file(repo, str(workdir / "dvc.yaml"))
        definitions = dvcfile.resolver.definitions
        chosen: dict[str, dict] = {}
        sizes: dict[str, int] = {}
        for i, entry in enumerate(spec.grid):
            if entry.stage not in definitions:
                raise SpecError(f"study {spec.name}: grid.{i}.stage: no stage {entry.stage!r} in dvc.yaml "
                                f"(stages: {', '.join(definitions)})")
            d = definitions[entry.stage]
            items = {"": {}} if isinstance(d, EntryDefinition) else d.normalized_iterable
            sizes[entry.stage] = len(items)
            for pattern in entry.cells or ():
                if not any(fnmatch.fnmatchcase(k, pattern) for k in items):
                    raise SpecError(f"study {spec.name}: grid.{i}.cells: {pattern!r} matches no cell of "
                                    f"{entry.stage} (e.g. {', '.join(list(items)[:3])})")
            for k, item in items.items():
                if entry.cells and not any(fnmatch.fnmatchcase(k, p) for p in entry.cells):
                    continue
                item = _plain(item)
                item = item if isinstance(item, dict) else {"item": item}
                chosen.setdefault(f"{entry.stage}@{k}" if k else entry.stage, item)
        axis = {item["seed"] for item in chosen.values() if "seed" in item}
        if axis and (absent := sorted(set(spec.seeds) - axis)):
            raise SpecError(f"study {spec.name}: seeds: {absent} not in the grid's seeds {sorted(axis)}")
        chosen = {a: item for a, item in chosen.items() if "seed" not in item or item["seed"] in spec.seeds}

        stages = {s.name: s for s in repo.index.stages if isinstance(s, PipelineStage)}
        graph = nx.relabel_nodes(repo.index.graph.subgraph(list(stages.values())), {s: s.name for s in stages.values()})
        needed = {a: sorted(nx.descendants(graph, a)) for a in chosen}
        involved = set(chosen) | {u for ups in needed.values() for u in ups}
        produced = tuple(sorted({o.def_path for s in stages.values() for o in s.outs}))
        tracked, reads, params_files = {}, {}, set()
        for a in involved:
            deps = stages[a].deps
            tracked[a] = {d.def_path: list(d.params) for d in deps if isinstance(d, ParamsDependency)}
            params_files |= set(tracked[a])
            reads[a] = [d.def_path for d in deps if not isinstance(d, ParamsDependency)]
        pipeline = Pipeline(tracked, needed, produced, frozenset(params_files))
        values = {f: parse_yaml((workdir / f).read_text(), f) for f in params_files}

        def params(a: str) -> dict:
            out = {}
            for file, keys in tracked[a].items():
                out[file] = {k: _lookup(values[file], k, a, file) for k in keys}
            return out

        paths = sorted({p for a in involved for p in reads[a] if pipeline.is_input(p)})
        hashes = hash_inputs(code_root, paths)
        cells = []
        for a, item in chosen.items():
            stage = stages[a]
            inputs = {p: hashes[p] for u in (a, *needed[a]) for p in reads[u] if p in hashes}
            upstream = {u: params(u) for u in needed[a]}
            files = tuple(o.def_path for o in stage.outs if not o.use_cache)
            cell = Cell(a, a.split("@")[0], item, params(a), upstream, inputs, files)
            cells.append(Cell(**{**cell.__dict__, "key": key_of(a, cell.params, upstream, pipeline),
                                 "code_hash": code_hash(inputs, pipeline)}))
    return Grid(cells, pipeline, sizes)


def _plain(value):
    """A matrix/foreach item as plain Python (DVC hands out its context's nodes)."""
    from dvc.parsing.context import Node

    if isinstance(value, Node):
        value = value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _lookup(values: dict, dotted: str, address: str, file: str):
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise SpecError(f"{address} tracks {file}:{dotted}, which the study's params lack")
        node = node[part]
    return node


def hash_inputs(code_root: Path, paths: list[str]) -> dict[str, str]:
    """DVC's md5 of each path under `code_root` (a folder's `.dir` tree hash, .dvcignore applied), "absent" for a
    path that is not there (DVC would refuse the stage: the hash differs from any recorded one)."""
    from dvc.repo import Repo
    from dvc_data.hashfile.build import build

    out = {}
    with Repo(str(code_root)) as repo:
        for p in paths:
            full = Path(p) if os.path.isabs(p) else code_root / p
            if not full.exists():
                out[p] = "absent"
                continue
            _, _, obj = build(repo.cache.local, str(full), repo.fs, "md5", ignore=repo.dvcignore, dry_run=True)
            out[p] = obj.hash_info.value
    return out


def plan_grid(spec: StudySpec, root: Path) -> Grid:
    """The grid resolved in a temporary folder (nothing of the project or the study's workspace touched)."""
    with tempfile.TemporaryDirectory(prefix=f"study-{spec.name}-") as tmp:
        work = Path(tmp)
        dvc_workdir(work, root / "dvc.yaml")
        if (root / "machine.yaml").is_file():
            (work / "machine.yaml").write_bytes((root / "machine.yaml").read_bytes())
        write_params(spec, root, work / PARAMS_FILE)
        return resolve(spec, work, root)

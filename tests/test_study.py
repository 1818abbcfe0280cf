"""`scalelab study`: a study's grid run as the pipeline's cells, kept in results/<name>/cells/ as they finish, and
resumed from what is committed (scalelab.study).

The fast tests build the micro study's grid with DVC in a copy of the project and check the plan, the budget, the
gate the flow asks, stale and changed cells against fabricated committed ones, and the spec's errors. The slow one
runs a three-cell micro study in a clone and kills every process of it with SIGKILL in the middle of a cell, commits
the cells kept by then, and finishes the study from a fresh `git clone`: no kept cell is recomputed, and the cells'
results and the ledger equal the uninterrupted run's. Its three cells are cells of the whole micro DAG, whose build
(conftest's micro_build, once per test run) is that uninterrupted run.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from workspace import MICRO, seed_check_verdicts, seed_mlflow_store, seed_prefect_home, workspace_copy

from scalelab.study import cells, costs, gate, grid, spec
from scalelab.runtime import yamlio

crash_spec = importlib.util.spec_from_file_location("flow_crash", ROOT / "benchmarks" / "flow_crash.py")
crash = importlib.util.module_from_spec(crash_spec)  # a process tree's marks, kill_tree, timing-free metrics
crash_spec.loader.exec_module(crash)

# Three tiny cells (variants none, standard, unified at size a): seconds each. Their params are the micro profile's
# (the grid's sizes are no params of a cell), so the micro DAG's build holds each one's uninterrupted result.
SPEC = """\
profile: tests/micro_params.yaml
params:
  pretrain.grid.sizes: [a]
  evaluate.sizes: [a]
grid:
  - stage: pretrain
seeds: [0]
generator: micro_ledger:ledger
ledger: claims_a.json
"""
# The micro study's ledger: an observation per cell (its final validation loss), read from its committed cells
LEDGER = '''\
import json
from scalelab.ledger import claims
from scalelab.study import cells

def ledger(folder):
    out = []
    for name, path in cells.files(folder, "metrics/pretrain").items():
        m = json.loads(path.read_text())
        reg = claims.regime("micro", params=m["params"], tokens=m["tokens"], steps=m["steps"])
        out.append(claims.observation(f"micro.{name}", f"{name}: final val loss", "val_loss", m["val_loss"], 1,
                                      "none", regime=reg, why="a test study"))
    return out
'''
CELLS = ["pretrain@none-a-0", "pretrain@standard-a-0", "pretrain@unified-a-0"]


def _git(ws: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=ws, check=True,
                   capture_output=True)


def _project(path: Path) -> dict[str, str]:
    """A copy of the code in a fresh git repo with the micro study's spec and generator committed."""
    env = workspace_copy(path, MICRO)
    (path / "configs" / "studies").mkdir(parents=True, exist_ok=True)
    (path / "configs" / "studies" / "micro.yaml").write_text(SPEC)
    (path / "src" / "micro_ledger.py").write_text(LEDGER)
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "micro study")
    return env


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    path = tmp_path_factory.mktemp("study") / "project"
    _project(path)
    return path


def _fake_lock(cell: grid.Cell) -> dict:
    """What DVC's lock records for a cell, built from the grid (every input on the cell's own entry)."""
    lock = {u: {"params": p} for u, p in cell.upstream.items()}
    lock[cell.address] = {"params": cell.params, "deps": [{"path": p, "md5": m} for p, m in cell.inputs.items()]}
    return lock


def _commit_cell(results: Path, g: grid.Grid, cell: grid.Cell, wall: float, tmp: Path, params=None) -> Path:
    lock = _fake_lock(cell)
    if params is not None:
        lock[cell.address]["params"] = params
    src = {}
    for rel in cell.files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(json.dumps({"val_loss": 1.0}) if rel.endswith(".json") else "step,val_loss\n")
        src[rel] = tmp / rel
    meta = cells.record(cell, lock, g.pipeline, {r: "x" for r in src}, commit="abc1234", dirty=False, wall_s=wall,
                        machine=None, origin="test")
    return cells.persist(results, meta, src)


# ---------------------------------------------------------------- fast: spec, plan, budget, stale, gate
def test_a_bad_spec_fails_in_one_line_naming_the_key(project):
    path = project / "configs" / "studies" / "bad.yaml"
    for text, needle in [(SPEC + "colour: red\n", "colour: unknown key"),
                         (SPEC.replace("stage: pretrain", "stage: pretrain\n    cellz: [x]"), "grid.0.cellz"),
                         (SPEC.replace("micro_ledger:ledger", "micro_ledger"), "generator: "),
                         (SPEC.replace("seeds: [0]", "seeds: []"), "seeds:"),
                         (SPEC.replace("tests/micro_params.yaml", "nowhere.yaml"), "profile: nowhere.yaml not found"),
                         (SPEC.replace("ledger: claims_a.json\n", ""), "generator and ledger go together")]:
        path.write_text(text)
        with pytest.raises(spec.SpecError) as err:
            spec.load(project, "bad")
        assert needle in str(err.value) and "\n" not in str(err.value), err.value
    for text, needle in [(SPEC.replace("stage: pretrain", "stage: pretrian"), "grid.0.stage: no stage 'pretrian'"),
                         (SPEC.replace("seeds: [0]", "seeds: [0, 7]"), "seeds: [7] not in the grid's seeds"),
                         (SPEC.replace("  - stage: pretrain", "  - stage: pretrain\n    cells: [x-*]"),
                          "grid.0.cells: 'x-*' matches no cell"),
                         (SPEC.replace("  evaluate.sizes: [a]\n", ""), "evaluate.sizes")]:
        path.write_text(text)
        with pytest.raises(spec.SpecError) as err:
            grid.plan_grid(spec.load(project, "bad"), project)
        assert needle in str(err.value) and "\n" not in str(err.value), err.value
    path.unlink()
    with pytest.raises(spec.SpecError, match=r"no study 'bad'.*studies: (.*, )?micro\b"):
        spec.load(project, "bad")


def test_plan_budget_and_stale_cells(project, tmp_path, capsys, monkeypatch):
    from scalelab.study import run

    study = spec.load(project, "micro")
    g = grid.plan_grid(study, project)
    assert [c.address for c in g.cells] == CELLS
    assert len({c.key for c in g.cells}) == 3 and len({c.code_hash for c in g.cells}) == 1
    assert set(g.cells[0].upstream) == {"validate", "prepare", "tokenizer", "tokenize"}
    assert "src/scalelab/model" in g.cells[0].inputs and "corpus" in g.cells[0].inputs
    assert all(not p.startswith("data/") and p != "params.yaml" for p in g.cells[0].inputs)
    results = study.folder(project)
    _commit_cell(results, g, g.cells[0], 60.0, tmp_path)
    _commit_cell(results, g, g.cells[1], 80.0, tmp_path)
    states = [s.state for s in cells.classify(g, cells.read(results))]
    assert states == [cells.DONE, cells.DONE, cells.MISSING]

    monkeypatch.setenv("SCALELAB_ROOT", str(project))
    assert run.main(["micro", "--plan", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 missing" in out and out.count("\nskip   pretrain@") == 2, out
    assert "run    pretrain@unified-a-0: ~70 s (measured: median of 2 pretrain cells)" in out, out
    # a budget of 100 s starts the 70 s cell; 60 s does not (it would end past the budget)
    assert run.main(["micro", "--plan", "--max-minutes", str(100 / 60), "--workers", "1"]) == 0
    assert "would start 1 of them (0 left" in capsys.readouterr().out
    assert run.main(["micro", "--plan", "--max-minutes", "1", "--workers", "1"]) == 0
    assert "would start 0 of them (1 left" in capsys.readouterr().out
    assert run.main(["micro", "--plan", "--cells", "pretrain@none-*"]) == 0
    out = capsys.readouterr().out
    assert "nothing to run" in out and "--cells leaves out 2" in out, out
    assert run.main(["micro", "--plan", "--cells", "nothing-*"]) == 2
    assert "--cells: 'nothing-*' matches no cell" in capsys.readouterr().err

    # the code a cell reads changes: its committed result is stale (kept; rerun only with --refresh)
    norm = project / "src" / "scalelab" / "model" / "norm.py"
    text = norm.read_text()
    norm.write_text(text + "\n# changed\n")
    try:
        g2 = grid.plan_grid(study, project)
        statuses = cells.classify(g2, cells.read(results))
        assert [s.state for s in statuses] == [cells.STALE, cells.STALE, cells.MISSING]
        assert statuses[0].why == "src/scalelab/model" and g2.cells[0].key == g.cells[0].key
        assert run.main(["micro", "--plan"]) == 0
        out = capsys.readouterr().out
        assert "stale  2 pretrain cells ran other code (commit abc1234; changed: src/scalelab/model)" in out, out
        assert "run    pretrain@none-a-0" not in out
        assert run.main(["micro", "--plan", "--refresh"]) == 0
        out = capsys.readouterr().out
        assert "run    pretrain@none-a-0 (stale: rerun): ~60 s (measured: this cell before)" in out, out
    finally:
        norm.write_text(text)

    # a committed cell under other params is not this cell: missing, and its folder is replaced when it reruns
    other = {"params.yaml": {**g.cells[2].params["params.yaml"], "pretrain.max_steps": 99}}
    old = _commit_cell(results, g, g.cells[2], 10.0, tmp_path, params=other)
    s = cells.classify(g, cells.read(results))[2]
    assert (s.state, s.why, s.record.folder) == (cells.MISSING, "params changed", old)
    new = _commit_cell(results, g, g.cells[2], 12.0, tmp_path)
    assert not old.exists() and new.exists() and cells.classify(g, cells.read(results))[2].state == cells.DONE


def test_a_study_run_that_keeps_no_cell_writes_nothing_in_its_results(project, tmp_path, capsys, monkeypatch):
    """`scalelab study NAME` with every selected cell done (or stale, not refreshed) runs no flow and leaves
    results/NAME byte for byte as committed: it rewrote README.md, cells/index.json and study.json from today's code
    (hd-cpt-start's committed README changed in a run that ran nothing)."""
    from scalelab.study import run

    study = spec.load(project, "micro")
    g = grid.plan_grid(study, project)
    results = study.folder(project)
    shutil.rmtree(results / cells.CELLS, ignore_errors=True)  # one cell done, two missing: no ledger to write
    _commit_cell(results, g, g.cells[0], 60.0, tmp_path)
    committed = {"README.md": "# micro\n\nas committed\n", cells.INDEX: "[]\n", "study.json": "{}\n"}
    for rel, text in committed.items():
        (results / rel).write_text(text)
    monkeypatch.setenv("SCALELAB_ROOT", str(project))
    assert run.main(["micro", "--cells", "pretrain@none-*", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "flow:" not in out and f"{results.relative_to(project)} left as it was" in out, out
    assert {rel: (results / rel).read_text() for rel in committed} == committed
    for rel in committed:
        (results / rel).unlink()


def test_a_cell_folder_is_written_whole_or_not_at_all(project, tmp_path):
    study = spec.load(project, "micro")
    g = grid.plan_grid(study, project)
    results = tmp_path / "results"
    final = _commit_cell(results, g, g.cells[0], 5.0, tmp_path)
    base = results / cells.CELLS
    (base / ".tmp-half-written").mkdir()          # a write killed before its rename
    aside = base / f".old-{final.name}-1234abcd"  # a refresh killed between its two renames
    final.rename(aside)
    assert cells.read(results) == []
    cells.cleanup(results)
    assert sorted(p.name for p in base.iterdir()) == [".gitignore", final.name]
    assert [r.address for r in cells.read(results)] == [g.cells[0].address]
    assert ".tmp-*" in (base / ".gitignore").read_text()


def test_the_gate_refuses_a_cell_that_would_end_past_the_budget(tmp_path, monkeypatch):
    path = tmp_path / "gate.json"
    now = time.time()
    gate.write(path, now + 100, {"pretrain@x": 50.0, "pretrain@y": 500.0, "pretrain@z": None})
    g = json.loads(path.read_text())
    assert gate.refusal(g, "pretrain@x", now) is None
    assert "would end" in gate.refusal(g, "pretrain@y", now)
    assert gate.refusal(g, "pretrain@z", now) is None                    # unknown cost: starts while time is left
    assert "spent" in gate.refusal(g, "pretrain@z", now + 101)
    assert gate.refusal(g, "tokenize", now + 101) is None                 # not a cell of the study: never gated
    monkeypatch.delenv(gate.GATE_ENV, raising=False)
    assert gate.admit("pretrain@y") is None and gate.started(path) == {}  # no study: every stage starts
    monkeypatch.setenv(gate.GATE_ENV, str(path))
    assert gate.admit("pretrain@x", {"SCALELAB_THREADS": "2"}) is None
    assert "would end" in gate.admit("pretrain@y")
    mark = gate.started(path)["pretrain@x"]
    assert list(gate.started(path)) == ["pretrain@x"] and mark["machine"]["threads"] == "2"
    gate.write(path, None, {"pretrain@x": 50.0}, stop=True)
    assert "stopping" in gate.admit("pretrain@x")


def test_a_store_is_set_in_the_params_linked_into_the_workspace_and_exempts_its_cells_from_costs(project, tmp_path):
    from scalelab.study import run, workspace

    path = project / "configs" / "studies" / "stored.yaml"
    store = "store:\n  param: compress.store\n  stages: [pretrain]\n"
    for text, needle in [(SPEC + store.replace("[pretrain]", "[tokenize]"), "store.stages: tokenize not in the grid"),
                         (SPEC + store.replace("param: compress.store", "param: store"), "store.param"),
                         (SPEC.replace("params:\n", "params:\n  compress.store: x\n") + store,
                          "params.compress.store: set by store.param")]:
        path.write_text(text)
        with pytest.raises(spec.SpecError) as err:
            spec.load(project, "stored")
        assert needle in str(err.value) and "\n" not in str(err.value), err.value
    path.write_text(SPEC + store + "estimate_s: {pretrain: 60}\n")
    try:
        study = spec.load(project, "stored")
        assert study.resumable("pretrain") and not study.resumable("tokenize")
        assert study.store_folder() == Path("results/stored/store")
        grid.write_params(study, project, tmp_path / "params.yaml")
        assert yaml_load(tmp_path / "params.yaml")["compress"]["store"] == "results/stored/store"
        # the workspace sees the project's store at the same relative path: what a cell writes there is committed
        ws = workspace.Workspace(project, "stored")
        ws.link(study.store_folder())
        ws.link(study.store_folder())  # again: a no-op
        (ws.path / study.store_folder() / "piece.json").write_text("{}")
        assert (project / "results" / "stored" / "store" / "piece.json").is_file()
        g = grid.plan_grid(study, project)
        pending = {c.address: c for c in g.cells}
        est = costs.Estimator.of(study.estimate_s, [])
        assert set(run.gate_costs(study, est, pending).values()) == {None}  # no cost to refuse them on
        plain = spec.load(project, "micro")
        assert set(run.gate_costs(plain, costs.Estimator.of({"pretrain": 60}, []), pending).values()) == {60}
    finally:
        path.unlink()
        shutil.rmtree(project / "results" / "stored", ignore_errors=True)
        shutil.rmtree(project / ".dvc" / "tmp" / "studies" / "stored", ignore_errors=True)


def yaml_load(path: Path) -> dict:
    return yamlio.safe_load(path.read_text())


def test_costs_eta_and_what_a_budget_starts():
    c = lambda s: costs.Cost(s, "t")  # noqa: E731
    assert costs.within([("a", c(40)), ("b", c(40)), ("c", c(10)), ("d", c(None))], 60, 1) == ["a", "c", "d"]
    assert costs.within([("a", c(40)), ("b", c(40))], 60, 2) == ["a", "b"]
    assert costs.eta([c(30), c(30)], [(c(30), 10.0)], 2) == 40.0
    assert costs.eta([c(100)], [], 4) == 100.0 and costs.eta([c(None)], [], 1) is None
    est = costs.Estimator({"pretrain": 7.0})
    cell = lambda a, item: grid.Cell(a, "pretrain", item, {}, {}, {}, ())  # noqa: E731
    assert est.cost(cell("pretrain@x-0", {"v": "x", "seed": 0})).source.startswith("estimated")
    est.add("pretrain@x-1", "pretrain", {"v": "x", "seed": 1}, 20.0)
    est.add("pretrain@y-0", "pretrain", {"v": "y", "seed": 0}, 50.0)
    assert est.cost(cell("pretrain@x-0", {"v": "x", "seed": 0})) == costs.Cost(20.0, "measured: 1 other seed")
    assert est.cost(cell("pretrain@z-0", {"v": "z", "seed": 0})).seconds == 35.0


def test_a_pretrain_cell_is_estimated_by_its_tokens_at_the_measured_rate(tmp_path):
    """100 steps of 16 x 64 tokens and 10 validations of 4096 (at a third of a training token each), at xxs's 1000
    tokens/s plus 2 s: 118.05 s; Muon has no rate of its own here, so base's; an unmeasured size, or a stage that
    trains no model size, falls through to the stage's measured cells; its own seeds, measured, come first."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / costs.RATES).write_text(json.dumps(
        {"measured": "today", "setup_s": 2.0, "tokens_per_s": {"xxs": {"base": 1000.0, "muon": 500.0}}}))
    rates = costs.Rates.load(tmp_path)
    pre = {"params.yaml": {"pretrain.seq_len": 64, "pretrain.batch_size": 16, "pretrain.max_steps": 100,
                           "pretrain.max_tokens": None, "pretrain.val_every": 10, "pretrain.val_tokens": 4096}}
    cell = lambda a, stage, item: grid.Cell(a, stage, item, pre, {}, {}, ())  # noqa: E731
    est = costs.Estimator({"pretrain": 7.0}, rates)
    est.add("pretrain@other-s-0", "pretrain", {"variant": "other", "size": "s", "seed": 0}, 50.0)
    base = est.cost(cell("pretrain@std-xxs-0", "pretrain", {"variant": "std", "size": "xxs", "seed": 0}))
    assert base.seconds == pytest.approx((102_400 + 40_960 / 3) / 1000 + 2) and "benchmarks/rates.json" in base.source
    muon = est.cost(cell("pretrain_recipe@std-xxs-muon-0", "pretrain_recipe",
                         {"variant": "std", "size": "xxs", "recipe": "muon", "seed": 0}))
    assert muon.seconds == pytest.approx((102_400 + 40_960 / 3) / 500 + 2)
    assert est.cost(cell("pretrain@std-m-0", "pretrain", {"variant": "std", "size": "m", "seed": 0})).seconds == 50.0
    assert est.cost(cell("evaluate@std-xxs-0", "evaluate", {"size": "xxs", "seed": 0})).seconds is None
    est.add("pretrain@std-xxs-1", "pretrain", {"variant": "std", "size": "xxs", "seed": 1}, 30.0)
    assert est.cost(cell("pretrain@std-xxs-0", "pretrain", {"variant": "std", "size": "xxs", "seed": 0})).seconds == 30
    assert costs.Rates.load(tmp_path / "elsewhere") is None


# ---------------------------------------------------------------- slow: kill -9 mid-cell, finish from a clone
def _clone(base: Path, dest: Path, env: dict[str, str], mlflow: Path) -> dict[str, str]:
    subprocess.run(["git", "clone", "-q", str(base), str(dest)], check=True, capture_output=True)
    seed_check_verdicts(dest, env)  # as workspace_copy does: a clone has no .cache/
    return env | {"SCALELAB_ROOT": str(dest), "MLFLOW_TRACKING_URI": f"sqlite:///{mlflow}",
                  "PYTHONPATH": str(dest / "src"), "PREFECT_HOME": str(seed_prefect_home(dest / ".prefect")),
                  "PYTHONUNBUFFERED": "1"}


def _seed_study_workspace(clone: Path, env: dict[str, str]) -> None:
    """The remembered check verdicts in the study's own workspace (scalelab.study.workspace: .dvc/tmp/studies/micro/,
    a DVC root of its own, with its own .cache/), as _clone seeds the clone's: its flow's first DVC command otherwise
    builds every optimizer of the profile again (~4.4 CPU s a clone). The study's params change no optimizer, so the
    micro profile's verdict is theirs; what else they hold is checked as usual."""
    from scalelab.study.workspace import Workspace

    seed_check_verdicts(Workspace(clone, "micro").path, env)


def _study(ws: Path, env: dict[str, str], tag: str, *args: str, kill_after: int | None = None,
           rng: random.Random | None = None) -> tuple[int | None, str]:
    """`scalelab study micro` in `ws`; with `kill_after`, its whole process tree is SIGKILLed while a training cell
    runs once that many cells are kept."""
    cmd = [sys.executable, "-m", "scalelab.pipeline.cli", "study", "micro", *args]
    log = ws / f".study-{tag}.log"
    kept = ws / "results" / "micro" / cells.CELLS
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ws, env=env | {crash.TREE_ENV: tag}, stdout=out, stderr=subprocess.STDOUT)
        try:
            if kill_after is None:
                proc.wait(timeout=900)
                return proc.returncode, log.read_text()
            deadline = time.monotonic() + 900
            while proc.poll() is None and time.monotonic() < deadline:
                done = len(list(kept.glob("pretrain@*"))) if kept.is_dir() else 0
                training = any(b"stages/pretrain.py" in crash._cmdline(p) for p in crash.marked(tag))
                if done >= kill_after and training:
                    time.sleep(rng.uniform(0, 0.1))
                    break
                time.sleep(0.05)
            killed = proc.poll() is None
            crash.kill_tree(tag)
            proc.wait()
            return (None if killed else proc.returncode), log.read_text()
        finally:
            crash.kill_tree(tag)


def _cells_results(ws: Path) -> dict[str, dict]:
    """Each kept cell's files, timings aside: the metrics JSON parsed, the curve CSV's loss columns."""
    return {rel: _result(rel, (r.folder / rel).read_text())
            for r in cells.read(ws / "results" / "micro") for rel in r.meta["files"]}


def _result(rel: str, text: str):
    if rel.endswith(".json"):
        return crash._results(json.loads(text))
    rows = [line.split(",") for line in text.splitlines()]
    keep = [i for i, h in enumerate(rows[0]) if "loss" in h or h in ("step", "tokens")]
    return [[row[i] for i in keep] for row in rows]


def _built_study(build, base: Path, folder: Path, monkeypatch) -> tuple[dict[str, dict], list[dict]]:
    """The uninterrupted run's cells, from the micro DAG's build: their files (timings aside, as _cells_results reads
    a study's), and the ledger the study's own writer makes of them (scalelab.study.ledger.write_ledger, its generator
    imported from `base`), laid out in `folder` as a study keeps its cells."""
    from scalelab.study import ledger as study_ledger

    results, root = {}, folder / "root"
    for address in CELLS:
        files = [rel for rel in build.info["outs"][address] if rel.startswith(("metrics/", "plots/"))]
        for rel in files:
            results[rel] = _result(rel, (build.ws / rel).read_text())
            (root / "results" / "micro" / "cells" / address / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(build.ws / rel, root / "results" / "micro" / "cells" / address / rel)
        (root / "results" / "micro" / "cells" / address / "cell.json").write_text(json.dumps({"files": files}))
    monkeypatch.syspath_prepend(str(base / "src"))  # the study's generator, micro_ledger
    ledger = json.loads(study_ledger.write_ledger(spec.load(base, "micro"), root).read_text())
    return results, ledger


@pytest.mark.slow
def test_a_study_killed_mid_cell_finishes_from_a_fresh_clone_without_recomputing(tmp_path, prefect_db, micro_build,
                                                                                  prefect_harness, monkeypatch):
    from prefect.settings import PREFECT_API_URL

    rng = random.Random(7)
    base = tmp_path / "base"
    # the study's flows report to the test run's one Prefect server (the kill takes only the study's own tree): a
    # temporary server of their own, started by each of the three flows, is test_flow's and test_crash's subject
    env = _project(base) | {"PREFECT_API_URL": PREFECT_API_URL.value()}
    mlflow = seed_mlflow_store(tmp_path / "mlflow.db")  # the two clones' one store

    # the uninterrupted run: the micro DAG's build, where each of the three cells ran
    assert {r["stage"]: r["status"] for r in micro_build.statuses if r["stage"] in CELLS} == dict.fromkeys(CELLS, "ran")
    reference, ledger = _built_study(micro_build, base, tmp_path / "reference", monkeypatch)
    assert len(reference) == 6
    assert [e["id"] for e in ledger] == [f"micro.{v}-a-base-0.json" for v in ("none", "standard", "unified")]

    killed = tmp_path / "killed"
    killed_env = _clone(base, killed, env, mlflow)
    _seed_study_workspace(killed, killed_env)
    code, out = _study(killed, killed_env, "killed", "--workers", "2", kill_after=1, rng=rng)
    assert code is None, f"the study ended before the kill:\n{out[-3000:]}"
    kept = {r.address for r in cells.read(killed / "results" / "micro")}
    assert 1 <= len(kept) < 3, (kept, out[-2000:])
    _git(killed, "add", "results/micro/cells")
    _git(killed, "commit", "-qm", "the cells kept before the kill")

    resumed = tmp_path / "resumed"
    resumed_env = _clone(killed, resumed, env, mlflow)
    assert not (resumed / ".dvc" / "tmp").exists()  # nothing of the killed run's workspace travels
    _seed_study_workspace(resumed, resumed_env)  # (after that check: the verdicts are this machine's, not the clone's)
    # a budget spent before the first cell could start: the flow builds what the cells need, starts none of them
    code, out = _study(resumed, resumed_env, "budget", "--workers", "2", "--max-minutes", "0.05")
    left = 3 - len(kept)
    assert code == 0 and f"not started: {left} cell{'s' * (left > 1)} (time budget)" in out, out[-3000:]
    assert "] done" not in out and len(cells.read(resumed / "results" / "micro")) == len(kept)
    # then the rest, fanned out over a local Dask cluster of two workers
    code, out = _study(resumed, resumed_env, "resumed", "--workers", "2", "--runner", "dask")
    assert code == 0, out[-3000:]
    skipped = set(re.findall(r"^skip   (\S+)", out, re.M))
    ran = set(re.findall(r"\] done   (\S+)", out, re.M))
    assert skipped == kept and ran == set(CELLS) - kept, out
    records = [r.meta for r in cells.read(resumed / "results" / "micro") if r.address in ran]
    if len(records) > 1:  # the cells ran side by side on the cluster's workers
        assert max(r["started"] for r in records) < min(r["started"] + r["wall_s"] for r in records), records
    flow_logs = "".join(p.read_text() for p in (resumed / ".dvc/tmp/studies/micro/logs").glob("*.log"))
    assert set(re.findall(r"Running stage '(pretrain@[^']+)'", flow_logs)) == ran  # no kept cell recomputed
    assert _cells_results(resumed) == reference
    assert json.loads((resumed / "results" / "micro" / "claims_a.json").read_text()) == ledger
    index = json.loads((resumed / "results" / "micro" / cells.INDEX).read_text())
    assert sorted(r["address"] for r in index) == CELLS and {r["state"] for r in index} == {cells.DONE}
    assert "| `pretrain` | 3 | 0 |" in (resumed / "results" / "micro" / "README.md").read_text()

    # a run with nothing left skips every cell, starts no flow, and leaves the user's params.yaml as it was
    before = (resumed / "params.yaml").read_text()
    code, out = _study(resumed, resumed_env, "again")
    assert code == 0 and out.count("skip   ") == 3 and "flow:" not in out, out
    assert (resumed / "params.yaml").read_text() == before

"""`scalelab study NAME`: run a study's missing cells through the pipeline and keep each as it finishes.

    scalelab study NAME --plan                 the cells left and what each will cost; nothing runs
    scalelab study NAME                        run what is missing (resumes whatever ran before, anywhere)
    scalelab study NAME --max-minutes 30       start no cell that would end past 30 minutes; stop between cells
    scalelab study NAME --cells 'pretrain@*-xs-*'   part of the grid (repeatable, or comma-separated)
    scalelab study NAME --refresh              also rerun the stale cells (committed, but run by other code)
    scalelab study NAME --workers 2 [--runner dask]

A run syncs the study's workspace (scalelab.study.workspace) with the project's code and the study's params, resolves
its grid, and starts the pipeline's Prefect flow there (flows/pipeline.py) on the cells left: DVC runs them and the
stages they need, one MLflow parent run for the invocation with a child per cell. Each cell is copied into
results/<name>/cells/ the moment DVC has recorded it in the workspace's dvc.lock, so a kill loses at most the cells
then running (a cell killed on this machine resumes from its checkpoint); a fresh clone holding the committed cells
runs only the others. Then, when the run kept a cell, the cells index, study.json, the README's generated parts and,
once every cell of the grid has a result, the ledger are rewritten; a run that kept none writes nothing in results/.

A cell longer than a slice (a stage the spec's `store` names) keeps its finished parts in results/<name>/store as it
goes: it starts whenever time is left, the deadline stops it, and the next run, here or on a fresh clone holding the
committed store, redoes only the parts not yet there.

Ctrl-C once: no new cell starts, the running ones finish and are kept; twice: the running ones are stopped too.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import signal
import subprocess
import sys
import time
from pathlib import Path

from scalelab.study import cells, gate, grid, ledger, plan, spec
from scalelab.study.costs import Estimator, Rates, duration, eta, plural
from scalelab.study.workspace import Busy, Workspace

POLL_S = 0.5


def _die_with_parent() -> None:
    """In the flow's process: SIGTERM when the study process dies, even by kill -9 (Linux's PR_SET_PDEATHSIG), so
    no flow outlives its study and holds its workspace; the flow stops its stages on SIGTERM."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def gate_costs(study: spec.StudySpec, est: Estimator, pending: dict[str, grid.Cell]) -> dict[str, float | None]:
    """What the gate refuses cells on: each one's estimated seconds; None for a cell that keeps its progress in the
    study's store (it starts whenever time is left, and the deadline stops it)."""
    return {a: None if study.resumable(c.stage) else est.cost(c).seconds for a, c in pending.items()}


class Run:
    """One invocation: the grid as resolved in the workspace, and the cells it persists as they finish."""

    def __init__(self, study: spec.StudySpec, root: Path, ws: Workspace, g: grid.Grid, est: Estimator,
                 workers: int | None, parallel: int):
        self.study, self.root, self.ws, self.grid, self.est = study, root, ws, g, est
        self.results = study.folder(root)
        self.workers, self.parallel = workers, parallel  # the flow's --workers; cells at once, for the ETA
        self.commit = _git(root, "rev-parse", "HEAD") or None
        paths = sorted({p for c in g.cells for p in c.inputs})
        dirty = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *paths).splitlines()
        self.dirty_files = [line[3:].strip() for line in dirty if line.strip()]
        self.persisted: list[str] = []
        self.paused: list[str] = []  # resumable cells stopped at the deadline
        self.interrupts = 0

    def dirty(self, cell: grid.Cell) -> bool | None:
        if self.commit is None:
            return None
        return any(f == p or f.startswith(p.rstrip("/") + "/") for p in cell.inputs for f in self.dirty_files)

    def finished(self, cell: grid.Cell, lock: dict) -> dict[str, str] | None:
        """{path: md5} of the cell's small results when the workspace's dvc.lock records this very cell (its key,
        its code) and the files DVC hashed are the ones on disk; else None."""
        if cell.address not in lock:
            return None
        got = cells.record(cell, lock, self.grid.pipeline, {}, commit=None, dirty=None, wall_s=None, machine=None,
                           origin="")
        if got["key"] != cell.key or got["code_hash"] != cell.code_hash:
            return None
        outs = {o["path"]: o.get("md5") for o in lock[cell.address].get("outs") or []}
        files = {}
        for rel in cell.files:
            path = self.ws.path / rel
            if not path.is_file() or hashlib.md5(path.read_bytes()).hexdigest() != outs.get(rel):
                return None
            files[rel] = outs[rel]
        return files

    def persist(self, cell: grid.Cell, lock: dict, files: dict[str, str], mark: dict | None, now: float,
                origin: str) -> Path:
        wall = now - mark["t"] if mark else None
        meta = cells.record(cell, lock, self.grid.pipeline, files, commit=self.commit, dirty=self.dirty(cell),
                            wall_s=wall, machine=(mark or {}).get("machine"), origin=origin,
                            started=mark["t"] if mark else None)
        folder = cells.persist(self.results, meta, {rel: self.ws.path / rel for rel in files})
        self.est.add(cell.address, cell.stage, cell.item, wall)
        self.persisted.append(cell.address)
        return folder

    def targets(self, todo: list[cells.Status]) -> list[str]:
        """The flow's targets: a stage's name when every cell of it is to run, else its cells."""
        by_stage: dict[str, list[str]] = {}
        for s in todo:
            by_stage.setdefault(s.cell.stage, []).append(s.cell.address)
        out = []
        for stage, addresses in by_stage.items():
            whole = len(addresses) == self.grid.group_sizes.get(stage) and "@" in addresses[0]
            out += [stage] if whole else addresses
        return out

    def flow(self, todo: list[cells.Status], deadline: float | None, runner: str | None, address: str | None,
             log=print) -> tuple[int, dict[str, dict]]:
        """Run the flow on `todo`, persisting each cell as DVC records it; returns its exit status and the marks of
        the cells the gate let start."""
        pending = {s.cell.address: s.cell for s in todo}
        started_dir = gate.started_dir(self.ws.gate)
        for old in started_dir.glob("*.json") if started_dir.is_dir() else ():
            old.unlink()
        costs = lambda: gate_costs(self.study, self.est, pending)  # noqa: E731
        gate.write(self.ws.gate, deadline, costs())
        cmd = [sys.executable, str(self.ws.path / "flows" / "pipeline.py")]
        cmd += [f"--target={t}" for t in self.targets(todo)]
        cmd += [f"--{k}={v}" for k, v in (("workers", self.workers), ("runner", runner), ("address", address)) if v]
        self.ws.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.ws.logs / time.strftime("flow-%Y%m%d-%H%M%S.log")
        log(f"flow: {plural(len(todo), 'cell')} through flows/pipeline.py (log: {log_path})")
        total, marks, seen, lock_seen = len(todo), {}, set(), None

        def on_signal(signum, frame):
            self.interrupts += 1
            if signum == signal.SIGTERM or self.interrupts > 1:
                proc.send_signal(signal.SIGTERM)  # the flow stops its running stages
                log("stopping the running cells")
            else:
                gate.write(self.ws.gate, deadline, costs(), stop=True)
                log("no new cell starts; the running ones finish and are kept (Ctrl-C again stops them)")

        with open(log_path, "w") as out:
            proc = subprocess.Popen(cmd, cwd=self.ws.path, env=self.ws.env({gate.GATE_ENV: str(self.ws.gate)}),
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    pass_fds=(self.ws.lock_fd,), preexec_fn=_die_with_parent)
            previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                while True:
                    ended = proc.poll() is not None
                    marks = gate.started(self.ws.gate)
                    lock_path = self.ws.path / "dvc.lock"
                    stamp = lock_path.stat().st_mtime_ns if lock_path.is_file() else None
                    if stamp != lock_seen:
                        lock_seen, lock = stamp, self.ws.lock_stages()
                        for a, cell in list(pending.items()):
                            if (files := self.finished(cell, lock)) is None:
                                continue
                            now = time.time()
                            folder = self.persist(cell, lock, files, marks.get(a), now, "scalelab study")
                            del pending[a]
                            running = [(self.est.cost(pending[b]), now - marks[b]["t"]) for b in pending if b in marks]
                            left = [self.est.cost(c) for b, c in pending.items() if b not in marks]
                            wait = eta(left, running, self.parallel)
                            took = f" in {duration(now - marks[a]['t'])}" if a in marks else ""
                            log(f"[{total - len(pending)}/{total}] done   {a}{took} -> "
                                f"{folder.relative_to(self.root)}; {len(pending)} left"
                                + (f", ETA {duration(wait)}" if pending and wait is not None else ""))
                            gate.write(self.ws.gate, deadline, costs(), stop=self.interrupts > 0)
                    marks = gate.started(self.ws.gate)
                    for a in sorted(set(marks) - seen):
                        if a in pending:
                            seen.add(a)
                            log(f"start  {a} ({self.est.cost(pending[a])})")
                    if ended:
                        break
                    if (deadline is not None and time.time() >= deadline and not self.paused
                            and (running := [a for a in pending if a in marks])
                            and all(self.study.resumable(pending[a].stage) for a in running)):
                        self.paused = running  # what they finished is in the store: the next run goes on from it
                        gate.write(self.ws.gate, deadline, costs(), stop=True)
                        proc.send_signal(signal.SIGTERM)
                        log(f"time budget spent: stopping {', '.join(running)}; their finished parts are kept in "
                            f"{self.study.store_folder()} and the next run goes on from there")
                    time.sleep(POLL_S)
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait()
        return proc.returncode, marks


def execute(study: spec.StudySpec, root: Path, args, log=print) -> int:
    from scalelab.runtime import placement

    started = time.time()
    deadline = started + args.max_minutes * 60 if args.max_minutes is not None else None
    ws = Workspace(root, study.name)
    results = study.folder(root)
    with ws.locked():
        copied = ws.sync()
        if study.store is not None:
            ws.link(study.store_folder())
        grid.write_params(study, root, ws.path / grid.PARAMS_FILE)
        g = grid.resolve(study, ws.path, ws.path)
        cells.cleanup(results)
        records = cells.read(results)
        est = Estimator.of(study.estimate_s, records, Rates.load(root))
        statuses = cells.classify(g, records)
        sel = plan.select(statuses, args.cells, args.refresh)
        log(f"study {study.name}: {plural(len(statuses), 'cell')}, {len(sel.todo)} to run (workspace {ws.path}, "
            f"{plural(copied, 'file')} synced)")
        for line in plan.status_lines(sel, root):
            log(line)
        run = Run(study, root, ws, g, est, args.workers, args.workers or placement.default_workers())
        lock = ws.lock_stages()
        todo, recovered = [], 0
        for s in sel.todo:  # finished in the workspace by an earlier run that was stopped before keeping them
            if (files := run.finished(s.cell, lock)) is not None:
                folder = run.persist(s.cell, lock, files, None, time.time(), "scalelab study (recovered)")
                log(f"kept   {s.cell.address}: finished in the workspace earlier -> {folder.relative_to(root)}")
                recovered += 1
            else:
                todo.append(s)
        code, marks = (run.flow(todo, deadline, args.runner, args.address, log) if todo else (0, {}))
        left = [s.cell.address for s in todo if s.cell.address not in run.persisted]
        refused = [a for a in left if a not in marks]
        failed = [a for a in left if a in marks and a not in run.paused]
        if run.paused:
            log(f"paused at the time budget: {', '.join(run.paused)} (`scalelab study {study.name}` resumes them from "
                f"{study.store_folder()}; commit it with the cells)")
        if refused:
            why = "stopped" if run.interrupts else "time budget" if deadline else "the flow stopped first"
            log(f"not started: {plural(len(refused), 'cell')} ({why}); `scalelab study {study.name}` resumes them")
        if failed:
            log(f"not finished: {', '.join(failed)} (flow exit {code}; its log says why)")
        if not run.persisted:  # no cell kept: results/<name> as committed. Its index, study.json and README are
            # derived from the cells; rewritten by today's code they differed from the committed ones (a stale count,
            # a table's format) in a run that changed no result
            log(f"study {study.name}: ran nothing, skipped {len(sel.done)}, stale kept {len(sel.stale)}, "
                f"left {len(left)}; {results.relative_to(root)} left as it was ({duration(time.time() - started)})")
            return 130 if run.interrupts else 1 if failed or (code and not run.paused) else 0
        statuses = cells.classify(g, cells.read(results))
        (results / grid.PARAMS_FILE).write_text((ws.path / grid.PARAMS_FILE).read_text())
        cells.write_index(results, statuses)
        ledger.update_study_json(study, root, statuses, ran=True)
        missing = sum(s.state == cells.MISSING for s in statuses)
        if study.generator and not missing:
            path = ledger.write_ledger(study, root)
            log(f"ledger: {path.relative_to(root)} regenerated by {study.generator}")
        elif study.generator:
            log(f"ledger not rewritten: {missing} of {plural(len(statuses), 'cell')} without a result yet")
        readme = ledger.refresh_readme(study, root)
        log(f"study {study.name}: ran {len(run.persisted) - recovered}, kept from the workspace {recovered}, "
            f"skipped {len(sel.done)}, stale kept {len(sel.stale)}, "
            f"left {len(left)}; {readme.relative_to(root)}, {(results / cells.INDEX).relative_to(root)} "
            f"({duration(time.time() - started)})")
    return 130 if run.interrupts else 1 if failed or (code and not run.paused) else 0


def main(argv: list[str] | None = None) -> int:
    from scalelab import project_root
    from scalelab.runtime import placement

    ap = argparse.ArgumentParser(prog="scalelab study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", help="the study: configs/studies/<name>.yaml")
    ap.add_argument("--plan", action="store_true", help="print the cells left and their estimated cost; run nothing")
    ap.add_argument("--max-minutes", type=float, help="start no cell that would end past this many minutes")
    ap.add_argument("--cells", action="append", help="only the cells matching this pattern (address or cell name)")
    ap.add_argument("--refresh", action="store_true", help="also rerun the stale cells")
    ap.add_argument("--workers", type=int, help="cells at once (default: the flow's, one per GPU or core)")
    ap.add_argument("--runner", help="where the flow's tasks run: threads (default), dask, slurm, ray")
    ap.add_argument("--address", help="an existing Dask scheduler or Ray cluster")
    args = ap.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        ap.error("--workers must be at least 1")
    if args.max_minutes is not None and args.max_minutes <= 0:
        ap.error("--max-minutes must be positive")
    root = project_root()
    try:
        study = spec.load(root, args.name)
        ledger.check_generator(study, root)
        if args.plan:  # resolved aside: neither the project nor the study's workspace is touched
            records = cells.read(study.folder(root))
            statuses = cells.classify(grid.plan_grid(study, root), records)
            budget = args.max_minutes * 60 if args.max_minutes is not None else None
            for line in plan.plan_lines(study.name, statuses, plan.select(statuses, args.cells, args.refresh),
                                        Estimator.of(study.estimate_s, records, Rates.load(root)),
                                        args.workers or placement.default_workers(), budget, root):
                print(line)
            return 0
        return execute(study, root, args)
    except spec.SpecError as err:
        print(f"scalelab study: {err}", file=sys.stderr)
        return 2
    except Busy as err:
        print(f"scalelab study: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

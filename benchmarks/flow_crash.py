"""Whole-flow crash trials: `kill -9` of every process of a running pipeline flow (the flow, its
temporary Prefect server, its warm server, DVC and the stages) at a random moment, then the same command again.

    python benchmarks/flow_crash.py [--params configs/x.yaml] [--target T ...] [--kills 3] [--seed 0] [--workers 2]

In a temporary copy of the code (tests/workspace.py) with the given profile (default: the micro profile), it builds
the targets once uninterrupted, for reference, in another copy; then for each trial, in a fresh copy: starts
`python flows/pipeline.py`, SIGKILLs its whole tree at a seeded random time (uniform over the reference run's wall
time: at least one lands while a training cell runs on the micro targets), reruns the same command to the end, and
checks what must hold after the rerun (`check`): the rerun succeeded; every cell's metrics equal the reference's
(timings aside); `dvc status` is clean; dvc.lock holds every stage once; no MLflow run is RUNNING; the rerun's parent
run has one FINISHED child per cell it ran. It prints each trial's kill time, rerun wall time and cells equal /
different, and ends with one JSON line (`benchmark`, `metric`, `value`, `goal`).

The flow's tree is every process carrying TREE_ENV in its environment (set for the flow, inherited by everything it
starts, reparented or in another session): what `kill -9` of a process group would miss (DVC runs each stage in its
own session) and what a crash of the machine or of its cgroup takes down.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from workspace import MICRO, seed_prefect_home, workspace_copy  # noqa: E402  (the tests' copy of the code)

TREE_ENV = "SCALELAB_TREE"
DVC = [sys.executable, "-m", "dvc"]
# Metrics fields that measure the machine or name a run, not the result: they differ between any two runs (two
# uninterrupted runs of the micro DAG differ in exactly these: compress's seconds_* and tokens_per_s*, the optimizer
# sweep's wall-clock step_time_ratio, an evaluation's mlflow_model_id)
MACHINE = re.compile(r"^seconds|(_s|_mb|seconds|mfu|peak_flops|run_id|model_id)$|tokens_per_s|step_time")


def marked(tag: str) -> list[int]:
    """The pids of the live processes whose environment carries TREE_ENV=tag (Linux /proc)."""
    needle = f"{TREE_ENV}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0") and _alive(int(entry)):
                found.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def kill_tree(tag: str) -> int:
    """SIGKILL every process of the tree until none is left (one started meanwhile is caught by the next pass)."""
    killed = set()
    while pids := marked(tag):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return len(killed)


def wait_gone(tag: str, timeout: float) -> list[int]:
    """Waits up to `timeout` s for the tree to end by itself; returns the pids still alive then."""
    deadline = time.monotonic() + timeout
    while (left := marked(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def workspace(path: Path, params: Path, code: Path = ROOT) -> dict[str, str]:
    """A fresh copy of the code at `path` with `params`; its env, with its own Prefect home (the flow's temporary
    server keeps its database there, a crash's leftovers included) and no Prefect API of the caller's."""
    env = workspace_copy(path, params, code)
    env = {k: v for k, v in env.items() if not k.startswith("PREFECT_API")}
    return env | {"PREFECT_HOME": str(seed_prefect_home(path / ".prefect")), "PYTHONUNBUFFERED": "1"}


def flow(ws: Path, env: dict[str, str], targets: list[str], workers: int, tag: str,
         kill: float | str | None = None, rng: random.Random | None = None) -> tuple[int | None, float, str]:
    """Run `python flows/pipeline.py` in `ws` (every process of it marked with `tag`). `kill`: a delay in seconds, or
    "training" (a random 0-1 s after a pretrain cell's process appears), after which the whole tree is SIGKILLed.
    Returns (exit status, None when killed; wall seconds; its output)."""
    cmd = [sys.executable, "flows/pipeline.py", "--workers", str(workers)]
    cmd += [a for t in targets for a in ("--target", t)]
    log = ws / f".flow-{tag}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ws, env=env | {TREE_ENV: tag}, stdout=out, stderr=subprocess.STDOUT)
        try:
            if kill is None:
                proc.wait()
            else:
                deadline = start + kill if isinstance(kill, float | int) else None
                while proc.poll() is None and (deadline is None or time.monotonic() < deadline):
                    if deadline is None and any(b"stages/pretrain.py" in _cmdline(p) for p in marked(tag)):
                        deadline = time.monotonic() + (rng or random).uniform(0, 1)
                    time.sleep(0.05)
                killed = proc.poll() is None
                running = sorted(_doing(tag))
                kill_tree(tag)
                proc.wait()
                if killed:
                    return None, time.monotonic() - start, f"killed while running: {running}\n" + log.read_text()
        finally:
            kill_tree(tag)
    return proc.returncode, time.monotonic() - start, log.read_text()


def _doing(tag: str) -> set[str]:
    """What the tree is doing: the stages DVC is running (`repro --single-item X`) and the stage scripts running."""
    doing = set()
    for argv in (_cmdline(pid).decode(errors="replace").split("\0") for pid in marked(tag)):
        if "--single-item" in argv:
            doing.add(f"dvc repro {argv[argv.index('--single-item') + 1]}")
        doing |= {a for a in argv if a.startswith("stages/")}
    return doing


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def metrics(ws: Path) -> dict[str, dict]:
    """Every metrics file of the workspace (DVC metrics: metrics/**/*.json) without its timing fields."""
    return {str(p.relative_to(ws)): _results(json.loads(p.read_text())) for p in sorted(ws.glob("metrics/**/*.json"))}


def _results(value):
    if isinstance(value, dict):
        return {k: _results(v) for k, v in value.items() if not MACHINE.search(k)}
    if isinstance(value, list):
        return [_results(v) for v in value]
    return value


def check(ws: Path, env: dict[str, str], targets: list[str], output: str, reference: dict[str, dict]) -> list[str]:
    """What must hold after a rerun; the list of what does not."""
    import yaml
    from mlflow import MlflowClient

    problems = []
    got = metrics(ws)
    if missing := sorted(set(reference) - set(got)):
        problems.append(f"metrics missing: {missing}")
    if different := sorted(k for k in reference if k in got and got[k] != reference[k]):
        problems.append(f"metrics differ from the uninterrupted run's: {different}")
    status = subprocess.run(DVC + ["status", *targets], cwd=ws, env=env, capture_output=True, text=True)
    if status.returncode != 0 or "up to date" not in status.stdout:
        problems.append(f"dvc status not clean: {status.stdout[-500:]}{status.stderr[-500:]}")
    lock = (ws / "dvc.lock").read_text()
    names = re.findall(r"^  (\S+):$", lock, flags=re.M)
    if len(names) != len(set(names)):
        problems.append(f"dvc.lock repeats stages: {sorted(n for n in set(names) if names.count(n) > 1)}")
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(yaml.safe_load((ws / "params.yaml").read_text())["tracking"]["experiment"])
    runs = client.search_runs([exp.experiment_id], max_results=5000) if exp else []
    if running := [r.data.tags.get("dvc.stage", r.info.run_name) for r in runs if r.info.status == "RUNNING"]:
        problems.append(f"MLflow runs left RUNNING: {running}")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags and "dvc.stage" not in r.data.tags]
    ran = set(re.findall(r"Running stage '([^']+)'", output))
    if parents:
        parent = max(parents, key=lambda r: r.info.start_time)  # the rerun's
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        stages = [c.data.tags.get("dvc.stage") for c in children]
        if len(stages) != len(set(stages)) or any(c.info.status != "FINISHED" for c in children):
            seen = sorted((c.data.tags.get("dvc.stage"), c.info.status) for c in children)
            problems.append(f"the rerun's children (stage, status): {seen}")
        if lacking := sorted(s for s in ran if "@" in s and s not in stages):
            problems.append(f"cells the rerun ran without a child run: {lacking}")
    return problems


def trials(params: Path, targets: list[str], kills: list[float | str], workers: int, base: Path,
           seed: int = 0, reference: tuple[dict, float] | None = None, log=print) -> list[dict]:
    """The reference run (unless given: its metrics and wall time), then one killed run and its rerun per kill point
    (seconds, "random": uniform over the reference's wall time, or "training"); one row per trial."""
    rng = random.Random(seed)
    if reference is None:
        ref_ws = base / "reference"
        code, ref_wall, out = flow(ref_ws, workspace(ref_ws, params), targets, workers, f"ref-{uuid.uuid4().hex[:8]}")
        if code != 0:
            raise RuntimeError(f"the uninterrupted run failed ({code}):\n{out[-3000:]}")
        reference = metrics(ref_ws), ref_wall
    reference, ref_wall = reference
    log(f"uninterrupted: {ref_wall:.1f} s, {len(reference)} metrics files")
    rows = []
    for i, kill in enumerate(kills):
        ws = base / f"trial{i}"
        env = workspace(ws, params)
        tag = f"trial{i}-{uuid.uuid4().hex[:8]}"
        when = rng.uniform(0, ref_wall) if kill == "random" else kill
        code, killed_at, out = flow(ws, env, targets, workers, tag, kill=when, rng=rng)
        running = out.splitlines()[0] if code is None else f"not killed: it ended first ({code})"
        code, wall, out = flow(ws, env, targets, workers, tag + "-rerun")
        problems = [f"rerun exit {code}: {out[-2000:]}"] if code != 0 else check(ws, env, targets, out, reference)
        got = metrics(ws)
        equal = sum(got.get(k) == v for k, v in reference.items())
        rows.append({"kill": kill if isinstance(kill, str) else round(kill, 1), "killed_at_s": round(killed_at, 1),
                     "stages_then": running,
                     "rerun_s": round(wall, 1), "cells_equal": equal, "cells_different": len(reference) - equal,
                     "problems": problems})
        log(f"trial {i}: killed at {killed_at:.1f} s ({kill}; {running}), rerun {wall:.1f} s, metrics equal {equal}/"
            f"{len(reference)}, problems: {problems or 'none'}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=Path, default=MICRO, help="the profile (default: the micro profile)")
    ap.add_argument("--target", action="append", dest="targets", default=[], help="flow targets (default: all)")
    ap.add_argument("--kills", type=int, default=3, help="trials (the first kill lands while a cell trains)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="a folder for the workspaces (kept), default a temporary one")
    args = ap.parse_args(argv)
    kills = ["training", *["random"] * (args.kills - 1)]
    with tempfile.TemporaryDirectory(prefix="flow-crash-") as tmp:
        base = args.keep or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        rows = trials(args.params.resolve(), args.targets, kills, args.workers, base, args.seed)
    bad = sum(bool(r["problems"]) for r in rows)
    print(json.dumps({"benchmark": "flow_crash", "metric": "trials with a broken invariant after the rerun",
                      "value": bad, "goal": "== 0"}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

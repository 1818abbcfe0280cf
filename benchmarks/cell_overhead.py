"""A pretrain cell's cost outside its own compute, all measured in this run.

In a temporary copy of the code with the micro profile (tests/micro_params.yaml), the data stages are built once,
then several pretrain cells run one at a time through `dvc repro --single-item`, the way the pipeline runs them,
alternately cold (a fresh Python process) and warm (handed to a scalelab.pipeline.warm server, as the pipeline flow does):

- overhead = the cell's wall time minus its `fit` time (`wall_s` in its metrics): process start, imports, DVC's
  bookkeeping, MLflow run creation, the export after training. Median over the cells; goal <= 2.5 s.
- strict overhead = wall time minus the training loop alone (`train_loop_s`): the above plus Lightning's set-up and
  the MFU peak measurement.
- CPU overhead = the CPU seconds of the cell's whole process tree (DVC and the stage) minus those of `fit`
  (`cpu_s`): what the overhead costs on idle cores, readable on a busy machine where wall times stretch.

and, for the breakdown, medians of a few runs each: the interpreter's start, the pretrain stage's imports (with and
without scalelab.train.lean, whose ratio shows what it saves) and DVC's own start (`dvc status` of one cell).

    python benchmarks/cell_overhead.py [--cells 6] [--code DIR]

`--code` measures another checkout (e.g. `git archive <commit> | tar -x -C DIR`) with the same method: stages run
with that copy's src/ first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from workspace import workspace_copy  # noqa: E402  (the tests' copy of the code in a fresh git repo)

from scalelab.pipeline.warm import WARM_ENV, server  # noqa: E402

DVC = [sys.executable, "-m", "dvc"]
FLOW_DVC = [sys.executable, "-m", "scalelab.pipeline.dvcrun"]  # DVC as the flow runs it (a fast dvc.lock read)
IMPORTS = "import scalelab.train, scalelab.tracking, scalelab.model.export"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every waited-for descendant: DVC and the stage it ran
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], cwd: Path, env: dict[str, str], cpu: list[float] | None = None) -> tuple[float, str]:
    """Run `cmd`; its wall seconds and stdout (appending its process tree's CPU seconds to `cpu`)."""
    start, start_cpu = time.perf_counter(), children_cpu()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if res.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    if cpu is not None:
        cpu.append(children_cpu() - start_cpu)
    return seconds, res.stdout


def median_time(cmd: list[str], cwd: Path, env: dict[str, str], repeats: int) -> float:
    return statistics.median(run(cmd, cwd, env)[0] for _ in range(repeats))


def metrics_file(ws: Path, stage: str) -> Path:
    """pretrain@<variant>-<size>-<seed> -> metrics/pretrain/<variant>-<size>-base-<seed>.json"""
    variant, size, seed = stage.split("@")[1].rsplit("-", 2)
    return ws / "metrics" / "pretrain" / f"{variant}-{size}-base-{seed}.json"


def cell(ws: Path, env: dict[str, str], stage: str) -> dict[str, float | None]:
    """One cell through `dvc repro --single-item`: wall, fit and training-loop seconds and the three overheads."""
    cpu: list[float] = []
    wall, _ = run(FLOW_DVC + ["repro", "--single-item", stage], ws, env, cpu)
    m = json.loads(metrics_file(ws, stage).read_text())
    loop, fit_cpu = m.get("train_loop_s"), m.get("cpu_s")
    return {"wall": wall, "fit": m["wall_s"], "loop": loop, "overhead": wall - m["wall_s"],
            "strict": None if loop is None else wall - loop, "cpu": None if fit_cpu is None else cpu[0] - fit_cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=6, help="pretrain cells to time (the grid's first ones), "
                    "alternately cold and warm")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each breakdown measurement")
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary workspace")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cell-overhead-"))
    ws, code = tmp / "ws", args.code.resolve()
    try:
        env = workspace_copy(ws, code / "tests" / "micro_params.yaml", code)
        data_s, _ = run(DVC + ["repro", "tokenize"], ws, env)  # also creates the MLflow store: not a cell's cost
        stages = run(DVC + ["stage", "list", "--name-only"], ws, env)[1].split()
        cells = [s for s in stages if s.startswith("pretrain@")][: args.cells]
        warm = (ws / "src" / "scalelab" / "pipeline" / "warm.py").is_file()
        if not warm:  # measuring only cold cells would report the flow's warm path as never taken: refuse instead
            raise SystemExit(f"cell_overhead: {code} has no warm server (src/scalelab/pipeline/warm.py): the warm "
                             "cells this benchmark measures cannot run")
        rows: list[tuple[str, str, dict]] = []
        report: list[str] = []
        with server(ws, report.append, env, wait=True) as warm_env:
            ready = bool(warm_env) and Path(warm_env[WARM_ENV]).exists()  # its start-up is the flow's, not a cell's
            if not ready:
                raise SystemExit("cell_overhead: the warm server did not start: the warm cells cannot be measured")
            for i, stage in enumerate(cells):  # interleaved, so a change in the machine's load hits both alike
                mode = "warm" if ready and i % 2 else "cold"
                rows.append((stage, mode, cell(ws, {**env, **(warm_env if mode == "warm" else {})}, stage)))
        # A warm stage's process is the server's child, not ours: the server reports its CPU seconds.
        forked = dict(re.findall(r"scalelab.pipeline.warm: (\S+): exit 0, ([\d.]+) CPU s", "\n".join(report)))
        for stage, mode, r in rows:
            if mode == "warm" and r["cpu"] is not None:
                r["cpu"] = r["cpu"] + float(forked[stage]) if stage in forked else None

        python_s = median_time([sys.executable, "-c", "pass"], ws, env, args.repeats)
        lean_s = median_time([sys.executable, "-c", IMPORTS], ws, env, args.repeats)
        full_s = median_time([sys.executable, "-c", IMPORTS], ws, {**env, "SCALELAB_LEAN_IMPORTS": "0"}, args.repeats)
        dvc_s = median_time(DVC + ["status", cells[0]], ws, env, args.repeats)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    nan = float("nan")
    print(f"code: {code}  (data stages {data_s:.1f} s, not counted)")
    print(f"{'cell':26s} {'start':5s} {'wall s':>7s} {'fit s':>7s} {'loop s':>7s} {'overhead':>9s} {'strict':>7s} "
          f"{'cpu':>7s}")
    for stage, mode, r in rows:
        print(f"{stage:26s} {mode:5s} " + " ".join(f"{nan if r[k] is None else r[k]:{w}.2f}" for k, w in
                                                  (("wall", 7), ("fit", 7), ("loop", 7), ("overhead", 9),
                                                   ("strict", 7), ("cpu", 7))))
    medians: dict[str, dict[str, float]] = {}
    for mode in ("cold", "warm"):
        mine = [r for _, m, r in rows if m == mode]
        medians[mode] = {k: statistics.median(v) for k in ("overhead", "strict", "cpu")
                         if mine and (v := [r[k] for r in mine if r[k] is not None])}
        if mine:
            print(f"{'median':26s} {mode:5s} {'':7s} {'':7s} {'':7s} "
                  + " ".join(f"{medians[mode].get(k, nan):{w}.2f}" for k, w in (("overhead", 9), ("strict", 7),
                                                                                  ("cpu", 7))))
    print("(overhead: wall minus fit; strict: wall minus the training loop; cpu: the cell's CPU seconds outside fit,"
          "\n what its overhead takes on idle cores; warm: started by the flow's warm server, scalelab.pipeline.warm)")
    print("\nbreakdown (medians)")
    print(f"  python start                      {python_s:6.2f} s")
    print(f"  pretrain stage imports, lean      {lean_s:6.2f} s")
    print(f"  pretrain stage imports, full      {full_s:6.2f} s  (SCALELAB_LEAN_IMPORTS=0)")
    print(f"  dvc status of one cell            {dvc_s:6.2f} s")
    best = medians["warm"] or medians["cold"]  # how the pipeline flow runs cells
    results = [{"benchmark": "cell_overhead", "metric": "median_cell_wall_minus_fit_s",
                "value": round(best["overhead"], 3), "goal": "<= 2.5"}]
    if "cpu" in best:
        results.append({"benchmark": "cell_overhead", "metric": "median_cell_cpu_outside_fit_s",
                        "value": round(best["cpu"], 3), "goal": "<= 2.5"})
    if medians["warm"]:
        results.append({"benchmark": "cell_overhead", "metric": "warm_over_cold_cell_overhead",
                        "value": round(medians["warm"]["overhead"] / medians["cold"]["overhead"], 3), "goal": "< 1.0"})
    results.append({"benchmark": "cell_overhead", "metric": "lean_over_full_stage_imports",
                    "value": round(lean_s / full_s, 3), "goal": "< 1.0"})
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()

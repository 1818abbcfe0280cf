"""Before a study that refines factors end to end runs: its store seeded from another study's, and the refinement's
cost timed on a few steps.

    python -m scalelab.compress.refine_cost --seed-store results/<from>/store --into results/<study>/store \
        --params configs/<study profile>.yaml
    python -m scalelab.compress.refine_cost --params configs/<study profile>.yaml --seed 0 --keep 0.75 --steps 5 \
        --out results/<study>/diagnostics/refine-cost.json [--model <HF folder>] [--prepared <corpus folder>]

Seeding copies the sensitivity tables and every finished part of the other store whose method's settings the profile
names too (the same `compress.methods` entry, whatever its name): the keys are compared on reading (store.py), so a
copied part whose model, windows or settings differ from the study's is never read, only carried.

Timing runs the profile's refined methods at one seed and kept fraction with `refine.steps` set to `--steps`, on a
scratch copy of the study's store (its sensitivity table read back, nothing written to the study's): the seconds of
the steps and of the objective's four readings (calibration and held-out windows, before and after) come apart
(refine.refine), so a part at the profile's own steps is projected as readings + steps × seconds a step +
the rest of the part (factorisation and evaluation, measured on the same part).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path


def seed_store(source: Path, into: Path, cfg) -> dict:
    """Copy `source`'s sensitivity tables, and its parts of every method `cfg` names with the same settings, into
    `into`; returns the counts copied."""
    from scalelab.compress.keys import normal_part

    specs = [m.model_dump(mode="json") for m in cfg.methods.values()]
    copied = {"sensitivity": 0, "parts": 0}
    for table in sorted((source / "sensitivity").glob("*.json")):
        (into / "sensitivity").mkdir(parents=True, exist_ok=True)
        shutil.copy2(table, into / "sensitivity" / table.name)
        copied["sensitivity"] += 1
    for part in sorted((source / "parts").glob("*.json")):
        if normal_part(json.loads(part.read_text())["key"])["method"] in specs:  # an older part's settings too
            (into / "parts").mkdir(parents=True, exist_ok=True)
            shutil.copy2(part, into / "parts" / part.name)
            copied["parts"] += 1
    return copied


def time_refinement(cfg, seed: int, keep: float, steps: int, model_dir: str | None = None,
                    prepared: str | None = None) -> dict:
    """The profile's refined methods at (`seed`, `keep`) with `steps` refinement steps; per method the measured
    seconds and the projection at the profile's steps."""
    from scalelab.compress.cells import run_seed
    from scalelab.config.source import ModelSource

    refined = [m for m in cfg.grid.methods if cfg.methods[m].refine != "none"]
    if not refined:
        raise ValueError("compress.grid.methods has no refined method: nothing to time")
    update = {"refine": cfg.refine.model_copy(update={"steps": steps}), "save_models": False,
              "grid": cfg.grid.model_copy(update={"methods": refined, "keep": [keep]})}
    if model_dir is not None:
        update["source"] = ModelSource(path=str(model_dir), dtype=cfg.source.dtype)
    with tempfile.TemporaryDirectory() as scratch:
        store = Path(scratch) / "store"
        if cfg.store is not None and (Path(cfg.store) / "sensitivity").is_dir():
            shutil.copytree(Path(cfg.store) / "sensitivity", store / "sensitivity")
        results = run_seed(cfg.model_copy(update=update), seed, Path(scratch) / "out", store, prepared=prepared)
    out = {"seed": seed, "keep": keep, "steps_timed": steps, "steps": cfg.refine.steps, "methods": {}}
    for metrics, _ in results:
        step = metrics["seconds_refine_steps"] / steps
        rest = metrics["seconds"] - metrics["seconds_refine_steps"]  # factors, the readings; evaluation apart
        out["methods"][metrics["method"]] = {
            "seconds_a_step": step, "seconds_objective": metrics["seconds_refine_objective"],
            "seconds_part_timed": metrics["seconds"], "seconds_part_projected": rest + cfg.refine.steps * step,
            "objective_before": metrics["objective_before"], "objective_after": metrics["objective_after"]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", required=True, help="the study's profile")
    ap.add_argument("--seed-store", help="copy this store's reusable files (with --into) and stop")
    ap.add_argument("--into", help="the study's store (results/<study>/store)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=float, default=0.75)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--model", help="the model's HF folder (default: the params' compress.source)")
    ap.add_argument("--prepared", help="the prepared corpus folder (default: data/prepared)")
    ap.add_argument("--out", help="where the timing's JSON goes")
    args = ap.parse_args(argv)

    from scalelab.compress.diagnose import compress_section
    from scalelab.data import write_json_atomic
    from scalelab.pipeline.stage import reported
    from scalelab.runtime.log import setup

    setup()

    def body() -> None:
        cfg = compress_section(args.params)
        if args.seed_store:
            if not args.into:
                raise SystemExit("--seed-store needs --into (the study's store)")
            print(seed_store(Path(args.seed_store), Path(args.into), cfg))
            return
        if cfg.store is None and args.into:
            cfg = cfg.model_copy(update={"store": args.into})
        result = time_refinement(cfg, args.seed, args.keep, args.steps, args.model, args.prepared)
        print(json.dumps(result, indent=1))
        if args.out:
            write_json_atomic(Path(args.out), result)

    return reported("compress refinement timing", body)


if __name__ == "__main__":
    sys.exit(main())

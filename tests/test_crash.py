"""A whole-flow crash: `kill -9` of every process of a running pipeline flow (the flow, its
temporary Prefect server, its warm server, DVC, the stages) at a seeded random moment and while a training cell runs,
then the same command again, on the micro profile's data stages and two pretrain cells. After the rerun: it
finished, every metrics file equals an uninterrupted run's (timings aside), `dvc status` is clean, dvc.lock holds
each stage once, no MLflow run is RUNNING and the rerun's parent has one FINISHED child per cell it ran
(benchmarks/flow_crash.py: the same trials on any profile, `python benchmarks/flow_crash.py --help`).

The uninterrupted run is the test run's build of the whole micro DAG (conftest's micro_build), of which these stages
are a part: their metrics files there, and the seconds that build took until the last of them had finished."""

import importlib.util
import random

import pytest
from conftest import ROOT
from workspace import MICRO

pytestmark = pytest.mark.slow
spec = importlib.util.spec_from_file_location("flow_crash", ROOT / "benchmarks" / "flow_crash.py")
crash = importlib.util.module_from_spec(spec)
spec.loader.exec_module(crash)
TARGETS = ["pretrain@none-a-0", "pretrain@standard-a-0"]
SEED = 21


def test_a_killed_flow_reruns_to_the_uninterrupted_result(tmp_path, micro_build):
    rng = random.Random(SEED)
    stages = micro_build.needs(TARGETS)
    assert set(TARGETS) | {"prepare", "tokenizer", "tokenize"} <= set(stages)
    ran = {r["stage"]: r["status"] for r in micro_build.statuses if r["stage"] in stages}
    assert ran == dict.fromkeys(stages, "ran")  # each of them ran in that build
    built = crash.metrics(micro_build.ws)
    reference = {path: built[path] for path in micro_build.metrics(stages)}
    wall = micro_build.seconds_until(stages)
    assert {"metrics/pretrain/none-a-base-0.json", "metrics/tokenize.json"} <= set(reference)
    # a kill while a training cell runs, and one at a seeded moment within the uninterrupted run's stages
    rows = crash.trials(MICRO, TARGETS, ["training", round(rng.uniform(0.3, 0.9) * wall, 1)], 2, tmp_path, seed=SEED,
                        reference=(reference, wall), log=print)
    assert "stages/pretrain.py" in rows[0]["stages_then"], rows[0]  # the first kill hit a training cell
    for row in rows:
        assert not row["problems"], row
        assert row["cells_different"] == 0

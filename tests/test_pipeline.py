"""The whole DAG on the micro profile in a temporary git repo: `dvc repro` builds every stage, a second one does
nothing, and changing one variant's params reruns only its cells (DESIGN: Contracts)."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import MICRO, ROOT

pytestmark = pytest.mark.slow
DVC = [sys.executable, "-m", "dvc"]


def _run(cmd, cwd, env, check=True):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and res.returncode:
        raise AssertionError(f"{cmd} failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
    return res


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    code = [rel for rel in tracked if not rel.startswith(("metrics/", "plots/")) and rel != "dvc.lock"]
    for rel in code + ["stages", "src"]:  # the code as it is now (tracked or not), no results
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, ws / rel, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ws / rel)
    shutil.copy2(MICRO, ws / "params.yaml")
    env = {**os.environ, "SCALELAB_ROOT": str(ws), "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    _run(["git", "init", "-q"], ws, env)
    _run(["git", "add", "-A"], ws, env)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], ws, env)
    return ws, env


def _ran(output: str) -> list[str]:
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")]


def test_repro_builds_everything_then_is_a_noop(workspace):
    ws, env = workspace
    first = _run(DVC + ["repro"], ws, env)
    ran = _ran(first.stdout)
    stages = set(yaml.safe_load((ws / "dvc.lock").read_text())["stages"])
    assert {"prepare", "tokenizer", "tokenize", "scaling", "pretrain@unified-c-0",
            "pretrain_recipe@muon-standard-a-0"} <= stages
    assert set(ran) == stages
    # the cells learned: validation loss clearly below a uniform guess, ln(vocab)
    cell = json.loads((ws / "metrics/pretrain/standard-c-base-0.json").read_text())
    assert cell["val_loss"] < math.log(384) - 0.5
    scaling = json.loads((ws / "metrics/scaling.json").read_text())
    assert set(scaling["fits"]) == {"none", "standard", "unified"}
    assert _ran(_run(DVC + ["repro"], ws, env).stdout) == []  # second repro: nothing to do


def test_changing_one_variant_reruns_only_its_cells(workspace):
    ws, env = workspace
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["model"]["variants"]["unified"]["wd_input_scales"] = False
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = _run(DVC + ["status"], ws, env).stdout
    changed = {line.rstrip(":").strip() for line in status.splitlines() if line and not line.startswith("\t")
               and line.rstrip().endswith(":")}
    # `validate` (the params check at the DAG head) reruns on any params edit; its out never changes, so it reruns
    # nothing downstream
    assert changed == {"validate", "pretrain@unified-a-0", "pretrain@unified-b-0", "pretrain@unified-c-0"}

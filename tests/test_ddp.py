"""DDP on CPU (gloo, 2 processes through the CLI, which Lightning's launcher re-executes) trains exactly like one
process on the same global batch: each rank takes rows r::2 and DDP averages the gradients."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from scalelab.config import parse_params
from scalelab.tracking.teamserver import free_port
from scalelab.train import Cell, fit
from test_train import make_shards, micro_raw


@pytest.mark.timeout(300)
def test_two_cpu_processes_match_one(tmp_path):
    shards = make_shards(tmp_path / "tokens")
    # 2 micro-batches per rank: the no-sync accumulation goes through DDP too. AdamW, not Muon: Muon's bf16
    # Newton-Schulz turns the all-reduce's different summation order into ~1e-4 differences, hiding real errors.
    raw = micro_raw(max_steps=8, val_every=4, ckpt_every=4, gamma_every=4, accumulate=2)
    one = fit(parse_params(raw), Cell("unified", "a", "base", 0), tmp_path / "one", shards)

    raw["pretrain"].update(accelerator="cpu", devices=2, strategy="ddp")
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "scalelab.train.fit", "--params", str(tmp_path / "ddp.yaml"), "--variant", "unified",
           "--size", "a", "--recipe", "base", "--seed", "0", "--out", str(tmp_path / "two"), "--shards", str(shards)]
    # the rendezvous port below the ephemeral range: Lightning's own pick (port 0) was taken by another test's
    # connection before rank 0 bound it (EADDRINUSE in CI)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    two = json.loads(res.stdout.strip().splitlines()[-1])  # rank 0's metrics, the last line it prints
    assert two["steps"] == one["steps"] == 8
    for key in ("val_loss", "train_loss", "gamma_mean", "sharpness"):  # not bitwise: all-reduce order differs
        assert two[key] == pytest.approx(one[key], rel=1e-5), key
    assert json.loads((tmp_path / "two/model/metrics.json").read_text())["val_loss"] == two["val_loss"]


def test_an_in_process_ddp_fit_leaves_no_rank_variables(tmp_path, monkeypatch):
    """Lightning's DDP setup writes LOCAL_RANK, NODE_RANK and the rendezvous into its own process's environment.
    Left there, the next DDP launch from this process (or any child it starts, as the preset rehearsal's CLI run
    after an in-process fit) believes its ranks were started externally and waits for ranks nobody starts."""
    from scalelab.runtime.placement import LAUNCH_VARS

    for key in LAUNCH_VARS:
        monkeypatch.delenv(key, raising=False)
    raw = micro_raw(max_steps=2, val_every=2, ckpt_every=2, gamma_every=2)
    raw["pretrain"].update(accelerator="cpu", devices=1, strategy="ddp")
    metrics = fit(parse_params(raw), Cell("unified", "a", "base", 0), tmp_path / "one", make_shards(tmp_path / "t"))
    assert metrics["steps"] == 2
    assert {k: os.environ[k] for k in LAUNCH_VARS if k in os.environ} == {}

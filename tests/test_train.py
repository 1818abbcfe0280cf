"""Training layer: a micro model learns; resume after a crash equals an uninterrupted run (same MLflow run); Muon's
two optimizers train; the non-finite guard fails fast and keeps the last good checkpoint; the sharpness power
iteration finds a known top eigenvalue; a stale checkpoint is moved aside, never resumed; MFU's FLOP count is what
torch counts."""

import contextlib
import csv
import hashlib
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.callbacks import Callback
from mlflow import MlflowClient
from mutants import assert_caught, mutant
from torch.nn.attention import SDPBackend, sdpa_kernel

from scalelab import tracking
from scalelab.config import ParamsError, parse_params
from scalelab.data.loader import open_shards, train_batch, val_batches
from scalelab.data.shards import file_sha256
from scalelab.model import Transformer
from scalelab.model.export import load_exported
from scalelab.train import Cell, TokenDataModule, config_hash, fit, peak_flops, resume_run_id, top_hessian_eigenvalue

VOCAB = 256


def make_shards(out: Path, vocab: int = VOCAB, n_train: int = 40_000, n_val: int = 4_000) -> Path:
    """Token shards of a sparse Markov chain (two successors per token: entropy ln 2), with the loader's meta.json."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    successors = rng.integers(0, vocab, size=(vocab, 2))
    entries = {}
    for split, n in (("train", n_train), ("val", n_val)):
        picks, tokens = rng.integers(0, 2, n), np.zeros(n, np.uint16)
        for i in range(1, n):
            tokens[i] = successors[tokens[i - 1], picks[i]]
        path = out / f"{split}.bin"
        tokens.tofile(path)
        entries[split] = {"file": path.name, "tokens": n, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    meta = {"dtype": "uint16", "vocab_size": vocab, "eot_id": 0, "tokenizer_sha256": "none", "shards": entries}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def micro_raw(**pretrain) -> dict:
    """A micro profile: 1 layer, d_model 32, seq 32, batch 8; `pretrain` overrides that section's keys."""
    return {
        "model": {"sizes": {"a": {"n_layer": 1, "d_model": 32, "n_head": 2, "d_ff": 64}},
                  "variants": {"standard": {}, "unified": {"branch": True, "placement": True, "magdir": True,
                                                           "wd_input_scales": True}}},
        "optim": {"adamw": {"name": "adamw", "lr": 1e-2}, "muon": {"name": "muon", "lr": 2e-2, "adamw_lr": 1e-2},
                  "sgd": {"name": "sgd", "lr": 0.5, "momentum": 0.9}},
        "pretrain": {"seq_len": 32, "batch_size": 8, "max_steps": 40, "val_every": 10, "val_tokens": 1024,
                     "ckpt_every": 10, "threads": 1, "gamma_every": 10, "peak_flops": 1e11,
                     "log_every": 1,  # every step to the tracker: the resume tests count each step's row
                     "sharpness": {"max_iters": 3},
                     "recipes": {"base": {"optimizer": "adamw"}, "muon": {"optimizer": "muon"},
                                 "sgd": {"optimizer": "sgd"}},
                     "grid": {"variants": ["standard"], "sizes": ["a"], "seeds": [0]}, **pretrain},
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return make_shards(tmp_path_factory.mktemp("tokens"))


class FailAt(Callback):
    """Raises at the start of step `step` + 1, i.e. after step `step` and its checkpoint completed."""

    def __init__(self, step: int, exc: Exception | None = None, poison: bool = False) -> None:
        self.step, self.exc, self.poison = step, exc, poison

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if pl_module.step != self.step:
            return
        if self.poison:  # a NaN weight: the next loss and gradients are non-finite
            with torch.no_grad():
                pl_module.model.embed.weight[0, 0] = float("nan")
        else:
            raise self.exc


def _ckpt_step(path: Path) -> int:
    return torch.load(path, weights_only=True)["scalelab"]["step"]


def test_micro_run_learns_and_exports_final_weights(tmp_path, shards):
    params = parse_params(micro_raw())
    m = fit(params, Cell("unified", "a", "base", 0), tmp_path, shards)
    assert m["steps"] == 40 and m["tokens"] == 40 * 8 * 32
    assert m["val_loss"] < 0.5 * math.log(VOCAB), m  # from ln(256) = 5.5 at init
    assert m["train_loss"] < 0.5 * math.log(VOCAB)
    assert m["flops"] == m["flops_per_token"] * m["tokens"]
    assert m["mfu"] == pytest.approx(m["flops_per_token"] * m["tokens_per_s"] / 1e11)
    assert math.isfinite(m["sharpness"]) and m["gamma_max"] >= m["gamma_mean"] >= m["gamma_min"]
    rows = list(csv.DictReader(open(tmp_path / "model/curve.csv")))
    assert [int(r["step"]) for r in rows] == list(range(1, 41))
    assert [int(r["step"]) for r in rows if r["val_loss"]] == [10, 20, 30, 40]
    assert float(rows[0]["train_loss"]) > float(rows[-1]["train_loss"]) + 2
    gamma_rows = list(csv.DictReader(open(tmp_path / "model/gamma.csv")))
    assert [int(r["step"]) for r in gamma_rows] == [10, 20, 30, 40]
    assert json.loads((tmp_path / "model/metrics.json").read_text())["val_loss"] == m["val_loss"]
    # The exported weights are the final ones: they reproduce the reported validation loss.
    model = load_exported(tmp_path / "model").eval()
    tok = open_shards(shards)
    losses = [(model(x, y).loss.item(), y.numel()) for x, y in
              val_batches(tok.val, seq_len=32, val_tokens=1024, batch_size=8)]
    assert sum(l * n for l, n in losses) / sum(n for _, n in losses) == pytest.approx(m["val_loss"], abs=1e-5)


def test_resume_after_crash_equals_uninterrupted_run_and_reuses_mlflow_run(tmp_path, shards):
    """Muon recipe: two optimizers' states go through the checkpoint; the loss falls."""
    params, cell = parse_params(micro_raw()), Cell("unified", "a", "muon", 0)
    straight = fit(params, cell, tmp_path / "straight", shards)
    assert straight["val_loss"] < 0.5 * math.log(VOCAB)
    assert len(torch.load(tmp_path / "straight/ckpt/last.ckpt", weights_only=True)["optimizer_states"]) == 2

    out, chash = tmp_path / "resumed", config_hash(params, cell, shards)

    def stage(callbacks=()):
        with tracking.stage_run("pretrain-test", params={}, run_id=resume_run_id(out, chash)) as run:
            return run.run_id, fit(params, cell, out, shards, run, callbacks=callbacks)

    with pytest.raises(RuntimeError, match="killed"):
        stage([FailAt(20, RuntimeError("killed"))])
    first_id = json.loads((out / "ckpt/run.json").read_text())["run_id"]
    client = MlflowClient(tracking.tracking_uri())
    assert first_id and client.get_run(first_id).info.status == "FAILED"
    assert _ckpt_step(out / "ckpt/last.ckpt") == 20

    run_id, resumed = stage()
    assert run_id == first_id and client.get_run(run_id).info.status == "FINISHED"
    for key in ("val_loss", "train_loss", "sharpness", "gamma_mean", "steps"):
        assert resumed[key] == pytest.approx(straight[key], abs=1e-6), key
    assert (out / "model/curve.csv").read_text() == (tmp_path / "straight/model/curve.csv").read_text()
    logged = client.get_metric_history(run_id, "train/loss")
    assert sorted(m.step for m in logged) == list(range(1, 41))  # 1..20 before the crash, 21..40 after


def test_the_tracker_gets_the_cadence_and_every_periodic_step_the_curve_every_step(tmp_path, shards):
    """log_every 4 over 14 steps, validation every 5, γ every 7: MLflow holds the training metrics of steps 4, 8, 12,
    the validation and γ steps and the last; curve.csv all 14. The heap is frozen while training and no longer after."""
    import gc

    class Frozen(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.count = gc.get_freeze_count()

    params, cell, frozen = parse_params(micro_raw(max_steps=14, log_every=4, val_every=5, gamma_every=7)), \
        Cell("standard", "a", "base", 0), Frozen()
    with tracking.stage_run("pretrain-test", params={}) as run:
        fit(params, cell, tmp_path, shards, run, callbacks=[frozen])
    client = MlflowClient(tracking.tracking_uri())
    steps = lambda key: sorted(m.step for m in client.get_metric_history(run.run_id, key))  # noqa: E731
    assert steps("train/loss") == [4, 5, 7, 8, 10, 12, 14]
    assert steps("val/loss") == [5, 10, 14] and steps("gamma_mean/input") == [7, 14]
    assert len(list(csv.reader((tmp_path / "model/curve.csv").open()))) == 1 + 14
    assert frozen.count > 10_000 and gc.get_freeze_count() == 0  # the imports' objects, frozen; all handed back


def test_lean_takes_off_only_the_per_step_hooks_a_callback_leaves_to_lightning():
    """The hooks a class defines stay (fit's callbacks still run: the cadence test's callback above is one); the
    per-step no-ops become None, which Lightning's dispatch skips; hooks fired once a fit are untouched."""
    from lightning.pytorch.trainer import call

    from scalelab.train.callbacks import NonFiniteGuard, Throughput
    from scalelab.train.dispatch import PER_STEP, lean

    guard, clock = lean([NonFiniteGuard(), Throughput(1, 1.0, 1.0)])
    assert guard.on_train_batch_start is None and guard.on_after_backward is None
    assert callable(guard.on_before_optimizer_step) and callable(guard.on_train_batch_end)
    assert callable(clock.on_train_batch_start) and callable(clock.on_train_start) and clock.on_before_backward is None
    assert callable(guard.on_train_start) and callable(guard.on_exception)  # not per step: left to Lightning
    seen = []
    trainer = SimpleNamespace(lightning_module=None, callbacks=[guard],
                              profiler=SimpleNamespace(profile=lambda name: (seen.append(name), contextlib.nullcontext())[1]))
    for hook in PER_STEP:
        if hook not in ("on_train_batch_end", "on_before_optimizer_step"):
            call._call_callback_hooks(trainer, hook)
    assert seen == []  # no dispatch at all for the hooks it does not define


def test_gradient_accumulation_matches_one_batch(tmp_path, shards):
    """SGD without clipping: unlike Adam, its update scales with the gradient, so a mis-scaled sum shows."""
    runs = [fit(parse_params(micro_raw(max_steps=6, accumulate=acc, grad_clip=0)), Cell("standard", "a", "sgd", 0),
                tmp_path / str(acc), shards) for acc in (1, 4)]
    assert runs[0]["val_loss"] == pytest.approx(runs[1]["val_loss"], abs=1e-5)
    assert runs[0]["train_loss"] == pytest.approx(runs[1]["train_loss"], abs=1e-5)


def test_nonfinite_guard_fails_fast_and_keeps_last_good_checkpoint(tmp_path, shards):
    params, cell = parse_params(micro_raw(max_steps=20)), Cell("standard", "a", "muon", 0)
    with pytest.raises(FloatingPointError, match="non-finite training values at step 10"):
        fit(params, cell, tmp_path, shards, callbacks=[FailAt(10, poison=True)])
    assert _ckpt_step(tmp_path / "ckpt/last.ckpt") == 10
    assert torch.isfinite(torch.load(tmp_path / "ckpt/last.ckpt", weights_only=True)["state_dict"]
                          ["model.embed.weight"]).all()
    assert not (tmp_path / "model").exists() and not (tmp_path / "model/metrics.json").exists()


def test_stream_starts_at_the_restored_step_and_ranks_split_the_global_batch(shards):
    cfg, tok = parse_params(micro_raw(max_steps=8)).pretrain, open_shards(shards)
    ranks = []
    for rank in (0, 1):
        dm = TokenDataModule(tok, cfg, seed=3)
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2, lightning_module=SimpleNamespace(step=5))
        ranks.append((list(dm.train_dataloader()), dm.val_share()))
    (stream0, val0), (stream1, val1) = ranks
    assert len(stream0) == len(stream1) == 3  # steps 5, 6, 7
    for step, (x0, y0), (x1, y1) in zip(range(5, 8), stream0, stream1):
        x, y = train_batch(tok.train, seed=3, step=step, batch_size=8, seq_len=32)
        assert torch.equal(x[0::2], x0) and torch.equal(x[1::2], x1) and torch.equal(y[1::2], y1)
    whole = val_batches(tok.val, seq_len=32, val_tokens=1024, batch_size=8)
    assert len(val0) + len(val1) == len(whole) == 4  # 1024 tokens in windows of 32, batches of 8
    for share, expected in ((val0, whole[0::2]), (val1, whole[1::2])):
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(share, expected, strict=True))


def test_power_iteration_finds_top_eigenvalue_of_least_squares():
    """loss = ½·mean((Ax − b)²) has Hessian AᵀA/n; compare with eigvalsh."""
    gen = torch.Generator().manual_seed(0)
    n, d = 40, 6
    q, _ = torch.linalg.qr(torch.randn(n, d, generator=gen, dtype=torch.float64))
    a = q * torch.tensor([9.0, 4.0, 2.0, 1.0, 0.5, 0.1], dtype=torch.float64)  # singular values: a clear gap
    b = torch.randn(n, generator=gen, dtype=torch.float64)
    x = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    expected = torch.linalg.eigvalsh(a.T @ a / n).max().item()
    got = top_hessian_eigenvalue(lambda: 0.5 * ((a @ x - b) ** 2).mean(), [x], iters=30)
    assert got == pytest.approx(expected, rel=1e-6)
    assert top_hessian_eigenvalue(lambda: 0.5 * ((a @ x - b) ** 2).mean(), [x], iters=1) < expected * 0.999


def test_power_iteration_returns_the_largest_not_the_most_negative_eigenvalue():
    """An indefinite Hessian (a saddle) whose largest-magnitude eigenvalue is negative: sharpness is λ_max."""
    eigs = torch.tensor([-5.0, 2.0, 0.5], dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    h = q @ torch.diag(eigs) @ q.T
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    got = top_hessian_eigenvalue(lambda: 0.5 * x @ h @ x, [x], iters=60)
    assert got == pytest.approx(2.0, rel=1e-4)


def test_stale_checkpoint_is_moved_aside_not_resumed(tmp_path, shards):
    cell = Cell("standard", "a", "base", 0)
    old, new = parse_params(micro_raw(max_steps=10)), parse_params(micro_raw(max_steps=10, grad_clip=0.5))
    fit(old, cell, tmp_path, shards)
    old_hash, old_bytes = config_hash(old, cell, shards), (tmp_path / "ckpt/last.ckpt").read_bytes()
    assert config_hash(new, cell, shards) != old_hash and resume_run_id(tmp_path, config_hash(new, cell, shards)) is None

    resumed_or_not = fit(new, cell, tmp_path, shards)
    stale = tmp_path / "ckpt" / f"stale-{old_hash}"
    assert hashlib.sha256((stale / "last.ckpt").read_bytes()).digest() == hashlib.sha256(old_bytes).digest()
    assert json.loads((stale / "run.json").read_text())["config_hash"] == old_hash
    assert json.loads((tmp_path / "ckpt/run.json").read_text())["config_hash"] == config_hash(new, cell, shards)
    fresh = fit(new, cell, tmp_path / "fresh", shards)
    assert resumed_or_not["val_loss"] == fresh["val_loss"]  # trained from scratch, not continued from the old one


def test_unsupported_options_fail_before_compute(tmp_path, shards):
    cell = Cell("standard", "a", "base", 0)
    for bad, match in (({"precision": "16-mixed"}, r"pretrain\.precision"), ({"strategy": "ddp_spawn"}, "strategy"),
                       ({"batch_size": 8, "accumulate": 8, "devices": 2}, "split evenly")):
        with pytest.raises(ParamsError, match=match):
            fit(parse_params(micro_raw(**bad)), cell, tmp_path, shards)
    with pytest.raises(ParamsError, match="recipe 'nope'"):
        fit(parse_params(micro_raw()), Cell("standard", "a", "nope", 0), tmp_path, shards)
    assert not (tmp_path / "ckpt").exists()


def test_peak_flops_measures_a_matmul_rate():
    fp32 = peak_flops(torch.float32, seconds=0.05)
    assert 1e9 < fp32 < 1e13  # 2 CPU cores: ~2e11


def test_an_h200_reads_its_dense_bf16_peak_not_lightnings_sparse_one():
    """MFU is against dense matmuls: the datasheet's H200 figure with sparsity is twice that, and the names the driver
    reports ("NVIDIA H200", "NVIDIA H200 NVL") are not the keys of Lightning's table."""
    from lightning.fabric.utilities.throughput import _CUDA_FLOPS

    from scalelab.train.device import datasheet_peak

    assert _CUDA_FLOPS["h200 sxm1"][torch.bfloat16] > 1.9e15  # Lightning's: the sparse figure (drop ours if fixed)
    assert datasheet_peak("NVIDIA H200", torch.bfloat16) == pytest.approx(1979e12 / 2)
    assert datasheet_peak("NVIDIA H200 NVL", torch.bfloat16) == pytest.approx(1671e12 / 2)
    assert datasheet_peak("NVIDIA H200", torch.float32) is None  # fp32 and other chips: Lightning's table, or measured
    assert datasheet_peak("NVIDIA H100 80GB HBM3", torch.bfloat16) is None


def test_a_completed_run_is_not_resumed_when_its_cell_reruns(tmp_path, shards):
    """DVC reruns a finished cell only when its code or inputs changed: that rerun trains, its old checkpoint kept."""
    params, cell = parse_params(micro_raw(max_steps=10)), Cell("standard", "a", "base", 0)
    first = fit(params, cell, tmp_path, shards)
    chash = config_hash(params, cell, shards)
    assert json.loads((tmp_path / "ckpt/run.json").read_text())["complete"] is True
    assert resume_run_id(tmp_path, chash) is None
    again = fit(params, cell, tmp_path, shards)
    assert again["val_loss"] == first["val_loss"] and again["steps"] == 10  # retrained (deterministic), not resumed
    assert (tmp_path / "ckpt" / f"stale-{chash}" / "last.ckpt").is_file()


@pytest.mark.parametrize("variant,recipe", [("standard", "base"), ("unified", "base"), ("unified", "moe")])
def test_flops_per_token_is_what_torch_counts(variant, recipe):
    """MFU's numerator: the model's analytic training FLOPs per token equal Lightning's `measure_flops` (torch's
    FlopCounter over a forward and backward) on the micro model, MoE routing included. Under the math attention
    kernel, whose QKᵀ and AV matmuls the counter sees (it has no formula for the fused CPU kernel)."""
    raw = micro_raw(recipes={"base": {"optimizer": "adamw"}, "moe": {"optimizer": "adamw", "moe": True}})
    raw["model"]["moe"] = {"n_experts": 4, "top_k": 2, "shared_expert": True}
    model = Transformer(parse_params(raw).resolve_model("a", variant, vocab_size=VOCAB, recipe=recipe))
    x, y = torch.randint(0, VOCAB, (2, 32)), torch.randint(0, VOCAB, (2, 32))
    with sdpa_kernel(SDPBackend.MATH):
        counted = measure_flops(model, lambda: model(x, y).loss, loss_fn=lambda loss: loss)
    assert model.flops_per_token(32) == pytest.approx(counted / x.numel(), rel=1e-9)


@mutant("flops-6n-all-params")
def _(monkeypatch):  # 6·N over every parameter (embedding, all experts, scale vectors): an MFU that flatters
    monkeypatch.setattr(Transformer, "flops_per_token",
                        lambda self, seq_len: 6.0 * self.num_params() + 12.0 * self.cfg.n_layer * self.cfg.d_model
                        * seq_len)


@pytest.mark.mutation
def test_flops_check_catches_an_overcount():
    assert_caught("tests/test_train.py::test_flops_per_token_is_what_torch_counts", "flops-6n-all-params")

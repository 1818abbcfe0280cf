"""METHODS §B optimizer benchmark: every registered family trains; state bytes are exact; matrix families take exactly
the hidden matrices; a diverging LR is recorded and the sweep goes on; a resumed run continues with the same
optimizer state (every family's state dict, and through the trainer for the families with loop hooks)."""

import json
import math

import pytest
import pytorch_optimizer as po
import torch
import torch.optim._muon as torch_muon
from mutants import mutant, mutation_checks
from pytorch_optimizer.optimizer.utils.galore import GaLoreProjector
from test_train import FailAt, make_shards

from scalelab.config import OptimizerConfig, ParamsError, load_params
from scalelab.analysis import leaderboard
from scalelab.train import optbench
from scalelab.model import Transformer
from scalelab.optim import OPTIMIZERS, build_optimizers, families, hooks
from scalelab.train import Cell, fit

MICRO_VOCAB = 64


@pytest.fixture(scope="module")
def params():
    from conftest import MICRO

    return load_params(MICRO)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("tokens"), vocab=MICRO_VOCAB, n_train=20_000, n_val=2_000)


def _model(params, seed=0):
    torch.manual_seed(seed)
    return Transformer(params.resolve_model("a", "standard", vocab_size=MICRO_VOCAB))


def _cfg(params, name):
    """The optim entry of the micro profile whose registry name is `name`."""
    return next(c for c in params.optim.values() if c.name == name)


def _train(model, opts, batch, steps):
    """The training loop's optimizer protocol (Schedule-Free's iterate, Sophia's estimates), `steps` times."""
    return [optbench.train_step(model, opts, *batch, seed=step) for step in range(steps)]


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, MICRO_VOCAB, (4, 17), generator=g)
    return x[:, :-1], x[:, 1:]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_registered_optimizer_lowers_the_loss(params, name):
    model = _model(params)
    opts = build_optimizers(model, _cfg(params, name), model.cfg.scale)
    before = [p.detach().clone() for p in hooks.params_of(opts[0])]
    losses = _train(model, opts, _batch(), 20)
    assert all(math.isfinite(v) for v in losses)
    # the family's own parameters moved: the side AdamW alone drops the loss 4.13 -> ~2.3 (embeddings and head)
    assert all(not torch.equal(a, b) for a, b in zip(before, hooks.params_of(opts[0]))), name
    assert losses[-1] < losses[0] - 0.1, (name, losses[0], losses[-1])
    with hooks.eval_weights(opts):  # Schedule-Free's average x is a trained model too
        assert model(*_batch()).loss.item() < losses[0] - 0.1


def test_state_bytes_are_exact_for_adamw_and_sgd(params):
    model = _model(params)
    n = sum(p.numel() for p in model.parameters())
    opts = build_optimizers(model, OptimizerConfig(name="adamw", lr=1e-3), model.cfg.scale)
    _train(model, opts, _batch(), 1)
    assert hooks.state_bytes(opts) == 2 * 4 * n  # exp_avg and exp_avg_sq, fp32; step counters left out
    opts = build_optimizers(model, OptimizerConfig(name="sgd", lr=1e-2, momentum=0.9, adamw_lr=1e-3),
                            model.cfg.scale)
    _train(model, opts, _batch(), 1)
    sgd, side = (sum(p.numel() for p in hooks.params_of(o)) for o in opts)
    assert sgd + side == n and side > 0  # the scale vectors: AdamW
    assert hooks.state_bytes(opts[:1]) == 4 * sgd  # one momentum buffer
    assert hooks.state_bytes(opts) == 4 * sgd + 8 * side


@pytest.mark.parametrize("name", sorted(n for n, s in OPTIMIZERS.items() if s.matrices_only))
def test_matrix_families_take_exactly_the_hidden_matrices(params, name):
    model = _model(params)
    opts = build_optimizers(model, _cfg(params, name), model.cfg.scale)
    hidden = {id(p) for n, p in model.named_parameters() if model.param_kind(n) == "matrix"}
    assert {id(p) for p in hooks.params_of(opts[0])} == hidden and len(hidden) == 7  # q k v o gate up down
    assert all(p.ndim == 2 for p in hooks.params_of(opts[0]))
    side = {id(p) for p in hooks.params_of(opts[1])}
    assert isinstance(opts[1], torch.optim.AdamW) and id(model.embed.weight) in side
    assert id(model.lm_head.weight) in side and len(side | hidden) == len(list(model.parameters()))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_dict_round_trip_continues_identically(params, name, tmp_path):
    """Save after 3 steps, load weights-only into a fresh model and optimizer, 3 more steps: the same as 6 straight."""
    cfg = _cfg(params, name)
    model = _model(params)
    opts = build_optimizers(model, cfg, model.cfg.scale)
    _train(model, opts, _batch(0), 3)
    torch.save({"model": model.state_dict(), "opts": [o.state_dict() for o in opts]}, tmp_path / "c.pt")
    _train(model, opts, _batch(1), 3)

    saved = torch.load(tmp_path / "c.pt", weights_only=True)
    other = _model(params, seed=1)
    other.load_state_dict(saved["model"])
    reopts = build_optimizers(other, cfg, other.cfg.scale)
    for o, s in zip(reopts, saved["opts"]):
        o.load_state_dict(s)
    _train(other, reopts, _batch(1), 3)
    for (n, a), b in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(a, b), (name, n)
    for o, r in zip(opts, reopts):  # the optimizers' own state continued identically, too
        _assert_same_state(o.state_dict(), r.state_dict(), name)
    assert opts[0].state and len(opts[0].state) == len(hooks.params_of(opts[0])), name  # state for each parameter
    # the family's own parameters moved after the resume (with its step a no-op, both runs would agree trivially)
    names = {id(p): n for n, p in other.named_parameters()}
    for p in hooks.params_of(reopts[0]):
        assert not torch.equal(p, saved["model"][names[id(p)]]), (name, names[id(p)])


def _assert_same_state(a: object, b: object, where: str) -> None:
    """Two optimizer state dicts hold equal tensors and values (nested in dicts and lists)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _bench_params(params, **optimizers):
    return params.model_copy(update={"optimizers": params.optimizers.model_copy(update=optimizers)})


@pytest.mark.parametrize("name", ["sf_adamw", "sophia", "galore"])
def test_resumed_run_continues_with_the_same_state(params, shards, tmp_path, name):
    """Through fit: a crash after the step-6 checkpoint, then a resume, ends where an uninterrupted run ends. The
    families whose state crosses the loop's hooks: Schedule-Free (checkpointed at its averaged weights), Sophia
    (estimates drawn by step), GaLore (its projector saved as tensors)."""
    key = next(k for k, c in params.optim.items() if c.name == name)
    sub = optbench.run_params(params, key, params.optim[key].lr)
    cell = Cell("standard", "a", optbench.RECIPE, 0)
    straight = fit(sub, cell, tmp_path / "straight", shards)
    with pytest.raises(RuntimeError, match="killed"):
        fit(sub, cell, tmp_path / "resumed", shards, callbacks=[FailAt(6, RuntimeError("killed"))])
    resumed = fit(sub, cell, tmp_path / "resumed", shards)
    assert resumed["val_loss"] == pytest.approx(straight["val_loss"], abs=1e-6)
    assert ((tmp_path / "straight/model/curve.csv").read_text() == (tmp_path / "resumed/model/curve.csv").read_text())
    # the optimizers' own state (GaLore's projector, Sophia's Hessian EMA) ended the same, and it exists: a state
    # entry for every parameter the family holds (a no-op family step leaves it empty and both runs equal)
    ck = [torch.load(tmp_path / d / "ckpt/last.ckpt", weights_only=True) for d in ("straight", "resumed")]
    _assert_same_state(ck[0]["optimizer_states"], ck[1]["optimizer_states"], name)
    own = ck[0]["optimizer_states"][0]
    assert len(own["state"]) == sum(len(g["params"]) for g in own["param_groups"]) > 0, name


def test_schedule_free_validates_and_exports_its_average(params, shards, tmp_path):
    from scalelab.model.export import load_exported

    sub = optbench.run_params(params, "sf_adamw", params.optim["sf_adamw"].lr)
    m = fit(sub, Cell("standard", "a", optbench.RECIPE, 0), tmp_path, shards)
    assert sub.pretrain.recipes[optbench.RECIPE].schedule.name == "constant"  # no decay: the average is the decay
    ckpt = torch.load(tmp_path / "ckpt/last.ckpt", weights_only=True)
    assert ckpt["optimizer_states"][0]["param_groups"][0]["train_mode"] is False  # saved at the average x
    exported = load_exported(tmp_path / "model").state_dict()
    torch.testing.assert_close(exported["embed.weight"], ckpt["state_dict"]["model.embed.weight"])
    assert math.isfinite(m["val_loss"])


def test_a_diverging_lr_is_flagged_and_the_sweep_goes_on(params, shards, tmp_path):
    """SGD without clipping over a grid from 1e-3 to 1e3: the top run blows up (recorded, its MLflow run FAILED),
    the ones below train, and the best LR is one of those."""
    raw = params.model_copy(update={
        "optim": {**params.optim, "sgd": params.optim["sgd"].model_copy(update={"lr": 1.0, "adamw_lr": 1e-3})},
        "pretrain": params.pretrain.model_copy(update={"grad_clip": 0.0})})
    sub = _bench_params(raw, optimizers=["adamw", "sgd"], lr_ratio=100.0)
    cell = optbench.sweep_cell(sub, "sgd", "a", tmp_path, shards, "optimizers@sgd-a")
    flags = [r["diverged"] for r in sorted(cell["runs"], key=lambda r: r["lr"])]
    assert flags[1] is None and flags[-1] in (optbench.NON_FINITE, optbench.ABOVE_START), flags
    assert cell["best_lr"] < 1.0 and math.isfinite(cell["best_val_loss"])
    assert cell["step_time_ratio"] > 0 and cell["state_bytes_per_param"] > 0
    # a rerun of the cell reuses every finished or diverged run instead of training again
    again = optbench.sweep_cell(sub, "sgd", "a", tmp_path, shards, "optimizers@sgd-a")
    assert [r["config_hash"] for r in again["runs"]] == [r["config_hash"] for r in cell["runs"]]
    assert json.loads((tmp_path / f"lr{optbench.lr_key(cell['lr_grid'][-1])}-s0/result.json").read_text())[
        "diverged"] == flags[-1]
    # the seed stage reads the sweep's metrics: best LR on the held-out seeds; as the baseline, also its default LR
    sub = _bench_params(sub, baseline="sgd")
    seeds = optbench.seeds_cell(sub, "sgd", "a", optbench.cell_metrics(cell), tmp_path / "seeds", shards, "s")
    jobs = sorted((r["lr"], r["seed"]) for r in seeds["runs"])
    assert jobs == sorted([(cell["best_lr"], 1), (cell["best_lr"], 2), (1.0, 0), (1.0, 1), (1.0, 2)])


def test_muon_newton_schulz_in_float32_is_torchs_iteration():
    """The CPU Muon's float32 Newton-Schulz agrees with torch's bfloat16 one to bfloat16 precision and, like it,
    maps every singular value into the quintic's band around 1 (Keller Jordan: about 0.5-1.5)."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from scalelab.optim.families import _newton_schulz_fp32

    coeffs = (3.4445, -4.775, 2.0315)
    for shape in ((24, 40), (40, 24)):
        g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        mine = _newton_schulz_fp32(g, coeffs, 5, 1e-7)
        assert mine.dtype == torch.float32 and mine.shape == g.shape
        torch.testing.assert_close(mine, _zeropower_via_newtonschulz(g, coeffs, 5, 1e-7).float(), atol=0.02, rtol=0)
        s = torch.linalg.svdvals(mine)
        assert s.min() > 0.5 and s.max() < 1.5


def test_tokens_to_reach_interpolates_and_says_never():
    curve = [(100, 5.0), (200, 4.0), (300, 3.0)]
    assert leaderboard.tokens_to_reach(curve, 3.5) == pytest.approx(250)
    assert leaderboard.tokens_to_reach(curve, 6.0) == 100
    assert leaderboard.tokens_to_reach(curve, 2.0) is None


def test_leaderboard_speedup_and_claims_from_synthetic_cells(params):
    """Baseline curves end at 4.0 after 1000 tokens; the other optimizer gets there at 500 on every seed (speed-up
    2x) and ends 0.1 lower on the held-out seeds: reproduced, from those seeds only."""
    ob = params.optimizers.model_copy(update={"optimizers": ["adamw", "muon"], "sizes": ["a", "b"]})
    sub = params.model_copy(update={"optimizers": ob})
    cells, runs, curves = {}, [], {}
    for opt, lr, final, half in (("adamw", 3e-3, 4.0, 4.5), ("muon", 1e-2, 3.9, 4.0)):
        for size in ob.sizes:
            grid = ob.lr_grid(params.optim[opt].lr)
            mine = [{"optimizer": opt, "size": size, "seed": s, "lr": lr, "val_loss": final + 0.01 * s,
                     "diverged": None, "params": 1000} for s in (ob.seed, *ob.rerun_seeds)]
            cells[opt, size] = {"best_lr": lr, "lr_grid": grid, "family": "x", "library": "y", "diverged": 0,
                                "n_runs": 4, "step_time_ratio": 1.0, "state_bytes_per_param": 8.0,
                                "peak_mem_mb": 1.0, "runs": {str(i): r for i, r in enumerate(mine[:1])}}
            runs += mine
            for r in mine:
                curves[opt, size, r["seed"], lr] = [(500, half + 0.01 * r["seed"]), (1000, r["val_loss"])]
    sp = leaderboard.speedups(cells, runs, curves, ob, "muon", "a")
    assert sp == {s: pytest.approx(2.0) for s in (ob.seed, *ob.rerun_seeds)}
    df = leaderboard.table(sub, cells, runs, curves)
    row = df.filter((df["optimizer"] == "muon") & (df["size"] == "a")).row(0, named=True)
    assert row["speedup"] == pytest.approx(2.0) and row["n_seeds"] == 3 and row["lr_at_edge"] is False
    entries = {e["id"]: e for e in leaderboard.claims(sub, cells, runs)}
    e = entries["b-muon-beats-adamw-a"]
    assert e["n_seeds"] == len(ob.rerun_seeds) and e["effect"] == pytest.approx(0.1)
    assert e["verdict"] == "reproduced" and "Wen et al." in e["published"]
    assert entries["b-tuned-adamw-a"]["verdict"].startswith("inconclusive")  # no default-LR runs here
    assert "2.00x (3/3)" in leaderboard.markdown(df)


def test_bad_cell_names_fail_before_compute(params):
    with pytest.raises(ParamsError, match="--optimizer 'adamv'"):
        params.optimizers.check_cell("adamv", "a")
    with pytest.raises(ParamsError, match="--size 'z'"):
        params.optimizers.check_cell("adamw", "z")
    assert params.optimizers.lr_grid(1.0) == pytest.approx([3 ** -1.5, 3 ** -0.5, 3 ** 0.5, 3 ** 1.5])


def test_step_time_pairs_alternate_which_optimizer_steps_first(params, shards, monkeypatch):
    """The timing's pairs take turns going first: always second, AdamW timed against itself read 1.08-1.09."""
    firsts, calls = [], []

    def step(model, opts, x, y, seed):
        calls.append(opts[0].__class__.__name__)
        if len(calls) % 2:
            firsts.append(calls[-1])
        return 0.0

    monkeypatch.setattr(optbench, "train_step", step)
    sub = _bench_params(params, optimizers=["adamw", "sgd"], timing_steps=4)
    ratio = optbench.step_time_ratio(sub, "sgd", "a", shards)
    assert firsts == ["AdamW", "SGD"] * 3 and len(calls) == 12
    assert ratio["step_time_ratio"] > 0


def _family_step(params, name, warm=0):
    """Step `warm + 1` of the family on the micro model: per parameter of the family's own optimizer, (weight before,
    weight after, gradient, its group), and that optimizer."""
    model = _model(params)
    opts = build_optimizers(model, _cfg(params, name), model.cfg.scale)
    _train(model, opts, _batch(0), warm)
    model(*_batch(1)).loss.backward()
    before = [(p, p.detach().clone(), p.grad.clone(), g) for g in opts[0].param_groups for p in g["params"]]
    for o in opts:
        o.step()
    return [(w0, p.detach().clone(), grad, g) for p, w0, grad, g in before], opts[0]


def _undecayed(w0, w1, group):
    """The update u with w1 = (w0 − u)·(1 − lr·wd) or w0·(1 − lr·wd) − u: decoupled decay taken out."""
    return w0 - w1 / (1 - group["lr"] * group["weight_decay"])


def test_muon_update_is_the_orthogonalised_momentum_rms_matched(params):
    """Moonshot's Muon (arXiv 2502.16982): W ← W − η(0.2·sqrt(max(A,B))·NS5(M) + λW). On the first step M ∝ G, so
    the update divided by η·0.2·sqrt(max(A,B)) is NS5(G): close to the polar factor U·Vᵀ of G, its singular values in
    the quintic's band (0.5-1.5) where G has any (the gradient's own spread reaches 300x), and the update's RMS
    about 0.2·η (AdamW's), since an orthogonal A×B matrix has RMS 1/sqrt(max(A,B))."""
    steps, _ = _family_step(params, "muon")
    assert len(steps) == 7
    for w0, w1, grad, g in steps:
        step = w0 * (1 - g["lr"] * g["weight_decay"]) - w1
        u = step / (g["lr"] * 0.2 * math.sqrt(max(w0.shape)))
        left, sg, right = torch.linalg.svd(grad, full_matrices=False)
        polar = left @ right
        assert (u * polar).sum() / (u.norm() * polar.norm()) > 0.95, w0.shape
        s = torch.linalg.svdvals(u)[: int((sg > 1e-2 * sg[0]).sum())]
        assert s.min() > 0.5 and s.max() < 1.5, (w0.shape, s.min(), s.max())
        assert 0.7 < step.pow(2).mean().sqrt() / (0.2 * g["lr"]) < 1.1, w0.shape


def test_soap_update_is_adam_in_shampoos_eigenbasis(params):
    """SOAP (Vyas et al. 2024): Q_L, Q_R are the eigenvectors of Shampoo's factors E[G·Gᵀ], E[Gᵀ·G]; the update is
    Adam's in the rotated frame, Q_L·Adam(Q_Lᵀ·G·Q_R)·Q_Rᵀ. Its first step only sets the preconditioner: Q then
    diagonalises that gradient's G·Gᵀ and Gᵀ·G. Adam's first step is lr·sign, so the next step's rotated update
    Q_Lᵀ·u·Q_R is lr·sign(Q_Lᵀ·G·Q_R), and u is nothing like plain Adam's lr·sign(G)."""
    first, opt = _family_step(params, "soap")
    assert len(opt.state) == len(first) == 7
    for (w0, w1, grad, g), s in zip(first, opt.state.values()):
        assert torch.equal(w0, w1)
        for q, gram in zip(s["Q"], (grad @ grad.T, grad.T @ grad)):
            d = q.T @ gram @ q
            assert (d - torch.diag(torch.diag(d))).norm() < 1e-4 * d.norm(), w0.shape
    second, opt = _family_step(params, "soap", warm=1)
    for (w0, w1, grad, g), s in zip(second, opt.state.values()):
        left, right = s["Q"]  # refreshed every 10 steps: the frame step 2 used
        u = _undecayed(w0, w1, g)
        want = g["lr"] * torch.sign(left.T @ grad @ right)
        assert (left.T @ u @ right - want).norm() < 0.1 * want.norm(), w0.shape
        assert (u - g["lr"] * torch.sign(grad)).norm() > 0.5 * want.norm(), w0.shape


def test_galore_update_is_adam_in_the_gradients_top_rank_subspace(params):
    """GaLore (Zhao et al. 2024): the gradient is projected onto its top-r singular vectors on its smaller side (left
    for wide matrices, right otherwise; r = a quarter of that side), Adam runs on the r-wide
    projection and the update comes back scaled by `scale`. On the first step: u has rank r, lies in that subspace,
    and is Adam's lr·sign on the projection, so ‖u‖_F = scale·lr·sqrt(r·max(A, B))."""
    steps, opt = _family_step(params, "galore")
    assert len(opt.state) == len(steps) == 7
    for w0, w1, grad, g in steps:
        u, r = _undecayed(w0, w1, g), g["rank"]
        assert r == min(w0.shape) // 4
        left, _, right = torch.linalg.svd(grad, full_matrices=False)
        wide = w0.shape[0] < w0.shape[1]
        top = left[:, :r] if wide else right[:r].T
        inside = top @ top.T @ u if wide else u @ top @ top.T
        assert (u - inside).norm() < 1e-4 * u.norm(), w0.shape
        assert torch.linalg.matrix_rank(u, rtol=1e-4) == r, w0.shape
        assert u.norm() == pytest.approx(g["scale"] * g["lr"] * math.sqrt(r * max(w0.shape)), rel=0.01), w0.shape


# Mutation checks (tests/mutants.py): each family's own step broken, and the tests above that must notice.
def _noop(self, closure=None, **kwargs):
    return None


@mutant("muon-noop")
def _(monkeypatch):
    monkeypatch.setattr(families.Muon, "step", _noop)


@mutant("muon-unorthogonalised")  # the momentum normalised to the same Frobenius norm, not orthogonalised
def _(monkeypatch):
    monkeypatch.setattr(families, "_newton_schulz_fp32",
                        lambda g, coeffs, steps, eps: g.float() / g.norm() * math.sqrt(min(g.shape)))


@mutant("muon-unmatched-rms")  # torch's default scale sqrt(max(1, A/B)) instead of Moonshot's 0.2·sqrt(max(A, B))
def _(monkeypatch):
    monkeypatch.setattr(torch_muon, "_adjust_lr", lambda lr, fn, shape: lr * math.sqrt(max(1, shape[0] / shape[1])))


@mutant("soap-noop")
def _(monkeypatch):
    monkeypatch.setattr(po.SOAP, "step", _noop)


@mutant("soap-unrotated")  # plain Adam: the eigenbasis projection is the identity
def _(monkeypatch):
    monkeypatch.setattr(po.SOAP, "project", lambda self, grad, state, **kwargs: grad)


@mutant("galore-noop")
def _(monkeypatch):
    monkeypatch.setattr(families.GaLore, "step", _noop)


@mutant("galore-unprojected")  # full-rank Adam: projection and its way back are the identity
def _(monkeypatch):
    monkeypatch.setattr(GaLoreProjector, "project", lambda self, grad, steps, *a, **k: grad)
    monkeypatch.setattr(GaLoreProjector, "project_back", lambda self, grad: grad)


T = "tests/test_optimizers.py::"
CAUGHT = [
    ("muon-noop", f"{T}test_every_registered_optimizer_lowers_the_loss[muon]"),
    ("muon-noop", f"{T}test_muon_update_is_the_orthogonalised_momentum_rms_matched"),
    ("muon-noop", f"{T}test_state_dict_round_trip_continues_identically[muon]"),
    ("muon-unorthogonalised", f"{T}test_muon_update_is_the_orthogonalised_momentum_rms_matched"),
    ("muon-unmatched-rms", f"{T}test_muon_update_is_the_orthogonalised_momentum_rms_matched"),
    ("soap-noop", f"{T}test_every_registered_optimizer_lowers_the_loss[soap]"),
    ("soap-noop", f"{T}test_soap_update_is_adam_in_shampoos_eigenbasis"),
    ("soap-noop", f"{T}test_state_dict_round_trip_continues_identically[soap]"),
    ("soap-unrotated", f"{T}test_soap_update_is_adam_in_shampoos_eigenbasis"),
    ("galore-noop", f"{T}test_every_registered_optimizer_lowers_the_loss[galore]"),
    ("galore-noop", f"{T}test_galore_update_is_adam_in_the_gradients_top_rank_subspace"),
    ("galore-noop", f"{T}test_state_dict_round_trip_continues_identically[galore]"),
    ("galore-noop", f"{T}test_resumed_run_continues_with_the_same_state[galore]"),
    ("galore-unprojected", f"{T}test_galore_update_is_adam_in_the_gradients_top_rank_subspace"),
]


test_a_broken_family_is_caught = mutation_checks(CAUGHT)

"""The rank allocation, the reusable results store and SigmaScale's stopping rules, on tiny random models."""

import json
import math

import numpy as np
import pytest
import torch
from mutants import mutant, mutation_checks

from scalelab.compress import compressor, keys, sensitivity
from scalelab.compress.calibrate import decoder_linears
from scalelab.compress.shared import Calibration
from scalelab.compress.sigmascale import initial_scalings, problem_of, scaled_loss
from scalelab.compress.store import Store
from scalelab.config import MethodConfig, ParamsError, SigmaScaleConfig
from scalelab.runtime import yamlio

D, FF, V = 32, 48, 96
FAST = SigmaScaleConfig(lr=2e-2, max_steps=40, patience=10, tol=1e-4)
SIGMA = MethodConfig(kind="sigmascale")


def tiny(arch: str = "llama", seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=V, hidden_size=D, intermediate_size=FF, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = (Qwen3ForCausalLM(Qwen3Config(**common)) if arch == "qwen3"
             else LlamaForCausalLM(LlamaConfig(**common))).eval()
    with torch.no_grad():  # anisotropic inputs, as in trained models
        for layer in model.model.layers:
            layer.input_layernorm.weight.copy_(torch.randn(D).mul(0.8).exp())
            layer.post_attention_layernorm.weight.copy_(torch.randn(D).mul(0.8).exp())
    return model


def batches(n: int = 3, b: int = 4, t: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, V, (b, t), generator=g), torch.randint(0, V, (b, t), generator=g)) for _ in range(n)]


def names_of(model):
    return [n for block in decoder_linears(model) for n in block]


def _layer(m=12, n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(m, n, generator=g, dtype=torch.float64)
    x = torch.randn(n, 60, generator=g, dtype=torch.float64) * torch.rand(n, 1, generator=g, dtype=torch.float64) * 3
    return w.float(), x @ x.T


# ---------------------------------------------------------------- per-map initial scalings
def _starts(monkeypatch, model, calib, ranks):
    """Each map's initial scalings as compress_model draws them (the optimisation itself skipped)."""
    seen = {}

    def capture(weight, k, gram, d_r, d_c, **kw):
        name = next(n for n in names_of(model) if model.get_submodule(n).weight.shape == weight.shape
                    and torch.equal(model.get_submodule(n).weight, weight))
        seen[name] = (d_r.clone(), d_c.clone())
        from scalelab.compress.sigmascale import Run

        return Run(d_r, d_c, {"stop": "cap", "steps": 0})

    monkeypatch.setattr(compressor, "optimise", capture)
    compressor.compress_model(model, calib, SIGMA, 0.5, sigma_cfg=FAST, ranks=ranks, seed=3)
    return seen


def test_a_maps_initial_scalings_depend_on_the_map_and_seed_only(monkeypatch):
    """Leaving maps dense or changing other maps' ranks changes no other map's start (one stream per map)."""
    base = tiny()
    calib = Calibration(base, batches())
    names = names_of(base)
    uniform = compressor.allocate(base, calib, 0.5, compressor.AllocationConfig())
    other = {n: (None if i % 3 == 0 else max(1, (k or 2) - i % 2)) for i, (n, k) in enumerate(uniform.items())}
    a = _starts(monkeypatch, tiny(), calib, uniform)
    b = _starts(monkeypatch, tiny(), calib, other)
    shared = [n for n in names if other[n] is not None]
    assert len(shared) >= 8 and len(a) == len(names)
    for n in shared:
        assert torch.equal(a[n][0], b[n][0]) and torch.equal(a[n][1], b[n][1]), n
    # the draw is the map's own: other maps and other seeds start elsewhere
    assert not torch.equal(a[names[0]][1], a[names[7]][1])
    w = base.get_submodule(names[0]).weight
    again = initial_scalings(w, generator=keys.map_generator(names[0], 3))
    assert torch.equal(again[1], a[names[0]][1])
    assert not torch.equal(initial_scalings(w, generator=keys.map_generator(names[0], 4))[1], again[1])
    assert keys.map_seed(names[0], 3) == keys.map_seed(names[0], 3) != keys.map_seed(names[1], 3)


# ---------------------------------------------------------------- the scalings store
def _compress(store, sigma=FAST, ranks=None, seed=0):
    model = tiny()
    calib = Calibration(model, batches())  # a fresh calibration: as another process would have
    records, _ = compressor.compress_model(model, calib, SIGMA, 0.5, sigma_cfg=sigma, ranks=ranks, seed=seed,
                                           store=store)
    return model, records


def _counting(monkeypatch, module=compressor, name="optimise"):
    """Count the calls of `module.name` (the real function still runs): what a store saves."""
    calls = {name: 0}
    real = getattr(module, name)

    def counted(*a, **kw):
        calls[name] += 1
        return real(*a, **kw)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_stored_map_is_read_back_instead_of_optimised(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    first_model, first = _compress(Store(tmp_path))
    n_maps = len(first)
    assert calls["optimise"] == n_maps and all(r.info["cache"] == "miss" for r in first)
    files = list((tmp_path / "scalings").rglob("*.safetensors"))
    assert len(files) == n_maps and sum(f.stat().st_size for f in files) < 64 * 1024
    store = Store(tmp_path)
    model, again = _compress(store)
    assert calls["optimise"] == n_maps and store.hits == n_maps and store.misses == 0  # no map optimised again
    assert [r.loss for r in again] == [r.loss for r in first] and all(r.info["cache"] == "hit" for r in again)
    assert [r.info["steps"] for r in again] == [r.info["steps"] for r in first]
    for (name, p), q in zip(model.named_parameters(), first_model.parameters()):
        assert torch.equal(p, q), name
    # another allocation: only the maps whose rank changed are optimised; other settings or seeds: all of them
    ranks = {r.name: r.rank for r in first}
    changed = {n: (k - 1 if i % 2 else k) for i, (n, k) in enumerate(ranks.items())}
    _compress(Store(tmp_path), ranks=changed)
    assert calls["optimise"] == n_maps + sum(changed[n] != ranks[n] for n in ranks)
    before = calls["optimise"]
    _compress(Store(tmp_path), sigma=FAST.model_copy(update={"lr": 1e-2}))
    _compress(Store(tmp_path), seed=1)
    assert calls["optimise"] == before + 2 * n_maps


def test_a_fixed_steps_run_also_stores_what_the_plateau_rule_returns(tmp_path, monkeypatch):
    """The plateau rule cuts the same trajectory: after a `stop: fixed` cell, a `stop: plateau` cell optimises
    nothing and gets exactly the factors a plateau run of its own gives."""
    sigma = SigmaScaleConfig(lr=5e-2, max_steps=80, patience=8, tol=1e-2)
    calls = _counting(monkeypatch)
    _, fixed = _compress(Store(tmp_path), sigma=sigma.model_copy(update={"stop": "fixed"}))
    n_maps = len(fixed)
    fired = sum(r.info["plateau_step"] is not None for r in fixed)
    assert n_maps // 2 <= fired < n_maps  # the rule fired on most maps, and one map ran to the cap
    store = Store(tmp_path)
    model, reused = _compress(store, sigma=sigma)
    assert calls["optimise"] == n_maps and store.hits == n_maps
    own_model, own = _compress(None, sigma=sigma)
    assert calls["optimise"] == 2 * n_maps
    assert [r.loss for r in reused] == [r.loss for r in own]
    for key in ("steps", "stop", "objective_best", "skipped"):
        assert [r.info[key] for r in reused] == [r.info[key] for r in own], key
    for p, q in zip(model.parameters(), own_model.parameters()):
        assert torch.equal(p, q)


def test_a_stored_file_under_another_key_is_a_miss(tmp_path):
    store = Store(tmp_path)
    ctx = {"model": "a", "settings": {"lr": 1.0}}
    path = store.put_scalings(ctx, "m", 3, torch.ones(4), torch.zeros(5), {"stop": "plateau", "steps": 7})
    d_r, d_c, info = store.get_scalings(ctx, "m", 3)
    assert torch.equal(d_r, torch.ones(4)) and info == {"stop": "plateau", "steps": 7}
    other = {"model": "b", "settings": {"lr": 1.0}}
    moved = store.scalings_path(other, "m", 3)
    moved.parent.mkdir(parents=True)
    path.rename(moved)  # the right file name, the wrong key inside
    assert store.get_scalings(other, "m", 3) is None and store.misses == 1


# ---------------------------------------------------------------- the sensitivity table
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_probe_from_a_blocks_recorded_input_equals_a_full_forward(arch):
    """Starting the probe at the truncated map's block gives the NLL a whole forward pass gives."""
    from scalelab.compress.rank import rank_for
    from scalelab.model.hf import mean_nll

    model, data = tiny(arch), batches()
    ratios = [0.25, 0.5, 1.0]
    base, table = sensitivity.probe(model, data, ratios)
    assert base == pytest.approx(mean_nll(model, data), rel=1e-6)
    with torch.no_grad():
        for name in [names_of(model)[i] for i in (0, 6, 9, 13)]:  # block 0's first, block 0's last, block 1's
            layer = model.get_submodule(name)
            dense = layer.weight.detach().clone()
            u, s, vh = torch.linalg.svd(dense.double(), full_matrices=False)
            k = rank_for(*dense.shape, 0.25)
            layer.weight.copy_(((u[:, :k] * s[:k]) @ vh[:k]).float())
            assert table[name][0.25] == pytest.approx(mean_nll(model, data), rel=1e-6), name
            layer.weight.copy_(dense)
            assert table[name][1.0] == base and table[name][0.25] != base


def test_the_sensitivity_table_is_read_from_the_store_by_a_later_process(tmp_path, monkeypatch):
    calls = _counting(monkeypatch, sensitivity, "probe")
    ratios = [0.25, 0.5, 0.75, 1.0]
    model = tiny()
    first = Calibration(model, batches()).sensitivity(model, ratios, 4, Store(tmp_path))
    [path] = list((tmp_path / "sensitivity").glob("*.json"))
    raw = json.loads(path.read_text())
    assert raw["key"]["ratios"] == ratios and raw["key"]["model"] == keys.model_fingerprint(model)
    later = Calibration(tiny(), batches())  # another process: same model and windows
    again = later.sensitivity(tiny(), ratios, 4, Store(tmp_path))
    assert calls["probe"] == 1 and again == first and later.sensitivity_info[(tuple(ratios), 4)]["stored"]
    # other candidates, other windows or another model: probed again
    Calibration(model, batches()).sensitivity(model, [0.5, 1.0], 4, Store(tmp_path))
    Calibration(model, batches(seed=1)).sensitivity(model, ratios, 4, Store(tmp_path))
    Calibration(tiny(seed=1), batches()).sensitivity(tiny(seed=1), ratios, 4, Store(tmp_path))
    assert calls["probe"] == 4 and len(list((tmp_path / "sensitivity").glob("*.json"))) == 4


# ---------------------------------------------------------------- one allocation for every method
def _hf_folder(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<eos>", "<unk>"] + [f"w{i}" for i in range(V - 2)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "model"
    tiny().save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)
    return folder


def test_sigmascale_sens_and_svd_llm_sens_get_the_same_ranks_from_one_table(tmp_path, monkeypatch):
    from scalelab.compress import cells
    from scalelab.data.streams import Streams
    from scalelab.compress.rank import rank_for
    from scalelab.config import CompressConfig

    folder, rng = _hf_folder(tmp_path), np.random.default_rng(0)
    train, val = rng.integers(0, V, 4000).astype(np.uint16), rng.integers(0, V, 600).astype(np.uint16)
    monkeypatch.setattr(cells, "streams", lambda cfg, tok, prepared=None: Streams(train, val, V))
    calls = {"probe": 0}
    real = sensitivity.probe
    monkeypatch.setattr(sensitivity, "probe", lambda *a, **kw: calls.__setitem__("probe", calls["probe"] + 1)
                        or real(*a, **kw))
    cfg = CompressConfig.model_validate({
        "source": {"path": str(folder)}, "source_dep": str(folder),
        "methods": {"svd_llm_sens": {"kind": "svd_llm", "allocation": "sensitivity"},
                    "sigmascale_sens": {"kind": "sigmascale", "allocation": "sensitivity"}},
        "sigmascale": FAST.model_dump(), "calibration": {"samples": 8, "seq_len": 16, "batch_size": 4},
        "allocation": {"kind": "uniform", "samples": 4}, "eval": {"seq_len": 16, "val_tokens": 256, "batch_size": 8},
        "grid": {"methods": ["svd_llm_sens", "sigmascale_sens"], "keep": [0.5]}, "store": str(tmp_path / "store")})
    assert cfg.allocation.ratios == [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # the paper's, by default
    (a, rec_a), (b, rec_b) = cells.run_seed(cfg, 0, tmp_path / "out")
    ranks = [r.rank for r in rec_a]
    assert calls["probe"] == 1 and ranks == [r.rank for r in rec_b] and a["ranks_digest"] == b["ranks_digest"]
    assert ranks != [rank_for(r.m, r.n, 0.5) for r in rec_a]  # the allocation acted: not the uniform ranks
    assert a["linear_weights_kept"] <= 0.5 and a["sensitivity_stored"] is False
    # a later process (another slice of the study) evaluating on other windows reads the table and the converged
    # maps: the same ranks again, no probe, no map optimised
    other = cfg.model_copy(update={"grid": cfg.grid.model_copy(update={"methods": ["sigmascale_sens"]}),
                                   "eval": cfg.eval.model_copy(update={"val_tokens": 128})})
    [(c, rec_c)] = cells.run_seed(other, 0, tmp_path / "out2")
    assert calls["probe"] == 1 and [r.rank for r in rec_c] == ranks and c["sensitivity_stored"] is True
    assert c["sigmascale_reused"] == c["sigmascale_maps"] and c["val_nll"] != b["val_nll"]
    assert "part_stored" not in c
    # and one that repeats a finished (method, ρ) part reads the part itself: nothing factorized or evaluated again
    compressed = {"n": 0}
    real_compress = cells.compress_model
    monkeypatch.setattr(cells, "compress_model", lambda *a, **kw: compressed.__setitem__("n", compressed["n"] + 1)
                        or real_compress(*a, **kw))
    [(d, rec_d)] = cells.run_seed(other, 0, tmp_path / "out3")
    assert compressed["n"] == 0 and d["part_stored"] is True
    assert {k: v for k, v in d.items() if k != "part_stored"} == c and [r.to_json() for r in rec_d] == [
        r.to_json() for r in rec_c]
    # what the store holds, as the study's README lists it
    from scalelab.compress.store import progress

    held = progress(tmp_path / "store").splitlines()
    assert held[0].startswith("- sensitivity tables: 1 (") and held[1] == (
        "- finished parts: sigmascale_sens at ρ 0.5 (seed 0 ×2); svd_llm_sens at ρ 0.5 (seed 0)")  # two windows
    assert held[2] == f"- converged SigmaScale maps: seed 0, stop {FAST.stop}: {c['sigmascale_maps']}", held


# ---------------------------------------------------------------- stopping
def test_fixed_steps_keep_the_last_iterate_and_record_where_the_plateau_rule_fired():
    import importlib

    optimise = importlib.import_module("scalelab.compress.sigmascale").optimise  # the module's (mutants patch it)
    w, gram = _layer()
    m, n = w.shape
    start = initial_scalings(w, generator=keys.map_generator("m", 0))
    settings = dict(lr=5e-2, max_steps=120, patience=10, tol=1e-3)
    fixed = optimise(w, 6, gram, *start, stop="fixed", **settings)
    assert fixed.info["steps"] == 120 and fixed.info["stop"] == "fixed" and fixed.info["kept"] == "last"
    # the kept scalings are those after the 120th AdamW step, replayed here by hand
    problem = problem_of(w, gram)
    d_r, d_c = (torch.nn.Parameter(t.clone()) for t in start)
    opt = torch.optim.AdamW([d_r, d_c], lr=5e-2, weight_decay=0.0)
    for _ in range(120):
        obj = scaled_loss(d_r, d_c, problem, 6) / (m * n) + 1e-6 * (d_r.square().sum() + d_c.square().sum())
        opt.zero_grad()
        obj.backward()
        opt.step()
    assert torch.allclose(fixed.d_r, d_r.detach(), atol=1e-6) and torch.allclose(fixed.d_c, d_c.detach(), atol=1e-6)
    assert fixed.info["objective_kept"] > fixed.info["objective_best"]  # this lr oscillates: last ≠ best
    # the plateau rule on the same trajectory: stops where the fixed run recorded it, keeping the best up to there
    plateau = optimise(w, 6, gram, *start, stop="plateau", **settings)
    assert plateau.info["kept"] == "best" and plateau.info["steps"] == fixed.info["plateau_step"] < 120
    assert torch.equal(plateau.d_r, fixed.alternatives["plateau"][0])
    assert plateau.info["objective_kept"] == plateau.info["objective_best"]
    with pytest.raises(ValueError, match="stop 'late'"):
        optimise(w, 6, gram, *start, stop="late")


def test_the_stopping_diagnostic_compares_both_rules_on_one_run():
    from scalelab.compress import diagnostics
    from scalelab.compress.calibrate import Stats

    w, gram = _layer()
    stats = Stats(gram, torch.rand(w.shape[1], dtype=torch.float64) * 60, 60)
    cfg = SigmaScaleConfig(lr=5e-2, max_steps=120, patience=10)
    out = diagnostics.stopping("m", w, 6, stats, 0, cfg)
    plateau = compressor.sigmascale_map("m", w, 6, stats, SIGMA, cfg, 0)
    fixed = compressor.sigmascale_map("m", w, 6, stats, SIGMA, cfg.model_copy(update={"stop": "fixed"}), 0)
    assert out["loss_plateau"] == pytest.approx(plateau.info["layer_loss"], rel=1e-9)
    assert out["loss_fixed"] == pytest.approx(fixed.info["layer_loss"], rel=1e-9)
    assert out["fixed_over_plateau"] == pytest.approx(out["loss_fixed"] / out["loss_plateau"])
    assert min(out["loss_fixed"], out["loss_plateau"]) >= out["loss_svd_llm"] * (1 - 1e-9)
    opt = diagnostics.optimiser("m", w, 6, stats, 0, cfg, max_evals=60, paper=out)
    from scalelab.compress import methods

    assert opt["runs"]["asvd_step0"]["loss"] == pytest.approx(
        methods.layer_loss(w, *(lambda f: (f.left, f.right))(methods.asvd(w, 6, stats.abs_mean, 0.5)), gram), rel=1e-6)
    assert opt["floor_rel_svd_llm"] >= 1 - 1e-9 and 0 <= opt["optimiser_share"] <= 1
    assert opt["floor_rel_svd_llm"] <= opt["paper_rel_svd_llm"]


# ---------------------------------------------------------------- the candidate ratios
@pytest.mark.parametrize("ratios,why", [([0.5, 0.5, 1.0], "increase strictly"), ([0.2, 1.5, 1.0], "in (0, 1]"),
                                        ([0.2, 0.9], "end with 1.0"), ([1.0], "below 1.0"),
                                        ([0.0, 1.0], "in (0, 1]")])
def test_bad_candidate_ratios_are_one_line_errors_naming_the_key(ratios, why):
    from scalelab.config import parse_params
    from conftest import ROOT

    raw = yamlio.safe_load((ROOT / "params.yaml").read_text())
    raw["compress"]["allocation"]["ratios"] = ratios
    with pytest.raises(ParamsError) as err:
        parse_params(raw, "params.yaml")
    msg = str(err.value)
    assert "compress.allocation.ratios" in msg and why in msg and "\n" not in msg


# ---------------------------------------------------------------- mutation checks (tests/mutants.py)
@mutant("sigmascale-shared-init-stream")  # every map draws from one generator in allocation order
def _(monkeypatch):
    shared = torch.Generator().manual_seed(0)
    monkeypatch.setattr(keys, "map_generator", lambda name, seed: shared)


@mutant("fixed-keeps-best")  # the fixed-steps rule returns the best iterate instead of the last
def _(monkeypatch):
    import importlib

    mod = importlib.import_module("scalelab.compress.sigmascale")
    real = mod.optimise

    def best(*a, **kw):
        run = real(*a, **kw)
        run.d_r, run.d_c = run.alternatives["best"]
        return run

    monkeypatch.setattr(mod, "optimise", best)


@mutant("probe-skips-the-probed-block")  # the probe resumes one block late: the truncated map of block b unseen
def _(monkeypatch):
    real = sensitivity._Resumable.nll
    monkeypatch.setattr(sensitivity._Resumable, "nll", lambda self, start: real(
        self, None if start is None else min(start + 1, len(self.blocks) - 1)))


test_mutants_are_caught = mutation_checks([
    ("sigmascale-shared-init-stream",
     "tests/test_compress_alloc.py::test_a_maps_initial_scalings_depend_on_the_map_and_seed_only"),
    ("fixed-keeps-best",
     "tests/test_compress_alloc.py::test_fixed_steps_keep_the_last_iterate_and_record_where_the_plateau_rule_fired"),
    ("probe-skips-the-probed-block",
     "tests/test_compress_alloc.py::test_the_probe_from_a_blocks_recorded_input_equals_a_full_forward[llama]"),
])


# ---------------------------------------------------------------- the other rule's answer, from the store alone
def test_the_other_rules_cell_is_evaluated_from_the_store_without_optimising(tmp_path, monkeypatch):
    """A `stop: fixed` cell keeps each map's plateau answer; steps.run evaluates the cell at those answers on a
    frozen store: no map optimised, the part keyed as the cell's own but for `sigmascale.stop`, and its perplexity
    exactly that of a plateau cell optimised from scratch. The ledger then reads both answers of the cell; a map the
    store lacks stops the run instead of being optimised."""
    import polars as pl

    from scalelab.compress import cells, ledger, steps
    from scalelab.compress.store import MissingScalings, parts
    from scalelab.config import CompressConfig
    from scalelab.data.streams import Streams

    folder, rng = _hf_folder(tmp_path), np.random.default_rng(0)
    train, val = rng.integers(0, V, 4000).astype(np.uint16), rng.integers(0, V, 600).astype(np.uint16)
    monkeypatch.setattr(cells, "streams", lambda cfg, tok, prepared=None: Streams(train, val, V))
    sigma = SigmaScaleConfig(lr=5e-2, max_steps=80, patience=8, tol=1e-2, stop="fixed")
    cfg = CompressConfig.model_validate({
        "source": {"path": str(folder)}, "source_dep": str(folder),
        "methods": {"svd_llm": {"kind": "svd_llm"}, "sigmascale": {"kind": "sigmascale"}},
        "sigmascale": sigma.model_dump(), "calibration": {"samples": 8, "seq_len": 16, "batch_size": 4},
        "eval": {"seq_len": 16, "val_tokens": 256, "batch_size": 8},
        "grid": {"methods": ["svd_llm", "sigmascale"], "keep": [0.5]}})
    store = tmp_path / "store"
    (_, _), (fixed, fixed_maps) = cells.run_seed(cfg, 0, tmp_path / "out", store)
    assert 0 < fixed["sigmascale_plateau_fired"] < fixed["sigmascale_maps"]  # the rule fired on some maps, not all

    calls = _counting(monkeypatch)
    [other] = steps.run(cfg, 0, str(store))
    assert calls["optimise"] == 0 and other["sigmascale_reused"] == other["sigmascale_maps"]
    assert other["sigmascale_stop_rule"] == "plateau" and other["val_nll"] != fixed["val_nll"]
    held = [(k, m) for k, m, _ in parts(store) if m["method"] == "sigmascale"]
    own = next(k for k, m in held if m["val_nll"] == fixed["val_nll"])
    twin = next(k for k, m in held if m["val_nll"] == other["val_nll"])
    assert twin == {**own, "sigmascale": {**own["sigmascale"], "stop": "plateau"}}
    # the same perplexity as a plateau cell that optimises its own maps (no store)
    plateau_cfg = cfg.model_copy(update={"sigmascale": sigma.model_copy(update={"stop": "plateau"}),
                                         "grid": cfg.grid.model_copy(update={"methods": ["sigmascale"]})})
    [(fresh, _)] = cells.run_seed(plateau_cfg, 0, tmp_path / "fresh")
    assert calls["optimise"] == fixed["sigmascale_maps"] and fresh["val_nll"] == other["val_nll"]
    # the ledger's premise finds both answers of the cell by its key
    table = pl.DataFrame([{**fixed, "method": "sigmascale"}])
    answers = ledger.rule_answers(store, table, {("sigmascale", 0.5, 0): [r.to_json() for r in fixed_maps]}, cfg)
    got = answers[("sigmascale", 0.5, 0)]
    assert (got["own"], got["fixed"]["val_nll"], got["plateau"]["val_nll"]) == ("fixed", fixed["val_nll"],
                                                                               other["val_nll"])
    # seed 1 was never optimised: the frozen store refuses rather than optimising it
    before = calls["optimise"]
    with pytest.raises(MissingScalings, match="not in the store"):
        steps.run(cfg, 1, str(store))
    assert calls["optimise"] == before


# ---------------------------------------------------------------- ranks by SVD-LLM's whitened truncation loss
def test_the_whitened_allocation_spends_the_budget_where_svd_llm_loses_most_output_energy():
    """Two maps of one shape: one whose whitened spectrum decays fast (little lost by truncating it), one flat. The
    threshold on the share of output energy discarded gives the flat map the higher rank, within the budget; with
    equal spectra it gives both the same rank."""
    from scalelab.compress import rank

    shapes = {"fast": (40, 40), "flat": (40, 40)}
    spectra = {"fast": [0.5 ** i for i in range(40)], "flat": [1.0] * 40}
    ratios = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    table = rank.whitened_table(spectra, shapes, ratios)
    assert table["flat"][0.5] == pytest.approx(1 - rank.rank_for(40, 40, 0.5) / 40) and table["fast"][1.0] == 0.0
    assert all(table["fast"][r] < table["flat"][r] for r in ratios[:-1])
    ranks = rank.sensitivity(shapes, table, 0.5)
    assert ranks["flat"] is None or ranks["flat"] > (ranks["fast"] or 0)
    assert sum(rank.weights(m, n, ranks[k]) for k, (m, n) in shapes.items()) <= 0.5 * 2 * 40 * 40
    same = rank.sensitivity(shapes, rank.whitened_table({"fast": spectra["flat"], "flat": spectra["flat"]}, shapes,
                                                        ratios), 0.5)
    assert same["fast"] == same["flat"]


def test_a_part_stored_before_a_setting_existed_is_found_at_that_settings_default(tmp_path):
    """A committed store outlives its schema: a part whose key predates `eval.calib_nll` and a method's `blocks` is
    the part today's key names at those settings' defaults (what the code then did), under another file name; at a
    setting other than the default it is a miss."""
    from scalelab.compress import keys
    from scalelab.compress.store import Store
    from scalelab.config import CompressConfig

    cfg = CompressConfig.model_validate({"source": {"path": "m"}, "source_dep": "m",
                                         "methods": {"svd_llm": {"kind": "svd_llm"}},
                                         "eval": {"seq_len": 16, "val_tokens": 64, "batch_size": 4},
                                         "grid": {"methods": ["svd_llm"], "keep": [0.5]}})
    from scalelab.compress.cells import part_key

    today = part_key(cfg, "svd_llm", 0.5, 0, {"model": "a", "tokens": "b"}, "c")
    old = {**today, "method": {k: v for k, v in today["method"].items() if k != "blocks"},
           "eval": {k: v for k, v in today["eval"].items() if k != "calib_nll"}}
    assert old != today and keys.digest(old) != keys.digest(today)
    Store(tmp_path).put_part(old, {"val_nll": 1.5}, [])
    store = Store(tmp_path)
    assert store.get_part(today) == ({"val_nll": 1.5}, []) and store.hits == 1
    off = part_key(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"calib_nll": False})}), "svd_llm", 0.5,
                   0, {"model": "a", "tokens": "b"}, "c")
    assert store.get_part(off) is None and store.misses == 1


def test_seeding_a_store_copies_the_tables_and_the_parts_of_the_methods_the_profile_names(tmp_path):
    from scalelab.compress.refine_cost import seed_store
    from scalelab.compress.store import Store
    from scalelab.config import CompressConfig

    cfg = CompressConfig.model_validate({"source": {"path": "m"}, "source_dep": "m",
                                         "methods": {"svd_llm": {"kind": "svd_llm"}},
                                         "grid": {"methods": ["svd_llm"], "keep": [0.5]}})
    source = Store(tmp_path / "from")
    source.put_sensitivity({"kind": "sensitivity", "x": 1}, {"a": {0.5: 1.0}}, seconds=1.0, tokens=8)
    for kind in ("svd_llm", "asvd"):  # written before a method had `blocks`: its settings read at today's schema
        source.put_part({"kind": "part", "method": {"kind": kind, "alpha": 0.5, "init": "random", "allocation": None,
                                                    "refine": "none"}}, {"method": kind}, [])
    assert seed_store(tmp_path / "from", tmp_path / "into", cfg) == {"sensitivity": 1, "parts": 1}
    [copied] = (tmp_path / "into" / "parts").glob("*.json")
    assert json.loads(copied.read_text())["metrics"] == {"method": "svd_llm"}

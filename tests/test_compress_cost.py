"""What makes a compress cell cheap gives the same results: plain SVD, ASVD and FWSVD factor in float32 with the
layer loss of float64's to within float32's rounding, and SVD-LLM's whitening is computed once per input and seed."""

import pytest
import torch
from mutants import mutant, mutation_checks

from scalelab.compress import calibrate, methods
from scalelab.compress.calibrate import Stats

M, N, K, T = 96, 160, 30, 1024


def _map(seed: int = 0):
    """A map with the inputs of a trained model's: channel scales spread over orders of magnitude, three outlier
    channels a hundred times the rest, correlated (cond C ≈ 7e10); and Fisher row weights spread as widely."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.randn(N, generator=g, dtype=torch.float64).mul(1.5).exp()
    scales[:3] *= 100
    mix = torch.randn(N, N, generator=g, dtype=torch.float64) / N**0.5 + torch.eye(N, dtype=torch.float64)
    x = scales[:, None] * (mix @ torch.randn(N, T, generator=g, dtype=torch.float64))
    w = torch.randn(M, N, generator=g) / N**0.5
    fisher = torch.rand(M, generator=g, dtype=torch.float64).mul(4).exp()
    return w, Stats(x @ x.T, x.abs().sum(1), T), fisher


def _truncate64(matrix, k):
    u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    return u[:, :k] * s[:k], vh[:k]


def _float64(kind: str, w, stats, fisher, k):
    """The method's own definition evaluated in float64: the reference."""
    w = w.double()
    if kind == "svd":
        return _truncate64(w, k)
    if kind == "asvd":
        s = stats.abs_mean.clamp_min(methods.EPS) ** 0.5
        left, right = _truncate64(w * s, k)
        return left, right / s
    s = fisher.clamp_min(methods.EPS).sqrt()[:, None]
    left, right = _truncate64(s * w, k)
    return left / s, right


@pytest.mark.parametrize("kind", ["svd", "asvd", "fwsvd"])
def test_float32_factors_lose_what_float64_factors_lose(kind):
    w, stats, fisher = _map()
    for k in (K, 80):  # the layer loss at ρ ≈ 0.5 and at a high kept fraction, where the residual is small
        f = {"svd": lambda: methods.plain_svd(w, k), "asvd": lambda: methods.asvd(w, k, stats.abs_mean, 0.5),
             "fwsvd": lambda: methods.fwsvd(w, k, fisher)}[kind]()
        assert f.left.dtype == torch.float32 and f.right.dtype == torch.float32
        ref = methods.layer_loss(w, *_float64(kind, w, stats, fisher, k), stats.gram)
        assert methods.layer_loss(w, f.left, f.right, stats.gram) == pytest.approx(ref, rel=1e-5)


def test_svd_llm_stays_float64_and_reads_the_whitening_computed_once(monkeypatch):
    """Maps that share their inputs (q/k/v) and every cell after the first read one whitening; the factors are the
    ones a fresh whitening gives, to the last bit."""
    w, stats, _ = _map()
    calls = []
    real = calibrate.whitening
    monkeypatch.setattr(calibrate, "whitening", lambda gram: calls.append(1) or real(gram))
    first = methods.svd_llm(w, K, stats.gram, root=stats.whitening())
    again = methods.svd_llm(w, K + 5, stats.gram, root=stats.whitening())
    assert len(calls) == 1
    assert first.left.dtype == torch.float64
    fresh = methods.svd_llm(w, K, stats.gram)
    assert torch.equal(first.left, fresh.left) and torch.equal(first.right, fresh.right)
    assert again.rank == K + 5


def test_a_calibration_whitens_each_input_once(monkeypatch):
    """Calibration computes SVD-LLM's optimum for every map: 7 maps per block read 4 distinct inputs (q/k/v share
    one, gate/up one), and the SVD-LLM cells after it whiten nothing again."""
    from test_compress import batches, copy_of, tiny

    from scalelab.compress import compress_model
    from scalelab.compress.shared import Calibration
    from scalelab.config import MethodConfig

    calls = []
    real = calibrate.whitening
    monkeypatch.setattr(calibrate, "whitening", lambda gram: calls.append(1) or real(gram))
    model = tiny("llama")
    calib = Calibration(model, batches())
    blocks = len(model.model.layers)
    assert len(calls) == 4 * blocks
    for keep in (0.5, 0.75):
        compress_model(copy_of(model), calib, MethodConfig(kind="svd_llm"), keep)
    assert len(calls) == 4 * blocks


@mutant("whitening-per-call")  # the whitening recomputed at every use, as before it was kept with the statistics
def _(monkeypatch):
    monkeypatch.setattr(Stats, "whitening", lambda self: calibrate.whitening(self.gram))


@mutant("closed-forms-in-float16")  # too coarse a precision for the factors: the float32 test must catch it
def _(monkeypatch):
    real = methods.truncate

    def coarse(matrix, k):
        left, right, s = real(matrix.half().float(), k)
        return left, right, s

    monkeypatch.setattr(methods, "truncate", coarse)


T_ = "tests/test_compress_cost.py::"
test_a_broken_shortcut_is_caught = mutation_checks([
    ("whitening-per-call", f"{T_}test_a_calibration_whitens_each_input_once"),
    ("closed-forms-in-float16", f"{T_}test_float32_factors_lose_what_float64_factors_lose"),
])

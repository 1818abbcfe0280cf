"""scalelab.compress.heldout: each closed-form method's layer loss on inputs calibration never saw, and ASVD's float32
factors against float64's, on a map whose inputs have a trained model's spread of channel scales."""

import numpy as np
import pytest
import torch

from scalelab.compress import methods
from scalelab.compress.calibrate import Stats
from scalelab.compress.heldout import asvd64, check_map, held_out_batches

M, N, K = 48, 96, 24


def _inputs(g: torch.Generator, scales: torch.Tensor, mix: torch.Tensor, tokens: int) -> Stats:
    x = scales[:, None] * (mix @ torch.randn(N, tokens, generator=g, dtype=torch.float64))
    return Stats(x @ x.T, x.abs().sum(1), tokens)


def _map(seed: int = 0, calib_tokens: int = 4 * N, held_tokens: int = 64 * N):
    """One map; calibration and held-out inputs drawn from one distribution (channel scales over orders of magnitude,
    three outlier channels, correlated), the calibration a few tokens per input, as a study's is."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.randn(N, generator=g, dtype=torch.float64).mul(1.5).exp()
    scales[:3] *= 100
    mix = torch.randn(N, N, generator=g, dtype=torch.float64) / N**0.5 + torch.eye(N, dtype=torch.float64)
    w = torch.randn(M, N, generator=g) / N**0.5
    fisher = torch.rand(M, generator=g, dtype=torch.float64).mul(4).exp()
    return w, _inputs(g, scales, mix, calib_tokens), _inputs(g, scales, mix, held_tokens), fisher


@pytest.mark.parametrize("seed", [0, 1])
def test_each_method_loses_on_held_out_inputs_what_it_loses_on_calibration(seed):
    w, calib, held, fisher = _map(seed)
    out = check_map(w, K, calib, held, fisher)
    # SVD-LLM is the exact optimum of the calibration loss, and fits those inputs: held out it loses more
    assert out["svd_llm"]["calib_rel_svd_llm"] == pytest.approx(1.0)
    assert out["svd_llm"]["held_over_calib"] > 1.05
    for name in ("svd", "asvd", "asvd64", "fwsvd"):
        assert out[name]["calib_rel_svd_llm"] >= 1 - 1e-9, name
        # a projection fitted to the weights (and a diagonal of the inputs) barely depends on which windows it saw
        assert 1 / 1.5 < out[name]["held_over_calib"] < 1.5, (name, out[name])


def test_asvd_in_float32_matches_its_float64_definition_on_both_grams():
    w, calib, held, fisher = _map()
    diff = check_map(w, K, calib, held, fisher)["asvd_float32_vs_float64"]
    assert diff["calib_loss_rel_diff"] < 1e-5 and diff["held_loss_rel_diff"] < 1e-5
    assert diff["weight_rel_diff"] < 1e-5
    # the tolerance can see a precision loss: ASVD of the weights rounded to float16 misses float64's loss by more
    f16 = methods.asvd(w.half().float(), K, calib.abs_mean)
    gram = calib.gram / calib.tokens
    ref = methods.layer_loss(w, *(lambda f: (f.left, f.right))(asvd64(w, K, calib.abs_mean)), gram)
    assert abs(methods.layer_loss(w, f16.left, f16.right, gram) - ref) / ref > 1e-5

def test_the_held_out_windows_are_the_validation_splits_first():
    val = np.arange(1000, dtype=np.uint16)
    batches = held_out_batches(val, samples=6, seq_len=10, batch_size=4)
    assert [x.shape[0] for x, _ in batches] == [4, 2]
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert x.flatten().tolist() == list(range(60)) and y.flatten().tolist() == list(range(1, 61))
    with pytest.raises(ValueError, match="fewer than"):
        held_out_batches(val[:50], samples=6, seq_len=10, batch_size=4)

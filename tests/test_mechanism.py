"""Tests of the mechanisms docs/scale-vectors.md speaks of, not only of the plumbing: weight decay acts on the scale
vectors its policy names and on no others, during real training; Muon's update has the RMS that Moonshot's
`match_rms_adamw` promises; the sharpness power iteration works in the folded parameterization, where a variant and its
fold agree."""

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from scalelab.config import ModelConfig, OptimizerConfig, ScaleConfig, SharpnessConfig
from scalelab.model import Transformer
from scalelab.model.export import fold_scales, plain_config
from scalelab.model.norm import INPUT_SCALE, OUTPUT_SCALE, Scale
from scalelab.optim import build_optimizers
from scalelab.train.sharpness import Sharpness, hessian_eigen

VOCAB = 64


def micro(scale: ScaleConfig, **kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=VOCAB, n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=64,
                                 max_seq_len=32, qk_norm=True, scale=scale), **kw})


def markov_batch(step: int, batch: int = 16, seq: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Token windows of a sparse Markov chain (two successors per token): learnable structure, a pure function of
    the step, so two runs see the same batches."""
    succ = torch.randint(0, VOCAB, (VOCAB, 2), generator=torch.Generator().manual_seed(123))
    gen = torch.Generator().manual_seed(step)
    toks = torch.empty(batch, seq + 1, dtype=torch.long)
    toks[:, 0] = torch.randint(0, VOCAB, (batch,), generator=gen)
    picks = torch.randint(0, 2, (batch, seq), generator=gen)
    for t in range(seq):
        toks[:, t + 1] = succ[toks[:, t], picks[:, t]]
    return toks[:, :-1], toks[:, 1:]


def gamma_norms(model: Transformer) -> dict[str, float]:
    """‖γ‖₂ over all effective scale vectors of each kind."""
    sq = {INPUT_SCALE: 0.0, OUTPUT_SCALE: 0.0}
    for module in model.modules():
        if isinstance(module, Scale):
            sq[module.kind] += float((module().detach() ** 2).sum())
    return {k: math.sqrt(v) for k, v in sq.items()}


def train(scale: ScaleConfig, steps: int = 60) -> tuple[Transformer, float]:
    torch.manual_seed(0)
    model = Transformer(micro(scale))
    opts = build_optimizers(model, OptimizerConfig(lr=1e-2, weight_decay=0.5), scale)
    for step in range(steps):
        x, y = markov_batch(step)
        loss = model(x, y).loss
        loss.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return model, loss.item()


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[Transformer, float]]:
    return {name: train(ScaleConfig(**flags)) for name, flags in
            (("standard", {}), ("wd_in", {"wd_input_scales": True}), ("wd_out", {"wd_output_scales": True}))}


def test_wd_in_shrinks_input_gammas_and_leaves_output_gammas(runs):
    """Same init and batches: under wd_in the input-norm γ end clearly smaller than under standard, while the
    output-norm (QK-norm) γ, which wd_in does not decay, end where standard's do. wd_out is the mirror image."""
    std, wd_in, wd_out = (gamma_norms(runs[k][0]) for k in ("standard", "wd_in", "wd_out"))
    assert runs["standard"][1] < math.log(VOCAB) - 1.5  # the runs learned (ln 64 = 4.16 at init)
    assert wd_in[INPUT_SCALE] / std[INPUT_SCALE] < 0.9
    assert wd_in[OUTPUT_SCALE] / std[OUTPUT_SCALE] == pytest.approx(1.0, abs=0.03)
    assert wd_out[OUTPUT_SCALE] / std[OUTPUT_SCALE] < 0.9
    assert wd_out[INPUT_SCALE] / std[INPUT_SCALE] == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("d_model,d_ff", [(64, 256), (128, 128)])
def test_muon_update_has_the_rms_that_match_rms_adamw_promises(d_model, d_ff):
    """Moonshot (arXiv 2502.16982): W ← W − η·0.2·sqrt(max(A, B))·NS5(M). NS5 is close to the polar factor U Vᵀ,
    whose RMS is 1/sqrt(max(A, B)), so the update's RMS is about 0.2·η whatever the shape (AdamW's typical update
    RMS), and it points along −U Vᵀ. Keller's "original" scaling would give 256×64 and 64×256 RMS 0.125η and
    0.0625η."""
    torch.manual_seed(0)
    model = Transformer(micro(ScaleConfig(), d_model=d_model, d_ff=d_ff, n_head=4))
    lr = 0.02
    muon, side = build_optimizers(model, OptimizerConfig(name="muon", lr=lr, weight_decay=0.0), ScaleConfig())
    assert isinstance(muon, torch.optim.Muon)
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    mats = {"gate": model.blocks[0].mlp.gate.weight, "down": model.blocks[0].mlp.down.weight}
    before = {k: w.detach().clone() for k, w in mats.items()}
    grads = {k: w.grad.clone() for k, w in mats.items()}
    muon.step()
    rms = {}
    for k, w in mats.items():
        delta = w.detach() - before[k]
        rms[k] = float(delta.pow(2).mean().sqrt()) / lr
        u, _, vh = torch.linalg.svd(grads[k], full_matrices=False)
        cos = float((delta * -(u @ vh)).sum() / (delta.norm() * (u @ vh).norm()))
        assert cos > 0.95, (k, cos)  # orthogonalized: along the polar factor of the momentum (= the gradient)
        assert 0.15 < rms[k] < 0.25, (k, rms[k], tuple(w.shape))
    assert rms["gate"] == pytest.approx(rms["down"], rel=0.1)  # the same RMS for A×B and B×A


def test_sharpness_is_measured_in_the_folded_parameterization():
    """A magdir/placement model and the plain model its fold gives compute the same function; measured through
    `Sharpness.measure` both give the same λ_max (it folds first), while the Hessian in magdir's own coordinates
    (g, v) is another one. The power iteration converges to its tolerance and says in how many iterations."""
    torch.manual_seed(0)
    unified = Transformer(micro(ScaleConfig(branch=True, placement=True, magdir=True, wd_input_scales=True)))
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in unified.named_parameters():
            if unified.param_kind(name).endswith("_scale"):
                p.mul_(0.5 + torch.rand(p.shape, generator=gen))
    plain = Transformer(plain_config(unified))
    plain.load_state_dict(fold_scales(unified))
    batch = markov_batch(0, batch=16)  # (stages use ≥ 4096 tokens; the fold's equality holds on any batch)
    cfg = SharpnessConfig(tol=1e-2, max_iters=200)
    a, b = Sharpness(cfg, 1).measure(unified, batch), Sharpness(cfg, 1).measure(plain, batch)
    assert a.converged and 2 <= a.iters < 200
    assert a.value == pytest.approx(b.value, rel=1e-3)

    def ce() -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(unified(x).logits.flatten(0, 1), y.flatten())

    with sdpa_kernel(SDPBackend.MATH):  # the kernel with a second derivative
        own = hessian_eigen(ce, list(unified.parameters()), 200, 1e-2)
    assert abs(own.value - a.value) > 0.05 * a.value  # another parameterization, another Hessian

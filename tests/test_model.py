"""Model layer: scale-variant properties (docs/scale-vectors.md), MoE routing, attention, accounting, a micro
training run."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scalelab.config import ModelConfig, MoEConfig, ScaleConfig
from scalelab.model import Projection, RMSNorm, Scale, Transformer, fold_scales, plain_config
from scalelab.model.moe import MoE, load_balance_loss

# the variants of params.yaml (docs/scale-vectors.md)
VARIANTS = {
    "none": ScaleConfig(scales=False),
    "standard": ScaleConfig(),
    "wd_in": ScaleConfig(wd_input_scales=True),
    "wd_out": ScaleConfig(wd_output_scales=True),
    "branch": ScaleConfig(branch=True),
    "placement": ScaleConfig(placement=True),
    "magdir": ScaleConfig(magdir=True),
    "unified": ScaleConfig(branch=True, placement=True, magdir=True, wd_input_scales=True),
}
SCALE_KINDS = {"input_scale", "output_scale"}


def micro(variant: str = "standard", moe: bool = False, **kw) -> ModelConfig:
    base = dict(vocab_size=64, n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=32,
                qk_norm=True, post_norm=True, scale=VARIANTS[variant],
                moe=MoEConfig(n_experts=4, top_k=2, shared_expert=True) if moe else None)
    return ModelConfig(**{**base, **kw})


def build(cfg: ModelConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


@torch.no_grad()
def perturb_scales(model: Transformer, seed: int = 0) -> None:
    """Every scale parameter (γ, s_out, magdir g and v) to a random value in [0.5, 1.5): no longer all ones."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if model.param_kind(name) in SCALE_KINDS:
            p.copy_(0.5 + torch.rand(p.shape, generator=gen))


def tokens(B: int = 2, T: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- norm and scale modules
def test_rms_norm_and_magdir_follow_their_definitions():
    x = torch.randn(3, 5, 16)
    scale = Scale(16, "input_scale", magdir=True)
    with torch.no_grad():
        scale.g.fill_(2.5)
        scale.v.copy_(torch.randn(16))
    gamma = 2.5 * math.sqrt(16) * scale.v / torch.linalg.vector_norm(scale.v)  # γ = g·sqrt(d)·v/‖v‖₂
    torch.testing.assert_close(scale(), gamma)
    x_hat = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(RMSNorm(16, 1e-6)(x), x_hat)
    torch.testing.assert_close(RMSNorm(16, 1e-6)(x, scale), x_hat * gamma)
    assert torch.equal(Scale(16, "input_scale", magdir=True)(), torch.ones(16))  # exactly 1 at init


def test_projection_scales_weights_like_activations():
    """diag(s_out)·W·diag(s_in) applied to W gives the activation-side function and gradients."""
    torch.manual_seed(0)
    proj = Projection(8, 6, std=0.1, cfg=ScaleConfig(branch=True, placement=True), reads_norm=True)
    with torch.no_grad():
        proj.s_in.weight.uniform_(0.5, 1.5)
        proj.s_out.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 8, requires_grad=True)
    params = [x, proj.weight, proj.s_in.weight, proj.s_out.weight]
    y = proj(x)
    grads = torch.autograd.grad(y.square().sum(), params)
    y_ref = proj.s_out.weight * ((proj.s_in.weight * x) @ proj.weight.T)
    torch.testing.assert_close(y, y_ref)
    for g, g_ref in zip(grads, torch.autograd.grad(y_ref.square().sum(), params)):
        torch.testing.assert_close(g, g_ref)


# ---------------------------------------------------------------- scale variants (their properties)
@pytest.mark.parametrize("moe", [False, True])
def test_none_has_no_scale_parameters(moe):
    model = build(micro("none", moe))
    assert not any(isinstance(m, Scale) for m in model.modules())
    assert {model.param_kind(n) for n, _ in model.named_parameters()} == {"matrix", "embedding"}
    assert model.gamma_stats() == {}


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_is_the_standard_model_at_init(variant, moe):
    ref = build(micro("standard", moe), seed=0)
    model = build(micro(variant, moe), seed=1)  # other seed: the copy below must do the work
    ref_state = ref.state_dict()
    copied = set()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if model.param_kind(name) not in SCALE_KINDS:
                p.copy_(ref_state[name])
                copied.add(name)
    assert all(ref.param_kind(n) in SCALE_KINDS for n, _ in ref.named_parameters() if n not in copied)
    idx = tokens()
    assert torch.equal(model(idx).logits, ref(idx).logits)


@pytest.mark.parametrize("variant,moe,tie", [
    ("standard", False, False), ("branch", False, False), ("placement", False, False), ("magdir", False, False),
    ("unified", False, False), ("none", False, False), ("unified", True, False), ("standard", True, True),
    ("unified", False, True),
])
def test_folding_the_input_scales_keeps_the_logits(variant, moe, tie):
    """No expressivity: input-side scales fold into the adjacent linear maps."""
    model = build(micro(variant, moe, tie_embeddings=tie))
    idx = tokens()
    before = model(idx).logits
    perturb_scales(model)
    logits = model(idx).logits
    if variant != "none":
        assert (logits - before).abs().max() > 1e-3  # the perturbation matters
    plain = Transformer(plain_config(model)).eval()
    plain.load_state_dict(fold_scales(model), strict=True)
    assert plain.cfg.scale == ScaleConfig()
    assert plain.cfg.tie_embeddings == (tie and variant == "none")  # a folded final γ unties the head
    for block in plain.blocks:  # only output-norm γ are left
        assert torch.equal(block.attn_scale.weight, torch.ones(32))
        assert torch.equal(block.mlp_scale.weight, torch.ones(32))
    assert torch.equal(plain.final_scale.weight, torch.ones(32))
    torch.testing.assert_close(plain(idx).logits, logits, atol=1e-5, rtol=0)


def expected_scale_names(cfg: ModelConfig) -> dict[str, set[str]]:
    """By hand, as docs/scale-vectors.md states them: the scale parameters each variant must have, by kind."""
    s = cfg.scale
    if not s.scales:
        return {"input_scale": set(), "output_scale": set()}
    suffixes = (".g", ".v") if s.magdir else (".weight",)
    out: dict[str, set[str]] = {"input_scale": set(), "output_scale": set()}

    def add(kind: str, module: str) -> None:
        out[kind].update(module + x for x in suffixes)

    add("input_scale", "final_scale")
    for i in range(cfg.n_layer):
        b = f"blocks.{i}."
        mlps = [b + "mlp"] if cfg.moe is None else [f"{b}mlp.experts.{e}" for e in range(cfg.moe.n_experts)] + (
            [b + "mlp.shared"] if cfg.moe.shared_expert else [])
        readers = [b + "attn." + p for p in "qkv"] + [m + "." + p for m in mlps for p in ("gate", "up")]
        if cfg.moe is not None:
            readers.append(b + "mlp.router")
        if s.branch:
            for r in readers:
                add("input_scale", r + ".s_in")
        else:
            add("input_scale", b + "attn_scale")
            add("input_scale", b + "mlp_scale")
        if s.placement:
            for p in [b + "attn." + p for p in "qkvo"] + [m + "." + p for m in mlps for p in ("gate", "up", "down")]:
                add("input_scale", p + ".s_out")
        if cfg.qk_norm:
            add("output_scale", b + "attn.q_scale")
            add("output_scale", b + "attn.k_scale")
        if cfg.post_norm:
            add("output_scale", b + "attn_post_scale")
            add("output_scale", b + "mlp_post_scale")
    return out


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_parameter_has_the_expected_kind(variant, moe):
    cfg = micro(variant, moe)
    model = build(cfg)
    kinds = {n: model.param_kind(n) for n, _ in model.named_parameters()}
    for kind, names in expected_scale_names(cfg).items():
        assert {n for n, k in kinds.items() if k == kind} == names, kind
    embedding = {"embed.weight", "lm_head.weight"} | {f"blocks.{i}.mlp.router.weight" for i in range(2) if moe}
    assert {n for n, k in kinds.items() if k == "embedding"} == embedding
    matrices = {n for n, k in kinds.items() if k == "matrix"}
    assert all(p.ndim == 2 for n, p in model.named_parameters() if n in matrices)
    assert len(matrices) == 2 * (4 + 3 * (5 if moe else 1))  # q,k,v,o + gate,up,down per (expert) MLP
    with pytest.raises(KeyError, match="not a parameter"):
        model.param_kind("blocks.0.attn.q.bias")


@pytest.mark.parametrize("vocab", [32000, 50304])
def test_unified_parameter_overhead_is_under_a_thousandth_at_the_gpu_preset(vocab):
    def count(variant: str) -> int:
        cfg = ModelConfig(vocab_size=vocab, n_layer=12, d_model=768, n_head=12, d_ff=2048, qk_norm=True,
                          post_norm=True, scale=VARIANTS[variant])
        with torch.device("meta"):
            return Transformer(cfg).num_params()

    plain = count("standard")  # what the export yields (a plain Llama/Qwen3 has the standard norm weights)
    overhead = (count("unified") - plain) / plain
    assert 0 < overhead < 1e-3, overhead


def test_gamma_stats_names_and_values():
    model = build(micro("unified"))
    stats = model.gamma_stats()
    assert stats["gamma/layer0.attn.q.s_in/mean"] == 1.0 and stats["gamma/layer1.mlp.down.s_out/std"] == 0.0
    perturb_scales(model)
    stats = model.gamma_stats()
    assert len(stats) == 4 * sum(isinstance(m, Scale) for m in model.modules())
    for where, module in [("layer1.mlp.up.s_out", model.blocks[1].mlp.up.s_out),
                          ("layer0.attn.k_scale", model.blocks[0].attn.k_scale),
                          ("final_scale", model.final_scale)]:
        g = module().detach()
        assert stats[f"gamma/{where}/mean"] == pytest.approx(g.mean().item(), rel=1e-6)
        assert stats[f"gamma/{where}/std"] == pytest.approx(g.std(correction=0).item(), rel=1e-5)
        assert stats[f"gamma/{where}/max"] == pytest.approx(g.max().item(), rel=1e-6)
        assert stats[f"gamma/{where}/min"] == pytest.approx(g.min().item(), rel=1e-6)


# ---------------------------------------------------------------- attention
def test_attention_is_causal():
    model = build(micro("unified"))
    perturb_scales(model)
    idx = tokens()
    changed = idx.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 64
    a, b = model(idx).logits, model(changed).logits
    assert torch.equal(a[:, :9], b[:, :9])
    assert (a[:, 9:] - b[:, 9:]).abs().amax(dim=-1).min() > 0


def test_gqa_equals_attention_with_repeated_kv_heads():
    gqa = build(micro("standard", n_kv_head=2))
    mha = build(micro("standard", n_kv_head=4), seed=1)
    perturb_scales(gqa)
    state = gqa.state_dict()
    for i in range(2):
        for p in "kv":  # kv head j serves query heads 2j, 2j+1
            w = state[f"blocks.{i}.attn.{p}.weight"]
            state[f"blocks.{i}.attn.{p}.weight"] = w.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
    mha.load_state_dict(state)
    idx = tokens()
    torch.testing.assert_close(mha(idx).logits, gqa(idx).logits, atol=1e-6, rtol=0)


def test_explicit_mask_and_positions_match_the_defaults():
    model = build(micro("standard"))
    x = model.embed(tokens())
    h, _ = model.hidden_states(x)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    h_mask, _ = model.hidden_states(x, positions=torch.arange(16).expand(2, 16), attn_mask=causal)
    torch.testing.assert_close(h_mask, h, atol=1e-6, rtol=0)
    h_shift, _ = model.hidden_states(x, positions=torch.arange(16) + 3)
    torch.testing.assert_close(h_shift, h, atol=1e-5, rtol=0)  # RoPE only sees relative positions
    h_stretch, _ = model.hidden_states(x, positions=torch.arange(16) * 2)
    assert (h_stretch - h).abs().max() > 1e-3


# ---------------------------------------------------------------- MoE
def test_routing_picks_top_k_experts_with_weights_summing_to_one():
    moe = build(micro("unified", moe=True)).blocks[0].mlp
    x = torch.randn(50, 32)
    r = moe.route(x)
    assert r.experts.shape == (50, 2)
    assert all(len(set(row)) == 2 for row in r.experts.tolist())
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(50))
    chosen = r.probs.gather(1, r.experts)
    unchosen = r.probs.scatter(1, r.experts, -1.0)
    assert (chosen.min(-1).values >= unchosen.max(-1).values).all()
    torch.testing.assert_close(r.weights, chosen / chosen.sum(-1, keepdim=True))


def test_moe_output_equals_the_per_token_mixture():
    model = build(micro("unified", moe=True))
    perturb_scales(model)
    moe: MoE = model.blocks[0].mlp
    x = torch.randn(2, 7, 32)
    out, aux = moe(x)
    flat = x.reshape(-1, 32)
    r = moe.route(flat)
    ref = torch.stack([
        sum(r.weights[n, j] * moe.experts[int(r.experts[n, j])](flat[n]) for j in range(2)) + moe.shared(flat[n])
        for n in range(len(flat))])
    torch.testing.assert_close(out.reshape(-1, 32), ref, atol=1e-6, rtol=1e-5)
    assert aux == load_balance_loss(r.probs, r.experts, 4)


def test_load_balance_loss_is_one_when_uniform_and_larger_when_skewed():
    E, k, N = 4, 2, 8
    uniform = torch.full((N, E), 1 / E)
    balanced = torch.tensor([[e, (e + 1) % E] for e in range(E)] * 2)  # every expert gets N·k/E slots
    assert load_balance_loss(uniform, balanced, E).item() == pytest.approx(1.0)
    skewed_probs = torch.tensor([[0.7, 0.2, 0.05, 0.05]]).expand(N, E)
    skewed = torch.tensor([[0, 1]]).expand(N, k)
    loss = load_balance_loss(skewed_probs, skewed, E).item()
    assert loss == pytest.approx(E * (0.5 * 0.7 + 0.5 * 0.2))
    assert loss > 1.5


def test_moe_loss_adds_the_weighted_aux():
    model = build(micro("standard", moe=True))
    layer_aux = []
    for block in model.blocks:
        block.mlp.register_forward_hook(lambda module, args, output: layer_aux.append(output[1]))
    idx = tokens()
    out = model(idx, idx)
    ce = F.cross_entropy(out.logits.flatten(0, 1), idx.flatten())
    assert len(layer_aux) == 2
    torch.testing.assert_close(out.aux_loss, (layer_aux[0] + layer_aux[1]) / 2)  # mean over layers
    torch.testing.assert_close(out.loss, ce + 0.01 * out.aux_loss)
    assert build(micro("standard"))(idx, idx).aux_loss.item() == 0.0


# ---------------------------------------------------------------- accounting
@pytest.mark.parametrize("moe,tie", [(False, False), (False, True), (True, False)])
def test_flops_per_token_is_six_times_the_active_matmul_weights(moe, tie):
    model = build(micro("unified", moe, tie_embeddings=tie))

    def matmul_weights(module: torch.nn.Module) -> int:
        return sum(m.weight.numel() for m in module.modules() if isinstance(m, Projection))

    active = model.lm_head.weight.numel()
    for block in model.blocks:
        active += matmul_weights(block.attn)
        if moe:  # router, top_k = 2 experts, shared expert
            mlp = block.mlp
            active += matmul_weights(mlp.router) + 2 * matmul_weights(mlp.experts[0]) + matmul_weights(mlp.shared)
        else:
            active += matmul_weights(block.mlp)
    assert model.flops_per_token(0) == 6 * active
    assert model.flops_per_token(128) - model.flops_per_token(0) == 12 * 2 * 32 * 128
    non_embedding = sum(p.numel() for p in [*model.blocks.parameters(), *model.final_scale.parameters()])
    assert model.num_params(non_embedding=True) == non_embedding
    assert model.num_params() == non_embedding + 64 * 32 * (1 if tie else 2)


# ---------------------------------------------------------------- training
@pytest.mark.parametrize("moe", [False, True])
def test_loss_falls_on_a_micro_run(moe):
    model = build(micro("unified", moe)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = tokens(4, 16, seed=1)
    x, y = idx[:, :-1], idx[:, 1:]
    losses = []
    for _ in range(30):
        loss = model(x, y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(p.grad is not None for p in model.parameters())  # every scale and expert is trained
    assert losses[-1] < 0.5 * losses[0], losses


def test_bf16_autocast_forward_and_backward():
    model = build(micro("unified", moe=True)).train()
    idx = tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(idx, idx)
    out.loss.backward()
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())

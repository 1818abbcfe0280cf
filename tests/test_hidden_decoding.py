"""Hidden Decoding: the properties the method stands on, on tiny random Llama/Qwen3 backbones built
from configs (no download)."""

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mutants import mutant, mutation_checks
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from scalelab.config import HiddenDecodingConfig, HiddenDecodingModelConfig, ModelConfig, ModelSource
from scalelab.model import Transformer, export_hf
from scalelab.hidden_decoding import window as stream_window
from scalelab.model.hf import load_causal_lm
from scalelab.hidden_decoding.model import HiddenDecodingLM, StreamCache, attended_pairs
from scalelab.hidden_decoding.dense import dense_run_layers, mixing_mask
from scalelab.hidden_decoding.io import from_source, load_hidden_decoding, save_hidden_decoding
from scalelab.runtime import yamlio

V = 64
ROOT = Path(__file__).resolve().parents[1]


def llama(layers=4, tie=False, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).eval()


def qwen3(layers=4, seed=0):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return Qwen3ForCausalLM(cfg).eval()


def hd(backbone, **kw):
    torch.manual_seed(1)
    return HiddenDecodingLM(backbone, HiddenDecodingModelConfig(**kw)).eval()


def tokens(B=2, T=9, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ n = 1 is the backbone
@pytest.mark.parametrize("attention", ["sfa", "full"])
@pytest.mark.parametrize("make", [llama, qwen3])
def test_one_stream_is_the_backbone_exactly(make, attention):
    backbone, x = make(), tokens()
    ref = backbone(x).logits
    model = hd(backbone, n_streams=1, attention=attention, mixing_layers=[1, 3])
    assert torch.equal(model(x).logits, ref)


def test_one_stream_is_a_scalelab_cell_exactly(tmp_path):
    """A scalelab model enters through its folded HF export: n = 1 equals the export bit for bit, and the scalelab
    model up to float rounding (its RoPE tables are computed in another order)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, n_layer=3, d_model=32, n_head=4, n_kv_head=2, d_ff=64)
    net = Transformer(cfg).eval()
    with torch.no_grad():  # non-trivial γ, so folding is exercised
        for name, p in net.named_parameters():
            if net.param_kind(name).endswith("scale"):
                p.mul_(1 + 0.3 * torch.rand_like(p))
    assert export_hf(net, tmp_path) == "qwen3"
    x = tokens()
    model = from_source(ModelSource(path=str(tmp_path)), HiddenDecodingModelConfig(n_streams=1)).eval()
    assert torch.equal(model(x).logits, load_causal_lm(tmp_path)(x).logits)
    torch.testing.assert_close(model(x).logits, net(x).logits, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ attention patterns
def reference_mask(kind: str, n: int, T: int, window: int | None = None) -> torch.Tensor:
    """[n, T, n, T]: may (i,s) read (j,t)? Built position by position from METHODS §C (a local layer: a mixing
    layer that reads only the last `window` tokens)."""
    m = torch.zeros(n, T, n, T, dtype=torch.bool)
    for s in range(n):
        for i in range(T):
            for t in range(n):
                for j in range(T):
                    if kind == "within":
                        m[s, i, t, j] = t == s and j <= i
                    else:
                        m[s, i, t, j] = (j < i or (j == i and t <= s)) and (kind == "mixing" or j > i - window)
    return m


def dependency(model: HiddenDecodingLM, n: int, T: int) -> torch.Tensor:
    """[n, T, n, T]: does the output at (i,s) depend on the input at (j,t)? (Jacobian structure of the layer stack.)"""
    h = torch.randn(1, n, T, 32, requires_grad=True)
    out = model.run_layers(h)
    dep = torch.zeros(n, T, n, T, dtype=torch.bool)
    for s in range(n):
        for i in range(T):
            (g,) = torch.autograd.grad(out[0, s, i].square().sum(), h, retain_graph=True)
            dep[s, i] = g[0].abs().sum(-1) > 0
    return dep


@pytest.mark.parametrize("positions", ["shared", "interleaved", "per_layer"])
@pytest.mark.parametrize("kind", ["within", "mixing"])
def test_layer_attention_equals_reference_mask(kind, positions):
    n, T = 3, 5
    model = hd(qwen3(layers=1), n_streams=n, positions=positions, mixing_layers=[0])
    if kind == "within":  # a lone within-stream layer (a config the check refuses: nothing would reach (i, n))
        model.mixing_layers = frozenset()
    assert model.layer_kind(0) == kind
    assert torch.equal(dependency(model, n, T), reference_mask(kind, n, T))
    # the mask function itself, on the stream-major layout the mixing layers use
    tok, st = torch.arange(T).repeat(n), torch.arange(n).repeat_interleave(T)
    assert torch.equal(mixing_mask(tok, st, tok, st), reference_mask("mixing", n, T).reshape(n * T, n * T))
    assert reference_mask(kind, n, T).sum() == attended_pairs(kind, n, T)


@pytest.mark.parametrize("positions", ["shared", "interleaved", "per_layer"])
@pytest.mark.parametrize("n,attention", [(2, "sfa"), (4, "sfa"), (3, "full")])
def test_maskless_mixing_equals_the_dense_oracle(n, attention, positions, monkeypatch):
    """Token-major causal SDPA computes what the dense stream-major (nT)² mask computes (the oracle, the earlier
    implementation), with no mask tensor in any full-sequence layer and the key/value heads left grouped (GQA)."""
    from transformers.integrations import sdpa_attention

    model = hd(qwen3(), n_streams=n, attention=attention, positions=positions)
    e = model.embed(tokens(T=7))
    calls, real = [], F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, **kw):
        calls.append((attn_mask, q.shape[1], k.shape[1], kw.get("is_causal")))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(sdpa_attention.torch.nn.functional, "scaled_dot_product_attention", sdpa)
    out = model.run_layers(e)
    assert len(calls) == 4 and all(m is None and causal for m, _, _, causal in calls)
    assert all((hq, hk) == (4, 2) for _, hq, hk, _ in calls)  # GQA: 2 kv heads for 4 query heads, not expanded
    monkeypatch.undo()
    torch.testing.assert_close(out, dense_run_layers(model, e), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 2, 5])
def test_a_local_layer_reads_a_window_of_tokens_and_all_their_streams(window):
    """The Jacobian structure of a lone local layer is the windowed mixing rule, and its pair count is counted."""
    n, T = 3, 5
    model = hd(qwen3(layers=1), n_streams=n, mixing_layers=[], local_layers=[0], local_window=window)
    assert model.layer_kind(0) == "local"
    ref = reference_mask("local", n, T, window)
    assert torch.equal(dependency(model, n, T), ref)
    assert ref.sum() == attended_pairs("local", n, T, window)
    assert attended_pairs("local", n, T, T) == attended_pairs("mixing", n, T)  # a window of every token: mixing


@pytest.mark.parametrize("n,window,T", [(2, 3, 7), (3, 2, 8), (4, 1, 5), (3, 9, 7)])
def test_windowed_local_layers_equal_the_dense_oracle_without_a_full_mask(n, window, T, monkeypatch):
    """Local layers (blocks of whole tokens against the previous block) compute what the dense (nT)² windowed mask
    computes; the largest mask any layer builds is a block's, [n·w, 2·n·w], never [nT, nT]; with the window past the
    sequence a local layer is a mixing layer."""
    model = hd(qwen3(), n_streams=n, mixing_layers=[3], local_layers=[0, 2], local_window=window)
    assert [model.layer_kind(i) for i in range(4)] == ["local", "within", "local", "mixing"]
    e = model.embed(tokens(T=T))
    shapes, real = [], F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, **kw):
        shapes.append(None if attn_mask is None else tuple(attn_mask.shape[-2:]))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(stream_window.F, "scaled_dot_product_attention", sdpa)
    out = model.run_layers(e)
    monkeypatch.undo()
    b = n * window
    assert shapes == [(b, 2 * b), None, (b, 2 * b), None]  # within and mixing layers: SDPA's causal path
    torch.testing.assert_close(out, dense_run_layers(model, e), atol=1e-6, rtol=1e-5)
    if window >= T:
        mixing = hd(qwen3(), n_streams=n, mixing_layers=[0, 2, 3])
        torch.testing.assert_close(out, mixing.run_layers(e), atol=1e-6, rtol=1e-5)


def test_local_layers_are_checked_against_the_other_kinds():
    cfg = lambda **kw: HiddenDecodingModelConfig(n_streams=2, **kw)  # noqa: E731
    assert cfg(local_layers=[3]).mixing(4) == [1] and cfg(local_layers=[3]).local(4) == [3]  # out of the default
    assert cfg(mixing_layers=[], local_layers=[1]).mixing(4) == []  # a local layer alone carries the streams
    for kw, match in (({"mixing_layers": [1, 3], "local_layers": [3]}, "both"),
                      ({"local_layers": [4]}, "4 layers"), ({"local_layers": [1], "attention": "full"}, "full")):
        with pytest.raises(ValueError, match=match):
            cfg(**kw).mixing(4)


def test_rope_positions_per_layer_kind():
    """per_layer (WeLM-HD): token position i in within-stream layers, n·i + s in mixing layers, as each layer
    receives them in its own layout; shared and interleaved use one of the two everywhere."""
    n, T = 3, 5
    seen = {}
    for positions, expect in (("per_layer", ("i", "ni+s")), ("shared", ("i", "i")), ("interleaved", ("ni+s", "ni+s"))):
        model = hd(llama(layers=2), n_streams=n, positions=positions, mixing_layers=[1])
        for i, layer in enumerate(model.backbone.model.layers):
            layer.register_forward_pre_hook(lambda m, a, kw, i=i: seen.__setitem__(i, kw["position_embeddings"][0]),
                                            with_kwargs=True)
        model.run_layers(model.embed(tokens(B=1, T=T)))
        rope = lambda pos: model.backbone.model.rotary_emb(torch.zeros(1), pos[None])[0][0]
        i_, s_ = torch.arange(T), torch.arange(n)
        table = {"i": i_[None].expand(n, T), "ni+s": n * i_[None] + s_[:, None]}  # [n, T], stream-major
        torch.testing.assert_close(seen[0], torch.stack([rope(p) for p in table[expect[0]]]))  # rows = streams
        torch.testing.assert_close(seen[1][0], rope(table[expect[1]].t().reshape(-1)))  # token-major entries


def test_mixing_layers_default_spread_through_the_depth():
    from scalelab.config.hidden_decoding import default_mixing

    assert {L: default_mixing(L) for L in (2, 3, 4, 8, 12)} == {
        2: [1], 3: [0, 2], 4: [1, 3], 8: [3, 7], 12: [3, 7, 11]}
    assert default_mixing(30) == [1, 5, 9, 13, 17, 21, 25, 29]


def test_full_mode_mixes_in_every_layer():
    model = hd(llama(layers=3), n_streams=2, attention="full")
    assert [model.layer_kind(i) for i in range(3)] == ["mixing"] * 3
    assert [hd(llama(layers=8), n_streams=2).layer_kind(i) for i in range(8)].count("mixing") == 2  # 3 and 7


def test_within_stream_layers_never_read_another_stream():
    """Perturb stream 1's input: streams 2 and 3 are bit-identical up to the first mixing layer, then change."""
    n = 3
    model = hd(llama(layers=4), n_streams=n, mixing_layers=[2])
    e = model.embed(tokens())
    bumped = e.clone()
    bumped[:, 0] += torch.randn_like(bumped[:, 0])
    a, b = [], []
    model.run_layers(e, hidden_out=a)
    model.run_layers(bumped, hidden_out=b)
    for layer in (0, 1):
        assert torch.equal(a[layer][:, 1:], b[layer][:, 1:])
        assert not torch.equal(a[layer][:, 0], b[layer][:, 0])
    assert not torch.equal(a[2][:, 1:], b[2][:, 1:])


# ------------------------------------------------------------------ streams that can differ (METHODS §C, symmetry)
def _table_grads(model, x):
    inp, y = x[:, :-1], x[:, 1:]
    model.zero_grad()
    model(inp, y).loss.backward()
    return [t.weight.grad.clone() for t in model.embeddings()]


@pytest.mark.parametrize("noise", [None, 0.0])  # the defaults; and equal tables, where only the layout breaks symmetry
def test_hidden_streams_get_their_own_gradients_and_tables_drift_apart(noise):
    """Under the default mixing layers (spread through the depth) the last stream's loss reaches every table, each
    stream's table gets a gradient of its own (not a copy of another's), and after a few AdamW steps the updates of
    the n tables pairwise differ by far more than their init noise."""
    kw = {} if noise is None else {"embed_noise": noise}
    model = hd(llama(), n_streams=4, **kw).train()  # untied head: E_1's gradient comes only through stream 1 too
    assert sorted(model.mixing_layers) == [1, 3]
    x = tokens(B=4, T=12)
    grads = _table_grads(model, x)
    for s, g in enumerate(grads, 1):
        assert g.abs().sum() > 0, f"the last stream's loss does not reach E_{s}"
    for a in range(4):
        for b in range(a + 1, 4):
            rel = (grads[a] - grads[b]).norm() / grads[a].norm()
            assert rel > 0.05, f"E_{a + 1} and E_{b + 1} get (nearly) the same gradient: {rel:.2g}"
    start = [t.weight.detach().clone() for t in model.embeddings()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for step in range(5):
        opt.zero_grad()
        model(*(lambda t: (t[:, :-1], t[:, 1:]))(tokens(B=4, T=12, seed=step))).loss.backward()
        opt.step()
    moved = [t.weight.detach() - e for t, e in zip(model.embeddings(), start)]
    for a in range(4):
        for b in range(a + 1, 4):
            assert (moved[a] - moved[b]).norm() > 0.1 * moved[a].norm(), (a, b)


def test_settings_with_interchangeable_or_unread_streams_are_refused():
    """The old defaults on a 4-layer backbone (only the last layer mixing, no noise, shared positions) make the
    hidden streams interchangeable copies: refused with one line; as soon as one condition goes, they are allowed.
    A hidden stream with no mixing layer never reaches the prediction: refused."""
    old = {"n_streams": 4, "mixing_layers": [3], "embed_noise": 0.0, "positions": "shared"}
    with pytest.raises(ValueError, match="interchangeable"):
        HiddenDecodingModelConfig(**old).mixing(4)
    with pytest.raises(ValueError, match="interchangeable"):
        HiddenDecodingModelConfig(**{**old, "embed_noise": 0.1, "tables": "tied"}).mixing(4)
    for change in ({"embed_noise": 0.1}, {"mixing_layers": [1, 3]}, {"positions": "per_layer"}, {"n_streams": 2},
                   {"attention": "full"}):
        HiddenDecodingModelConfig(**{**old, **change}).mixing(4)
    with pytest.raises(ValueError, match="never reach"):
        HiddenDecodingModelConfig(n_streams=2, mixing_layers=[]).mixing(4)
    HiddenDecodingModelConfig(n_streams=1, mixing_layers=[]).mixing(4)  # n = 1: nothing hidden
    # the refusal is not a formality: with only the last layer mixing (set behind the check's back), the three
    # hidden tables receive bit-identical gradients, so they would stay copies forever
    model = hd(llama(), n_streams=4, mixing_layers=[1, 3], embed_noise=0.0, positions="shared").train()
    model.mixing_layers = frozenset({3})
    g = _table_grads(model, tokens(B=4, T=12))
    assert torch.equal(g[0], g[1]) and torch.equal(g[1], g[2]) and not torch.equal(g[2], g[3])


# ------------------------------------------------------------------ decoding
@pytest.mark.parametrize("positions", ["shared", "interleaved", "per_layer"])
@pytest.mark.parametrize("n,attention,local", [(1, "sfa", []), (3, "sfa", []), (3, "full", []), (3, "sfa", [0, 2])])
def test_cached_decoding_equals_the_full_forward(n, attention, local, positions):
    model = hd(qwen3(), n_streams=n, attention=attention, positions=positions, mixing_layers=[1, 3],
               local_layers=local, local_window=3, embed_noise=0.1)
    x = tokens(T=10)
    full = model(x).logits
    cache = StreamCache(max_tokens=10 if positions != "shared" else None)  # preallocated, or grown by doubling
    # a prompt, a chunk of two (causal with an offset), then one token at a time
    steps = [model.step(x[:, :4], cache), model.step(x[:, 4:6], cache)]
    steps += [model.step(x[:, t : t + 1], cache) for t in range(6, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # every layer holds all n streams of every token: within-stream layers per stream, mixing layers as one sequence
    for i, (k, _) in cache.kv.items():
        assert k.shape[0] * k.shape[2] == x.shape[0] * n * 10


def test_decoding_writes_into_a_preallocated_cache():
    """With max_tokens the buffers are allocated once: every step writes in place (no copy of the cache per token)."""
    model = hd(llama(), n_streams=2, mixing_layers=[1, 3])
    x, cache = tokens(T=8), StreamCache(max_tokens=8)
    model.step(x[:, :3], cache)
    ptrs = {i: k.data_ptr() for i, (k, _) in cache.kv.items()}
    for t in range(3, 8):
        model.step(x[:, t : t + 1], cache)
        assert {i: k.data_ptr() for i, (k, _) in cache.kv.items()} == ptrs
    assert cache.kv[1][0].shape[2] == 2 * 8 and cache.kv[0][0].shape[2] == 8  # token-major n·T; per stream T


def test_generate_greedy_and_sampling():
    model = hd(llama(), n_streams=2, mixing_layers=[1], embed_noise=0.1)
    prompt = tokens(T=3)
    out = model.generate(prompt, 6)
    assert torch.equal(out[:, :3], prompt) and out.shape == (2, 9)
    for t in range(3, 9):  # greedy: each token is the full forward's argmax on its prefix
        assert torch.equal(out[:, t], model(out[:, :t]).logits[:, -1].argmax(-1))
    draw = lambda: model.generate(prompt, 6, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(0))
    sampled = draw()
    assert torch.equal(sampled, draw())  # a pure function of the generator
    for t in range(3, 9):  # top-k: every sampled token is among the 3 most likely
        top = model(sampled[:, :t]).logits[:, -1].topk(3).indices
        assert (top == sampled[:, t : t + 1]).any(-1).all()


# ------------------------------------------------------------------ the loss
def test_loss_is_taken_at_exactly_the_last_stream():
    n = 3
    model = hd(llama(), n_streams=n, mixing_layers=[1, 3], embed_noise=0.1)
    x = tokens(T=10)
    inp, y = x[:, :-1], x[:, 1:]
    seen = []
    model.backbone.model.norm.register_forward_hook(lambda m, a, out: seen.append(a[0]))
    h = model.run_layers(model.embed(inp))
    per_stream = [F.cross_entropy(model.stream_logits(h[:, s]).flatten(0, 1), y.flatten()) for s in range(n)]
    seen.clear()
    out = model(inp, y)
    assert len(seen) == 1 and torch.equal(seen[0], h[:, -1])  # the head reads only (i, n)
    assert torch.equal(out.loss, per_stream[-1]) and out.aux_loss == 0
    assert all(not torch.isclose(out.loss, per_stream[s]) for s in range(n - 1))
    # the optional auxiliary loss: the weighted mean CE of the hidden streams
    model.cfg = model.cfg.model_copy(update={"aux_loss_weight": 0.5})
    aux = model(inp, y)
    torch.testing.assert_close(aux.aux_loss, torch.stack(per_stream[:-1]).mean())
    torch.testing.assert_close(aux.loss, per_stream[-1] + 0.5 * aux.aux_loss)


# ------------------------------------------------------------------ save / reload
@pytest.mark.parametrize("tie", [False, True])
def test_save_reload_and_hugging_face_round_trip(tmp_path, tie):
    model = hd(llama(tie=tie), n_streams=3, mixing_layers=[1], embed_noise=0.5)
    x = tokens()
    ref = model(x).logits
    save_hidden_decoding(model, tmp_path)
    meta = json.loads((tmp_path / "hidden_decoding.json").read_text())
    assert meta["model"]["n_streams"] == 3 and meta["mixing_layers"] == [1]
    assert torch.equal(load_hidden_decoding(tmp_path)(x).logits, ref)
    # transformers refuses the folder rather than loading the plain backbone without the extra tables
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "scalelab_hidden_decoding" and "load_hidden_decoding" in config["note"]
    with pytest.raises(ValueError, match="scalelab_hidden_decoding"):
        load_causal_lm(tmp_path)
    # a weights-only checkpoint of the state dict restores the same function on a fresh model
    torch.save(model.state_dict(), tmp_path / "state.pt")
    fresh = hd(llama(tie=tie, seed=5), n_streams=3, mixing_layers=[1])
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert torch.equal(fresh(x).logits, ref)


def test_bad_inputs_fail_with_one_clear_line():
    with pytest.raises(ValueError, match="mixing_layers"):
        hd(llama(layers=2), n_streams=2, mixing_layers=[5])
    with pytest.raises(ValueError, match=r"mixing_layers \[\]: cells \['n2'\]"):
        HiddenDecodingConfig(cells={"n1": {}, "n2": {"n_streams": 2}}, grid=["n1", "n2"], mixing_layers=[])
    base = {"cells": {"n1": {}}, "grid": ["n1"]}
    with pytest.raises(ValueError, match="source_dep"):
        HiddenDecodingConfig(**base, source={"cell": "standard-m-base-0"}, source_dep="data/elsewhere")
    with pytest.raises(ValueError, match="unknown cells"):
        HiddenDecodingConfig(cells={"n1": {}}, grid=["n2"])


# ------------------------------------------------------------------ FLOPs and training
def test_flops_are_counted_by_mask_and_controls_match_them():
    from scalelab.hidden_decoding.train import cell_steps

    T = 16
    cells = {"n4": {"n_streams": 4}, "n1_flops_n4": {"n_streams": 1, "flops_of": {"n_streams": 4}}}
    cfg = HiddenDecodingConfig(cells=cells, grid=list(cells), train={"max_steps": 100, "seq_len": T})
    backbone = llama()  # 4 layers, d 32, 4 heads of 8, 2 kv heads, d_ff 64, vocab 64; mixing layers: 1, 3
    # by hand: 6 × weights per position (q, o 32·32; k, v 32·16; gate, up, down 32·64) × 4 streams × 4 layers,
    # the head once per token; 12 × 32 per attended pair, pairs counted on the reference masks
    weights = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64
    pairs = 2 * reference_mask("within", 4, T).sum().item() + 2 * reference_mask("mixing", 4, T).sum().item()
    expected = 6 * (4 * 4 * weights + 32 * V) + 12 * 32 * pairs / T
    model = HiddenDecodingLM(backbone, cfg.model("n4"))
    assert model.flops_per_token(T) == pytest.approx(expected, rel=1e-12)
    # layer 1 local over 3 tokens: its pairs are the windowed mask's
    windowed = cfg.model_copy(update={"local_layers": [1], "local_window": 3}).model("n4")
    pairs_local = pairs - reference_mask("mixing", 4, T).sum().item() + reference_mask("local", 4, T, 3).sum().item()
    assert HiddenDecodingLM(llama(), windowed).flops_per_token(T) == pytest.approx(
        expected + 12 * 32 * (pairs_local - pairs) / T, rel=1e-12)
    steps = cell_steps(cfg, "n1_flops_n4", backbone.config)
    f1 = HiddenDecodingLM(llama(), cfg.model("n1_flops_n4")).flops_per_token(T)
    one = cfg.model_copy(update={"local_layers": [1], "local_window": 3}).model("n1_flops_n4")  # n = 1: no window
    assert HiddenDecodingLM(llama(), one).flops_per_token(T) == pytest.approx(f1, rel=1e-12)
    assert abs(steps * f1 - 100 * expected) <= f1 / 2  # equal training FLOPs, up to rounding to a step


def _write_shards(folder, seed=0):
    """Token shards in the loader's format: a noisy periodic sequence that a model learns quickly."""
    from scalelab.data import file_sha256

    folder.mkdir()
    rng = np.random.default_rng(seed)
    meta = {"dtype": "uint16", "vocab_size": V, "eot_id": 0, "tokenizer_sha256": "test", "shards": {}}
    for split, n in (("train", 20000), ("val", 2000)):
        seq = (np.arange(n) * 7 % 29 + (rng.random(n) < 0.05) * rng.integers(0, V, n)) % V
        path = folder / f"{split}.bin"
        seq.astype(np.uint16).tofile(path)
        meta["shards"][split] = {"file": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    (folder / "meta.json").write_text(json.dumps(meta))


def test_a_local_llama_continues_training(tmp_path):
    """The same code continues a Hugging Face Llama from a local folder: the last-stream loss falls."""
    from scalelab.hidden_decoding.train import fit_cell

    llama(layers=2).save_pretrained(tmp_path / "llama")
    _write_shards(tmp_path / "tokens")
    cfg = HiddenDecodingConfig(
        source={"path": str(tmp_path / "llama")}, source_dep=str(tmp_path / "llama"), mixing_layers=[1],
        embed_noise=0.0, cells={"n2": {"n_streams": 2}}, grid=["n2"],
        train={"corpus": "shards", "seq_len": 16, "batch_size": 8, "max_steps": 30, "val_every": 15, "ckpt_every": 15,
               "val_tokens": 512, "optimizer": {"lr": 3e-3}},
    )
    metrics = fit_cell(cfg, "n2", 0, tmp_path / "out", tmp_path / "tokens")
    curve = (tmp_path / "out/model/curve.csv").read_text().splitlines()
    assert curve[1].split(",")[:3] == ["0", "0", ""]  # validated before the first step, which trains on row 2
    first = float(curve[2].split(",")[2])  # train loss of the first step
    assert float(curve[1].split(",")[3]) == metrics["val_loss_start"] == pytest.approx(first, abs=0.1)
    assert metrics["val_loss"] < first - 1.0 and metrics["steps"] == 30
    assert math.isfinite(metrics["flops"]) and metrics["n_streams"] == 2
    # the mixing check: the trained model with and without its cross-stream mixing, on the final validation windows
    assert metrics["val_loss_mixing_on"] == pytest.approx(metrics["val_loss"], abs=1e-6)
    assert metrics["val_loss_mixing_off"] != metrics["val_loss_mixing_on"] and metrics["backbone_run"] is None
    assert metrics["passes"] == pytest.approx(30 * 8 * 16 / 20000)
    # the tables' spread: 0 at init without noise, moved apart by training
    assert metrics["table_spread_start"] == 0.0 and metrics["table_spread"] > 1e-3
    reloaded = load_hidden_decoding(tmp_path / "out/model")
    assert len(reloaded.extra_embeds) == 1
    # every table trained: with zero noise E_2 started as the backbone's E_1 (frozen tables still drop the loss)
    start = LlamaForCausalLM.from_pretrained(tmp_path / "llama").get_input_embeddings().weight
    for s, table in enumerate(reloaded.embeddings(), 1):
        assert (table.weight - start).abs().max() > 1e-3, f"E_{s} did not train"


def test_a_local_llama_with_its_own_vocabulary_trains_on_the_prepared_corpus(tmp_path):
    """hidden_decoding.source: {path: <a Llama with another vocabulary>}: the cell encodes the prepared documents
    with the model's own tokenizer (the project's shards, in another vocabulary, are never read), trains, and saves
    a folder with that tokenizer; a changed corpus changes the config hash."""
    import polars as pl

    from scalelab.hidden_decoding import train as hdt

    folder, prepared = _own_vocab_llama(tmp_path / "llama"), _prepared(tmp_path / "prepared")
    cfg = HiddenDecodingConfig(
        source={"path": str(folder)}, source_dep=str(folder), cells={"n2": {"n_streams": 2}}, grid=["n2"],
        train={"seq_len": 16, "batch_size": 8, "max_steps": 20, "val_every": 10, "ckpt_every": 10,
               "val_tokens": 256, "optimizer": {"lr": 1e-2}})
    corpus = hdt.load_corpus(cfg, "n2", tmp_path / "no-shards", prepared, hdt.backbone_tokenizer(cfg))
    assert corpus.shards.vocab_size == 40 and int(corpus.shards.train.max()) < 40
    assert corpus.shards.train[30] == 0  # documents joined by the tokenizer's own EOS
    metrics = hdt.fit_cell(cfg, "n2", 0, tmp_path / "out", tmp_path / "no-shards", prepared_dir=prepared)
    assert metrics["steps"] == 20 and metrics["val_loss"] < math.log(40) - 1.0
    assert (tmp_path / "out/model/tokenizer.json").is_file()
    assert load_hidden_decoding(tmp_path / "out/model").n == 2
    (prepared / "val.parquet").unlink()
    pl.DataFrame({"text": ["w1 w2 w3"] * 20}).write_parquet(prepared / "val.parquet")
    other = hdt.load_corpus(cfg, "n2", tmp_path / "no-shards", prepared, hdt.backbone_tokenizer(cfg))
    assert hdt.config_hash(cfg, "n2", 0, 20, other) != hdt.config_hash(cfg, "n2", 0, 20, corpus)


def _own_vocab_llama(folder):
    """A tiny local Llama with a 40-word tokenizer of its own (its table has V = 64 rows)."""
    llama(layers=2).save_pretrained(folder)
    _word_tokenizer(["<eos>", "<unk>"] + [f"w{i}" for i in range(38)]).save_pretrained(folder)
    return folder


def _prepared(folder):
    """data/prepared in the prepare stage's format, in a learnable order: w_k is followed by w_{k+1}."""
    import polars as pl

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 80), ("val", 20)):
        docs = [" ".join(f"w{(k + j) % 38}" for j in range(30)) for k in rng.integers(0, 38, n)]
        pl.DataFrame({"text": docs}).write_parquet(folder / f"{split}.parquet")
    return folder


def _stage_project(root):
    """A project whose only data is data/prepared and a local Llama of its own vocabulary (no token shards)."""
    _own_vocab_llama(root / "models/llama")
    _prepared(root / "data/prepared")
    params = yamlio.safe_load((ROOT / "tests/micro_params.yaml").read_text())
    params["hidden_decoding"].update(
        source={"path": "models/llama"}, source_dep="models/llama", grid=["n2", "n4"],
        cells={"n2": {"n_streams": 2}, "n4": {"n_streams": 4}})
    return params


def test_stage_refuses_interchangeable_streams_before_any_compute(tmp_path, monkeypatch):
    """The old settings (n = 4, only the last layer mixing, no noise, shared positions) stop the stage with one
    line naming the cell, before the corpus is encoded or anything is written."""
    import argparse
    import importlib.util

    from scalelab.config import ParamsError, parse_params

    params = _stage_project(tmp_path)
    params["hidden_decoding"].update(mixing_layers=[1], embed_noise=0.0, positions="shared")
    spec = importlib.util.spec_from_file_location("hd_stage", ROOT / "stages/hidden_decoding.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParamsError, match=r"^cell n4: .*interchangeable[^\n]*$"):
        stage.train(parse_params(params), argparse.Namespace(cell="n4", seed=0))
    assert not (tmp_path / "data/hidden_decoding").exists() and not (tmp_path / "metrics").exists()
    parse_params(params).hidden_decoding.model("n2").mixing(2)  # n = 2 passes: one hidden stream, nothing to swap


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")


def test_tables_start_as_exact_copies_of_the_backbones_embedding():
    """METHODS §C: every E_s starts as the backbone's embedding; with zero noise exactly, with noise ε at about
    ε·std(E) per entry; E_1 is the backbone's own table (tied heads stay tied)."""
    backbone = llama()
    e = backbone.get_input_embeddings().weight.detach().clone()
    model = hd(backbone, n_streams=4, mixing_layers=[1], embed_noise=0.0)
    assert model.embeddings()[0].weight is backbone.get_input_embeddings().weight
    assert len(model.extra_embeds) == 3 and all(torch.equal(t.weight, e) for t in model.extra_embeds)
    noisy = hd(llama(), n_streams=3, mixing_layers=[1], embed_noise=0.1)
    for table in noisy.extra_embeds:
        assert float((table.weight.detach() - e).std()) == pytest.approx(0.1 * float(e.std()), rel=0.1)


def _resume_cfg(folder):
    return HiddenDecodingConfig(
        source={"path": str(folder)}, source_dep=str(folder), mixing_layers=[1], embed_noise=0.1,
        cells={"n2": {"n_streams": 2}}, grid=["n2"],
        train={"corpus": "shards", "seq_len": 16, "batch_size": 4, "max_steps": 8, "val_every": 4, "ckpt_every": 4,
               "val_tokens": 256, "optimizer": {"lr": 3e-3}})


def test_an_interrupted_cell_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    """fit_cell killed after its step-4 checkpoint, then rerun: it trains only steps 5..8 and ends with the
    uninterrupted run's losses, curve and weights (extra tables included); a changed backbone is a new config
    hash, so its checkpoint would not be resumed."""
    from scalelab.hidden_decoding import train as hdt

    llama(layers=2).save_pretrained(tmp_path / "llama")
    _write_shards(tmp_path / "tokens")
    cfg, shards = _resume_cfg(tmp_path / "llama"), tmp_path / "tokens"
    straight = hdt.fit_cell(cfg, "n2", 0, tmp_path / "straight", shards)
    starts = []

    from scalelab.train import trainer

    class Counting(trainer.StepCheckpoint):  # the cell's own checkpoint callback (the one trainer's), counting steps
        crash_at = 4

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if pl_module.step == self.crash_at:
                raise RuntimeError("killed")
            starts.append(pl_module.step)

    monkeypatch.setattr(trainer, "StepCheckpoint", Counting)
    with pytest.raises(RuntimeError, match="killed"):
        hdt.fit_cell(cfg, "n2", 0, tmp_path / "resumed", shards)
    assert torch.load(tmp_path / "resumed/ckpt/last.ckpt", weights_only=True)["scalelab"]["step"] == 4
    Counting.crash_at, starts[:] = None, []
    resumed = hdt.fit_cell(cfg, "n2", 0, tmp_path / "resumed", shards)
    assert starts == [4, 5, 6, 7], starts  # continued from the checkpoint, not from the backbone
    for key in ("val_loss", "train_loss", "steps"):
        assert resumed[key] == pytest.approx(straight[key], abs=1e-6), key
    assert (tmp_path / "resumed/model/curve.csv").read_text() == (tmp_path / "straight/model/curve.csv").read_text()
    a, b = (load_hidden_decoding(tmp_path / d / "model").state_dict() for d in ("straight", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    corpus = hdt.load_corpus(cfg, "n2", shards, tmp_path / "no-prepared", None)
    chash = hdt.config_hash(cfg, "n2", 0, 8, corpus)
    llama(layers=2, seed=1).save_pretrained(tmp_path / "llama")  # same config, other weights
    assert hdt.config_hash(cfg, "n2", 0, 8, corpus) != chash


# ------------------------------------------------------------------ the summary's comparisons and claims
def _final(cells):
    """Each cell's curve: its final validation alone (cell -> seed -> [(tokens, val_loss)])."""
    return {c: {s: [(1000.0, m["val_loss"])] for s, m in by_seed.items()} for c, by_seed in cells.items()}


def test_summary_pairs_cells_by_role_and_seed(tmp_path):
    from scalelab.hidden_decoding import ledger as hdr

    cfg = HiddenDecodingConfig(
        cells={"n1": {}, "n2": {"n_streams": 2}, "n4": {"n_streams": 4},
               "n4full": {"n_streams": 4, "attention": "full"}, "n4tied": {"n_streams": 4, "tables": "tied"},
               "c2": {"flops_of": {"n_streams": 2}}, "c4": {"flops_of": {"n_streams": 4}}},
        grid=["n1", "n2", "n4", "n4full", "n4tied", "c2", "c4"], seeds=[0, 1, 2])
    assert hdr.roles(cfg) == {"base": {1: "n1", 2: "n2", 4: "n4"}, "warm": {}, "own_lr": {}, "full": {4: "n4full"},
                              "control": {2: "c2", 4: "c4"}, "tied": {4: "n4tied"}}
    own = HiddenDecodingConfig(cells={"n1": {}, "n2lr": {"n_streams": 2, "table_lr": 1e-3}, "n2": {"n_streams": 2}},
                               grid=["n1", "n2lr", "n2"])  # an arm at its own rates is never the base arm
    assert hdr.roles(own)["own_lr"] == {2: "n2lr"} and hdr.roles(own)["base"] == {1: "n1", 2: "n2"}
    # n = 2 helps by 0.10 and n = 4 by 0.05 at equal tokens; at equal FLOPs the controls close most of it, and
    # n = 4 falls behind its control; full attention gains 0.051, SFA keeps 98% of it; tied tables lose 0.04.
    # Seed offsets cancel in the pairing.
    loss = {"n1": 3.0, "n2": 2.9, "n4": 2.95, "n4full": 2.949, "n4tied": 2.99, "c2": 2.92, "c4": 2.9}
    params = {"n1": 1000, "n2": 1100, "n4": 1300, "n4full": 1300, "n4tied": 1000, "c2": 1000, "c4": 1000}
    for cell, value in loss.items():
        for seed in cfg.seeds:
            jitter = 0.001 * np.random.default_rng([seed, *map(ord, cell)]).standard_normal()  # per cell and seed
            spread = {"table_spread_start": 0.1, "table_spread": 0.3} if cell == "n4" else {}
            on = value + 0.3 * seed + jitter
            mixing = {"val_loss_mixing_on": on, "val_loss_mixing_off": on + 0.05 + jitter} if cell[:2] == "n4" or \
                cell == "n2" else {}  # switched off, the trained mixing costs 0.05
            (tmp_path / f"{cell}-{seed}.json").write_text(json.dumps(
                {"val_loss": on, "params": params[cell], "tokens": 4096, "steps": 8, **spread, **mixing}))
    cells = hdr.collect(tmp_path, cfg)
    cmp = hdr.comparisons(cells, cfg)
    assert cmp["gain_tokens"][2] == pytest.approx([0.1] * 3, abs=0.003)
    assert cmp["gain_full"][4] == pytest.approx([0.051] * 3, abs=0.003)
    entries = hdr.claims(cmp, hdr.Setting(cfg, cells, curves=_final(cells)), sfa_fraction=0.8)
    verdicts = {c["id"]: c["verdict"] for c in entries}
    observed = "observation (no claim of the paper: it compares at equal tokens)"
    assert verdicts == {"C.gain.tokens.n2": "reproduced", "C.gain.tokens.n4": "reproduced",
                        "C.grows.tokens.n2-n4": "contradicted", "C.gain.flops.n2": observed,
                        "C.gain.flops.n4": observed, "C.grows.flops.n2-n4": observed,
                        "C.gain.full.n4": "reproduced", "C.sfa.n4": "reproduced", "C.tables.n4": "reproduced"}
    flops = {e["id"]: e["effect"] for e in entries if ".flops." in e["id"]}  # reported: the mean paired difference
    assert flops["C.gain.flops.n2"] == pytest.approx(0.02, abs=0.003)  # n = 2 beats its control
    assert flops["C.gain.flops.n4"] == pytest.approx(-0.05, abs=0.003)  # n = 4 falls behind its control
    reg = entries[0]["regime"]  # the backbone's size and the base budget, beside the paper's tokens per parameter
    assert (reg["params"], reg["non_embedding_params"], reg["tokens"], reg["steps"]) == (1000, 900, 4096, 8)
    assert reg["paper_tokens_per_param"] == pytest.approx(75e9 / 8e9) and reg["scope"] == "small-scale"
    assert all(p["passed"] for e in entries for p in e["premises"])
    # the equal-FLOPs rows are reported beside the paper's claims, which compare at equal tokens only
    assert {e["published"] for e in entries if ".flops." in e["id"]} == {hdr.PUBLISHED_FLOPS}
    (tmp_path / "c4-1.json").unlink()
    with pytest.raises(ValueError, match="c4-1.json: missing"):
        hdr.collect(tmp_path, cfg)


def test_the_arm_table_reads_each_arms_loss_gain_start_mixing_and_flops_from_its_cells():
    """The study README's arm table (hidden_decoding.arms): n = 2 at 0.05 below n = 1 in every seed (seed offsets
    cancel in the pairing), its largest step-0 gap in absolute value, its mixing-off cost, its FLOPs over n = 1's
    measured from the cells; n = 1 has no gain and no gap of its own."""
    from scalelab.hidden_decoding import arms
    from scalelab.hidden_decoding import ledger as hdr

    cfg = HiddenDecodingConfig(cells={"n1": {}, "n2": {"n_streams": 2}}, grid=["n1", "n2"], seeds=[0, 1, 2])
    start = {0: 0.001, 1: -0.003, 2: 0.002}
    cells = {"n1": {s: {"val_loss": 3.0 + 0.1 * s, "val_loss_start": 3.5, "flops": 100.0, "passes": 1.0,
                        "wall_s": 60.0} for s in cfg.seeds},
             "n2": {s: {"val_loss": 2.95 + 0.1 * s, "val_loss_start": 3.5 + start[s], "flops": 148.0, "passes": 1.0,
                        "wall_s": 120.0, "val_loss_mixing_on": 2.95 + 0.1 * s,
                        "val_loss_mixing_off": 3.0 + 0.1 * s + 0.01 * s} for s in cfg.seeds}}
    one, two = arms.rows(cells, cfg)
    assert one["gain"] == [] and one["start_gap"] is None and one["flops_ratio"] == 1.0
    assert two["gain"] == pytest.approx([0.05] * 3) and two["start_gap"] == pytest.approx(-0.003)
    assert two["mixing"] == pytest.approx([0.05, 0.06, 0.07]) and two["flops_ratio"] == pytest.approx(1.48)
    assert (two["wall_min"], two["passes"]) == (2.0, 1.0)
    assert arms._interval([0.05, 0.06, 0.07], 0.95) == f"+0.0600 ± {4.303 * 0.01 / 3 ** 0.5:.4f}"
    assert hdr.trained(cfg) == ["n1", "n2"]


def _probe_setting(premises=()):
    from scalelab.hidden_decoding import ledger as hdr

    cfg = HiddenDecodingConfig(cells={"n1": {}, "n2": {"n_streams": 2}, "n4": {"n_streams": 4},
                                      "n4full": {"n_streams": 4, "attention": "full"}},
                               grid=["n1", "n2", "n4", "n4full"], seeds=[0, 1, 2])
    return hdr.Setting(cfg, {}, probe=list(premises))


def test_sfa_and_growth_claims_can_fail_and_wait_for_their_premise():
    """SFA keeping half of full's gain is contradicted (the claim asks 80%), and so is SFA gaining nothing beside a
    full-attention gain of 0.012 (its margin is a fraction of the smallest gain, not the gain itself); without a
    reproduced full-attention gain the SFA claim is untested and says why, whatever its own interval shows. The
    growth claim is decided on its own difference: n = 2 gaining nothing does not hide n = 4 gaining more."""
    from scalelab.hidden_decoding import ledger as hdr

    seeds = lambda x, j=(-0.002, 0.0, 0.003): [x + d for d in j]
    cmp = {"gain_tokens": {2: seeds(0.08), 4: seeds(0.05, (0.001, -0.003, 0.002))}, "gain_flops": {},
           "gain_full": {4: seeds(0.10)},
           "sfa_minus_full": {}, "tables": {}}
    v = {c["id"]: c for c in hdr.claims(cmp, _probe_setting(), sfa_fraction=0.8)}
    assert v["C.sfa.n4"]["verdict"] == "contradicted"  # 0.05 − 0.8 · 0.10 < 0
    assert v["C.sfa.n4"]["effect"] == pytest.approx(0.05 - 0.08, abs=1e-3)
    assert v["C.grows.tokens.n2-n4"]["verdict"] == "contradicted"
    assert v["C.sfa.n4"]["smallest_effect"] == hdr.SFA_MARGIN.value < hdr.LOSS_SESOI.value
    nothing = {**cmp, "gain_tokens": {4: seeds(0.0)}, "gain_full": {4: seeds(0.012)}}
    v = {c["id"]: c for c in hdr.claims(nothing, _probe_setting(), sfa_fraction=0.8)}
    assert v["C.gain.full.n4"]["verdict"] == "reproduced" and v["C.sfa.n4"]["verdict"] == "contradicted"
    # full attention gains nothing: the SFA claim waits; n = 2 gains nothing and n = 4 does: the gain grew
    cmp = {"gain_tokens": {2: seeds(0.0), 4: seeds(0.05, (0.001, -0.003, 0.002))}, "gain_flops": {},
           "gain_full": {4: seeds(-0.001)},
           "sfa_minus_full": {}, "tables": {}}
    v = {c["id"]: c for c in hdr.claims(cmp, _probe_setting(), sfa_fraction=0.8)}
    assert v["C.gain.full.n4"]["verdict"] != "reproduced"
    assert v["C.sfa.n4"]["verdict"].startswith("untested (full attention's gain at n = 4: ")
    assert v["C.sfa.n4"]["effect"] > 0  # its own interval alone would have said reproduced
    assert v["C.gain.tokens.n2"]["verdict"] != "reproduced"
    assert v["C.grows.tokens.n2-n4"]["verdict"] == "reproduced"
    assert all(tuple(c) == ledger_fields() for c in v.values())


def ledger_fields():
    from scalelab.ledger.claims import FIELDS

    return FIELDS


# ------------------------------------------------------------------ the probe's floor and the premises
def _brute_window_loss(task, windows, prior, T):
    """The Bayes loss of aligned windows by enumeration: every hypothesis (phase, digits of the blocks the window
    touches) weighted by its prior, the predictive of a prefix the weight of the hypotheses that continue it."""
    import itertools

    L, blocks = task.period, (task.period - 1 + T + 1) // task.period + 1
    total_prior = sum(prior.values())

    def window(phase, digits):
        stream = []
        for b in range(blocks):
            d = digits[b * task.K:(b + 1) * task.K]
            stream += [*d, task.base, task.sum_token(sum(d))]
        return tuple(stream[phase:phase + T + 1])

    hyps = [(prior[p] / total_prior, window(p, d)) for p in prior
            for d in itertools.product(range(task.base), repeat=task.K * blocks)]
    weight = {}
    for w, win in hyps:
        for t in range(T + 2):
            weight[win[:t]] = weight.get(win[:t], 0.0) + w
    out = 0.0
    for phase, count in windows.items():
        digits = list(itertools.product(range(task.base), repeat=task.K * blocks))
        loss = sum(-math.log(weight[win[:t + 1]] / weight[win[:t]])
                   for win in (window(phase, d) for d in digits) for t in range(1, T + 1))
        out += count * loss / (len(digits) * T)
    return out / sum(windows.values())


@pytest.mark.parametrize("task,T", [((2, 2, 0), 6), ((2, 3, 3), 5), ((1, 3, 0), 7)])
def test_the_window_floor_equals_a_brute_force_enumeration(task, T):
    """The forward recursion over (true state, predictor's belief) equals enumerating every hypothesis, for plain
    and modular sums (whose sum tokens look like digits), with a phase prior unlike the windows' phases."""
    from scalelab.hidden_decoding import window_floor as wf
    from sum_task import SumTask

    task = SumTask(*task)
    windows = Counter({p: 1 + p for p in range(task.period)})
    prior = Counter({p: 2 + (p % 2) for p in range(task.period)})
    assert wf.window_loss(task, task, windows, prior, T) == pytest.approx(_brute_window_loss(task, windows, prior, T),
                                                                         rel=1e-10)


def test_the_floor_follows_the_loaders_windows():
    """The floor of the v3 probe's validation windows (seq_len 56 over blocks of 6: windows start 0, 2 or 4 tokens
    into a block) equals the mean realized Bayes loss of the windows the loader cuts from shards the task writes, and
    sits well above the stationary floor; the phases are the loader's own."""
    import statistics

    from scalelab.hidden_decoding import window_floor as wf
    from scalelab.data.loader import train_batch, val_batches
    from sum_task import SumTask, shard_lengths, sum_task_floors

    task, T, val_tokens = SumTask(4, 3, 0), 56, 8192
    floors = sum_task_floors(task, T, val_tokens)
    assert floors.floor == pytest.approx(0.76937, abs=5e-5)  # the exact floor, as computed when this task was in use
    assert floors.floor - floors.stationary > 0.03 and floors.sum_blind > floors.floor
    n_train, n_val = shard_lengths(task)
    prior = wf.train_phases(n_train, T, task.period)
    rng, realized = np.random.default_rng(7), []
    for _ in range(6):
        for x, y in val_batches(task.tokens(rng, n_val), seq_len=T, val_tokens=val_tokens, batch_size=256):
            for xi, yi in zip(x.tolist(), y.tolist()):
                realized.append(statistics.fmean(wf.window_losses(task, prior, [xi[0], *yi])))
    se = statistics.stdev(realized) / math.sqrt(len(realized))
    assert abs(statistics.fmean(realized) - floors.floor) < 4 * se, (statistics.fmean(realized), floors.floor, se)
    # the loader's window starts, read off a stream of positions
    starts = [int(x[0]) for xs, _ in val_batches(np.arange(n_val), seq_len=T, val_tokens=val_tokens, batch_size=64)
              for x in xs]
    assert wf.val_phases(n_val, T, val_tokens, task.period) == Counter(s % task.period for s in starts)
    assert set(wf.val_phases(n_val, T, val_tokens, task.period)) == {0, 2, 4}
    x, _ = train_batch(np.arange(100), seed=0, step=0, batch_size=4096, seq_len=7)
    starts = set(x[:, 0].tolist())
    assert starts == set(range(100 - 7))  # the start range train_phases counts, every start drawn
    assert wf.train_phases(100, 7, 6) == Counter(s % 6 for s in starts)


def test_a_continued_pretraining_waits_for_the_step0_gap(tmp_path):
    """n = 2 behind n = 1 with its gap still shrinking is untested; once the gap has stopped shrinking (or n = 2
    is level) the same final numbers are decided; a single validation gives no trend."""
    from scalelab.hidden_decoding import ledger as hdr

    cfg = HiddenDecodingConfig(cells={"n1": {}, "n2": {"n_streams": 2}}, grid=["n1", "n2"], seeds=[0, 1, 2])
    end = {"n1": [3.46, 3.47, 3.45], "n2": [3.56, 3.58, 3.57]}
    cells = {c: {s: {"val_loss": v, "params": 100, "tokens": 2048, "steps": 16,
                     **({"val_loss_mixing_on": v, "val_loss_mixing_off": v + 0.1 + 0.01 * s} if c == "n2" else {})}
                 for s, v in enumerate(vs)} for c, vs in end.items()}
    cmp = hdr.comparisons(cells, cfg)

    def verdict(gap_before):  # n = 2's gap to n = 1 at the earlier validation; 0.11 at the last
        curves = {c: {s: [(1024.0, end["n1"][s] - 0.1 + (gap_before if c == "n2" else 0.0)), (2048.0, v)]
                      for s, v in enumerate(vs)} for c, vs in end.items()}
        return hdr.claims(cmp, hdr.Setting(cfg, cells, curves=curves), 0.8)[0]["verdict"]

    assert verdict(0.2) == ("untested (n2 recovered its step-0 gap: gap +0.2000 at 1024 → +0.1100 at 2048 tokens "
                            "(45% shrink))")
    assert verdict(0.105) == "contradicted"  # 0.105 -> 0.11: the gap no longer closes
    one = {c: {s: [(2048.0, v)] for s, v in enumerate(vs)} for c, vs in end.items()}
    assert hdr.claims(cmp, hdr.Setting(cfg, cells, curves=one), 0.8)[0]["verdict"].endswith("one point: no trend)")
    level = {c: {s: [(2048.0, v - (0.2 if c == "n2" else 0))] for s, v in enumerate(vs)} for c, vs in end.items()}
    cells2 = {c: {s: m | {"val_loss": level[c][s][0][1]} for s, m in by.items()} for c, by in cells.items()}
    entry = hdr.claims(hdr.comparisons(cells2, cfg), hdr.Setting(cfg, cells2, curves=level), 0.8)[0]
    assert entry["verdict"] == "reproduced" and entry["premises"][0]["passed"]


def test_recovery_has_an_absolute_floor():
    """A gap to n = 1 within RECOVERED_FLOOR at the last point is recovered whatever its sign or trend (a gap of a
    ten-thousandth no longer fails on one side of 0 and passes on the other); above the floor a gap still closing
    fails."""
    from scalelab.hidden_decoding import premises as hdp

    def passed(before, last):
        return hdp.recovered("n2", [(1024.0, [before] * 3), (2048.0, [last] * 3)])["passed"]

    floor = hdp.RECOVERED_FLOOR
    assert passed(0.0003, 0.0001) and passed(-0.0003, -0.0001)  # both sides of 0, the gap still closing
    assert passed(3 * floor, floor) and not passed(3 * floor, 1.5 * floor)  # the floor itself, and just above it
    assert passed(1.04 * floor * 2, floor * 2)  # above it, no longer closing: played out
    assert hdp.recovered("n2", [(2048.0, [floor / 2] * 3)])["passed"]  # one point within the floor needs no trend


def test_a_continued_pretraining_is_decided_only_where_its_mixing_acts():
    """Whatever the start (gated here: n = 2 begins level with n = 1, so recovery holds at once), a comparison tests
    the method only where the trained model's loss with its cross-stream mixing switched off differs from its own,
    the same way over seeds: mixing that changes nothing (a gate that stayed shut), or no such check recorded, is
    untested on the same final numbers that decide the claim once the mixing acts; mixing that hurts acts too."""
    from scalelab.hidden_decoding import ledger as hdr

    cfg = HiddenDecodingConfig(positions="shared", cells={"n1": {}, "n2": {"n_streams": 2, "start": "gated"}},
                               grid=["n1", "n2"], seeds=[0, 1, 2])
    end = {"n1": [3.46, 3.47, 3.45], "n2": [3.26, 3.28, 3.27]}

    def entry(off_minus_on):
        cells = {c: {s: {"val_loss": v, "params": 100, "tokens": 2048, "steps": 16,
                         **({"val_loss_mixing_on": v, "val_loss_mixing_off": v + off_minus_on[s]}
                            if c == "n2" and off_minus_on is not None else {})}
                     for s, v in enumerate(vs)} for c, vs in end.items()}
        curves = {c: {s: [(0.0, 3.9), (2048.0, v)] for s, v in enumerate(vs)} for c, vs in end.items()}
        return hdr.claims(hdr.comparisons(cells, cfg), hdr.Setting(cfg, cells, curves=curves), 0.8)[0]

    assert entry([0.21, 0.19, 0.2])["verdict"] == "reproduced"
    assert entry([-0.02, -0.03, -0.025])["verdict"] == "reproduced"  # the mixing acts, against the model
    shut = entry([1e-6, -2e-6, 0.0])
    assert shut["verdict"].startswith("untested (n2's mixing acts: off − on -0.0000 ± ")
    assert entry(None)["verdict"] == "untested (n2's mixing acts: not measured)"
    assert entry([0.0, 0.0, 0.0])["premises"][-1]["passed"] is False  # exactly nothing switched off


# ------------------------------------------------------------------ the gated start
@pytest.mark.parametrize("mixing", [[1, 3], None, "full"])
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("make", [llama, qwen3])
def test_the_gated_start_is_the_backbone_at_step0_and_then_opens(make, n, mixing, tmp_path):
    """start gated: at step 0 an n-stream model computes its backbone's logits bit for bit, whatever the copies'
    noise and however many layers mix; each gate gets a gradient, and once it moves the hidden streams are read.
    It saves and reloads with its gates; with interleaved mixing positions (which change the function whatever
    the gate) it is refused."""
    x = tokens(2, 9)
    ref = make().eval()(x).logits
    kw = {"attention": "full"} if mixing == "full" else {"mixing_layers": mixing}
    model = hd(make(), n_streams=n, positions="shared", start="gated", embed_noise=0.1, **kw)
    assert torch.equal(model(x).logits, ref)
    assert len(model.mix_gates) == len(model.mixing_layers) > 0
    model(x, x).loss.backward()
    assert all(float(g.grad.abs()) > 0 for g in model.mix_gates)
    from scalelab.hidden_decoding.train import gate_mean

    assert gate_mean(model) == 0.0
    with torch.no_grad():
        for i, g in enumerate(model.mix_gates):
            g.fill_(0.5 if i == 0 else 0.25)
    assert gate_mean(model) == pytest.approx(0.5 if len(model.mix_gates) == 1 else
                                             (0.5 + 0.25 * (len(model.mix_gates) - 1)) / len(model.mix_gates))
    assert (model(x).logits - ref).abs().max() > 1e-3
    cache = StreamCache(9)
    cached = torch.cat([model.step(x[:, :4], cache), model.step(x[:, 4:], cache)], dim=1)
    assert torch.allclose(cached, model(x).logits, atol=1e-5)
    save_hidden_decoding(model, tmp_path / "m")
    again = load_hidden_decoding(tmp_path / "m").eval()
    assert torch.equal(again(x).logits, model(x).logits)
    with pytest.raises(ValueError, match="start gated with positions per_layer"):
        HiddenDecodingModelConfig(n_streams=n, start="gated")


def test_the_open_start_with_interleaved_mixing_positions_is_not_the_backbone():
    """The contrast: the method's start reads the hidden stream from step 0, and per_layer positions double every
    distance a mixing layer sees, so n = 2 starts away from the backbone."""
    x = tokens(2, 9)
    ref = llama().eval()(x).logits
    assert (hd(llama(), n_streams=2, mixing_layers=[1, 3], embed_noise=0.0)(x).logits - ref).abs().max() > 1e-3


# ------------------------------------------------------------------ mutation checks (tests/mutants.py)
def _after_init(monkeypatch, then):
    real = HiddenDecodingLM.__init__

    def init(self, backbone, cfg):
        real(self, backbone, cfg)
        then(self)

    monkeypatch.setattr(HiddenDecodingLM, "__init__", init)


@mutant("hd-tables-frozen")  # E_2..E_n never trained
def _(monkeypatch):
    _after_init(monkeypatch, lambda self: self.extra_embeds.requires_grad_(False))


@mutant("hd-tables-not-copied")  # E_2..E_n freshly initialised instead of copied from the backbone
def _(monkeypatch):
    def fresh(self):
        with torch.no_grad():
            for table in self.extra_embeds:
                table.weight.normal_(0.0, float(self.embeddings()[0].weight.std()))

    _after_init(monkeypatch, fresh)


@mutant("hd-resume-ignored")  # the checkpoint is claimed but the run starts over from the backbone
def _(monkeypatch):
    from scalelab.hidden_decoding import train as hdt

    real = hdt.claim_ckpt_dir
    monkeypatch.setattr(hdt, "claim_ckpt_dir", lambda *a, **k: real(*a, **k) and None)


@mutant("hd-hash-ignores-backbone")  # the backbone's files left out of the config hash
def _(monkeypatch):
    from scalelab.hidden_decoding import train as hdt

    monkeypatch.setattr(hdt, "source_digest", lambda location: location)


@mutant("hd-symmetry-check-removed")  # interchangeable or unread hidden streams accepted
def _(monkeypatch):
    from scalelab.config.hidden_decoding import default_mixing

    def mixing(self, n_layer):
        if self.attention == "full":
            return list(range(n_layer))
        return sorted(set(self.mixing_layers if self.mixing_layers is not None else default_mixing(n_layer)))

    monkeypatch.setattr(HiddenDecodingModelConfig, "mixing", mixing)


@mutant("hd-dense-mixing-restored")  # the earlier stream-major (nT)² mask implementation in the model
def _(monkeypatch):
    real = HiddenDecodingLM.run_layers
    monkeypatch.setattr(HiddenDecodingLM, "run_layers", lambda self, h, cache=None, hidden_out=None:
                        dense_run_layers(self, h) if cache is None else real(self, h, cache, hidden_out))


@mutant("hd-per-layer-as-shared")  # per_layer positions silently the shared scheme
def _(monkeypatch):
    from scalelab.config import hidden_decoding as cfg

    monkeypatch.setitem(cfg.POSITIONS, "per_layer", ("token", "token"))


@mutant("hd-cache-not-preallocated")  # max_tokens ignored: buffers regrown (copied) as decoding goes
def _(monkeypatch):
    real = StreamCache.__init__
    monkeypatch.setattr(StreamCache, "__init__", lambda self, max_tokens=None: real(self, None))


@mutant("hd-folder-loads-as-backbone")  # the backbone's config.json left in the HD folder
def _(monkeypatch):
    from scalelab.hidden_decoding import io

    real = io.save_hidden_decoding

    def save(model, out_dir, tokenizer=None):
        real(model, out_dir, tokenizer)
        meta = json.loads((Path(out_dir) / io.CONFIG_NAME).read_text())
        (Path(out_dir) / "config.json").write_text(json.dumps(meta["backbone"]))

    monkeypatch.setattr(io, "save_hidden_decoding", save)
    monkeypatch.setitem(globals(), "save_hidden_decoding", save)


@mutant("hd-own-tokenizer-ignored")  # a path source trains on the project's shards, as before
def _(monkeypatch):
    monkeypatch.setattr(HiddenDecodingConfig, "uses_text", lambda self: False)


@mutant("hd-reference-premise-off")  # SFA and growth claims decided whatever the gain they are measured against
def _(monkeypatch):
    from scalelab.ledger import claims as ledger
    from scalelab.hidden_decoding import premises as hdp

    monkeypatch.setattr(hdp, "shown", lambda name, diffs, level, need: ledger.premise(name, "off", True, need))


@mutant("hd-recovery-premise-off")  # continued pretraining read whether or not n > 1 recovered its start
def _(monkeypatch):
    from scalelab.ledger import claims as ledger
    from scalelab.hidden_decoding import premises as hdp

    monkeypatch.setattr(hdp, "recovered", lambda cell, points: ledger.premise(f"{cell} recovered", "off", True, ""))


@mutant("hd-floor-ignores-alignment")  # the validation windows taken to start at a block's first token
def _(monkeypatch):
    from scalelab.hidden_decoding import window_floor as wf

    real = wf.val_phases
    monkeypatch.setattr(wf, "val_phases", lambda *a: Counter({0: sum(real(*a).values())}))


@mutant("hd-window-one-short")  # a local layer's window stops one token short (token i − w + 1 unread)
def _(monkeypatch):
    def short(n, w, device=None):
        b = n * w
        a, c = torch.arange(b, device=device)[:, None], torch.arange(2 * b, device=device)[None, :]
        later = (c <= a + b) & (c >= n * (a // n + 2))
        return torch.stack([later & (c >= b), later])

    monkeypatch.setattr(stream_window, "window_mask", short)


@mutant("hd-local-as-mixing")  # the window ignored: a local layer reads the whole context
def _(monkeypatch):
    monkeypatch.setattr(stream_window, "windowed_sdpa", lambda q, k, v, n, w, scale=None: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=scale, enable_gqa=True))


@mutant("hd-gate-starts-open")  # the gated start's gates begin at 1: n > 1 reads the hidden streams from step 0
def _(monkeypatch):
    def opened(self):
        with torch.no_grad():
            for g in self.mix_gates:
                g.fill_(1.0)

    _after_init(monkeypatch, opened)


@mutant("hd-mixing-never-off")  # the switch leaves the mixing on: the mixing check compares the model with itself
def _(monkeypatch):
    from contextlib import nullcontext

    monkeypatch.setattr(HiddenDecodingLM, "mixing_off", lambda self: nullcontext())


@mutant("hd-mixing-premise-off")  # a continued pretraining read whether or not its mixing acts
def _(monkeypatch):
    from scalelab.ledger import claims as ledger
    from scalelab.hidden_decoding import premises as hdp

    monkeypatch.setattr(hdp, "mixing_acts", lambda cell, rows, level=0.95: ledger.premise(f"{cell}", "off", True, ""))


@mutant("hd-start-bound-ignored")  # any step-0 gap taken for a start that preserves the backbone's function
def _(monkeypatch):
    from scalelab.ledger import claims as ledger
    from scalelab.hidden_decoding import premises as hdp

    monkeypatch.setattr(hdp, "start_preserved", lambda cell, gaps, bound: ledger.premise(cell, "off", True, ""))


@mutant("hd-predictor-on-a-copy")  # predictor_table ignored: the predicting stream reads a noisy copy
def _(monkeypatch):
    real = HiddenDecodingLM.embeddings

    def embeddings(self):
        if self.gated or self.cfg.tables != "separate":
            return real(self)
        e1 = self.backbone.get_input_embeddings()
        return [e1, *self.extra_embeds]

    monkeypatch.setattr(HiddenDecodingLM, "embeddings", embeddings)


T = "tests/test_hidden_decoding.py::"
CAUGHT = [
    ("hd-mixing-never-off", f"{T}test_switching_the_mixing_off_leaves_the_backbone_on_the_trained_weights"),
    ("hd-mixing-premise-off", f"{T}test_a_continued_pretraining_is_decided_only_where_its_mixing_acts"),
    ("hd-start-bound-ignored", f"{T}test_the_setup_premises_fail_where_the_setup_is_wrong"),
    ("hd-predictor-on-a-copy", f"{T}test_the_backbones_table_on_the_predicting_stream_starts_at_the_backbones_function"),
    ("hd-gate-starts-open", f"{T}test_the_gated_start_is_the_backbone_at_step0_and_then_opens"),
    ("hd-tables-frozen", f"{T}test_a_local_llama_continues_training"),
    ("hd-tables-not-copied", f"{T}test_tables_start_as_exact_copies_of_the_backbones_embedding"),
    ("hd-resume-ignored", f"{T}test_an_interrupted_cell_resumes_to_the_uninterrupted_result"),
    ("hd-hash-ignores-backbone", f"{T}test_an_interrupted_cell_resumes_to_the_uninterrupted_result"),
    ("hd-symmetry-check-removed", f"{T}test_settings_with_interchangeable_or_unread_streams_are_refused"),
    ("hd-symmetry-check-removed", f"{T}test_stage_refuses_interchangeable_streams_before_any_compute"),
    ("hd-dense-mixing-restored", f"{T}test_maskless_mixing_equals_the_dense_oracle"),
    ("hd-per-layer-as-shared", f"{T}test_rope_positions_per_layer_kind"),
    ("hd-cache-not-preallocated", f"{T}test_decoding_writes_into_a_preallocated_cache"),
    ("hd-folder-loads-as-backbone", f"{T}test_save_reload_and_hugging_face_round_trip"),
    ("hd-own-tokenizer-ignored", f"{T}test_a_local_llama_with_its_own_vocabulary_trains_on_the_prepared_corpus"),
    ("hd-reference-premise-off", f"{T}test_sfa_and_growth_claims_can_fail_and_wait_for_their_premise"),
    ("hd-recovery-premise-off", f"{T}test_a_continued_pretraining_waits_for_the_step0_gap"),
    ("hd-floor-ignores-alignment", f"{T}test_the_floor_follows_the_loaders_windows"),
    ("hd-window-one-short", f"{T}test_windowed_local_layers_equal_the_dense_oracle_without_a_full_mask"),
    ("hd-local-as-mixing", f"{T}test_windowed_local_layers_equal_the_dense_oracle_without_a_full_mask"),
    ("hd-local-as-mixing", f"{T}test_cached_decoding_equals_the_full_forward"),
]


test_a_broken_hidden_decoding_is_caught = mutation_checks(CAUGHT)


# ------------------------------------------------------------------ the start measured, the table-only warm-up
def test_a_table_warmup_trains_only_what_hidden_decoding_adds(tmp_path):
    """During `table_warmup` the backbone's weights stay as they were (AdamW's decay included) while the extra table
    and the gates train; after it the backbone trains too."""
    from scalelab.hidden_decoding.train import fit_cell

    llama(layers=2).save_pretrained(tmp_path / "llama")
    _write_shards(tmp_path / "tokens")
    start = LlamaForCausalLM.from_pretrained(tmp_path / "llama").state_dict()

    def run(steps):
        cfg = HiddenDecodingConfig(
            source={"path": str(tmp_path / "llama")}, source_dep=str(tmp_path / "llama"), positions="shared",
            cells={"n2": {"n_streams": 2, "start": "gated", "table_warmup": 4}}, grid=["n2"],
            train={"corpus": "shards", "seq_len": 16, "batch_size": 8, "max_steps": steps, "val_every": 2,
                   "ckpt_every": steps, "val_tokens": 256, "optimizer": {"lr": 1e-2, "weight_decay": 0.1}})
        fit_cell(cfg, "n2", 0, tmp_path / f"out{steps}", tmp_path / "tokens")
        return load_hidden_decoding(tmp_path / f"out{steps}/model")

    warm = run(4)
    assert all(torch.equal(v, warm.backbone.state_dict()[k]) for k, v in start.items())
    assert (warm.extra_embeds[0].weight - start["model.embed_tokens.weight"]).abs().max() > 1e-3
    assert any(g.abs().max() > 0 for g in warm.mix_gates)
    after = run(6)
    assert not torch.equal(after.backbone.state_dict()["model.layers.0.mlp.up_proj.weight"],
                           start["model.layers.0.mlp.up_proj.weight"])
    with pytest.raises(ValueError, match="one stream adds no table"):
        HiddenDecodingConfig(cells={"n1": {"table_warmup": 2}}, grid=["n1"])



def test_tables_and_gates_train_at_their_own_rates_and_a_higher_one_opens_the_gates(tmp_path):
    """`table_lr`, `gate_lr`: the extra table and a gated start's gates sit in groups of their own at those base LRs,
    with their kinds' decay, every other parameter at the optimizer's; in the same 6 steps a gate rate 100x the
    backbone's opens the gates far more than the backbone's rate does (the dose a CPT study of the gates needs)."""
    from scalelab.config import ScaleConfig
    from scalelab.optim import build_optimizers, own_lrs
    from scalelab.hidden_decoding.train import fit_cell, gate_mean

    llama(layers=2).save_pretrained(tmp_path / "llama")
    _write_shards(tmp_path / "tokens")

    def config(**cell):
        return HiddenDecodingConfig(
            source={"path": str(tmp_path / "llama")}, source_dep=str(tmp_path / "llama"), positions="shared",
            cells={"n2": {"n_streams": 2, "start": "gated", **cell}}, grid=["n2"],
            train={"corpus": "shards", "seq_len": 16, "batch_size": 8, "max_steps": 6, "val_every": 3,
                   "ckpt_every": 6, "val_tokens": 256, "optimizer": {"lr": 1e-3, "weight_decay": 0.1}})

    model = from_source(config().source, config().model("n2"))
    (plain,) = build_optimizers(model, config().train.optimizer, ScaleConfig())
    decay = {id(p): g["weight_decay"] for g in plain.param_groups for p in g["params"]}
    own = {"extra_embeds": 0.01, "mix_gates": 0.1}
    (opt,) = own_lrs(build_optimizers(model, config().train.optimizer, ScaleConfig()), model,
                     lambda name: own.get(name.split(".")[0]))
    lr_of = {id(p): (g["base_lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}
    assert len(lr_of) == sum(1 for _ in model.parameters())  # every parameter once
    for name, p in model.named_parameters():
        assert lr_of[id(p)] == (own.get(name.split(".")[0], 1e-3), decay[id(p)]), name
    assert {g["name"] for g in opt.param_groups} >= {"embedding@own", "output_scale@own"}

    opened = {}
    for tag, cell in (("backbone-rate", {}), ("own-rate", {"gate_lr": 0.1})):
        fit_cell(config(**cell), "n2", 0, tmp_path / tag, tmp_path / "tokens")
        opened[tag] = abs(gate_mean(load_hidden_decoding(tmp_path / tag / "model")))
    assert opened["own-rate"] > 10 * opened["backbone-rate"] and opened["own-rate"] > 0.05, opened
    with pytest.raises(ValueError, match="one stream adds no table or gate"):
        HiddenDecodingConfig(cells={"n1": {"table_lr": 0.1}}, grid=["n1"])
    with pytest.raises(ValueError, match="only a gated start has gates"):
        HiddenDecodingConfig(cells={"n2": {"n_streams": 2, "gate_lr": 0.1}}, grid=["n2"])

def test_the_start_table_pairs_each_window_with_one_stream(tmp_path):
    """A forward-only cell's gap to the forward-only n = 1 cell of its seed, window by window: its mean and spread,
    and exactly 0 only when every window's is."""
    from scalelab.hidden_decoding import start as hd_start

    cfg = HiddenDecodingConfig(
        positions="shared", grid=["s1", "open", "gated"], seeds=[0],
        cells={"s1": {"forward_only": True}, "open": {"n_streams": 2, "positions": "per_layer", "forward_only": True},
               "gated": {"n_streams": 2, "start": "gated", "embed_noise": 0.0, "forward_only": True}})
    windows = {"s1": [3.0, 4.0, 5.0], "open": [3.5, 4.1, 5.6], "gated": [3.0, 4.0, 5.0]}
    files = {}
    for cell, losses in windows.items():
        files[f"{cell}-0.json"] = tmp_path / f"{cell}-0.json"
        files[f"{cell}-0.json"].write_text(json.dumps({"cell": cell, "seed": 0, "val_window_losses": losses,
                                                       "val_loss": sum(losses) / 3, "mixing_layers": [1]}))
    rows = {r["cell"]: r for r in hd_start.rows(cfg, files)}
    assert rows["open"]["gap"] == pytest.approx(0.4) and rows["open"]["gap_sd"] == pytest.approx(0.2646, abs=1e-4)
    assert rows["open"]["positions"] == "per_layer" and not rows["open"]["exact"]
    assert rows["gated"]["exact"] and rows["gated"]["embed_noise"] == 0.0 and rows["gated"]["positions"] == "shared"
    del files["s1-0.json"]
    with pytest.raises(ValueError, match="no forward-only n = 1 cell of seed 0"):
        hd_start.rows(cfg, files)


# ------------------------------------------------------------------ continued from the pipeline's own backbone
@pytest.mark.parametrize("make", [llama, qwen3])
@pytest.mark.parametrize("n,attention", [(2, "sfa"), (4, "sfa"), (4, "full")])
def test_switching_the_mixing_off_leaves_the_backbone_on_the_trained_weights(make, n, attention):
    """With token positions and the backbone's table on the predicting stream, the model with its cross-stream
    mixing switched off is its backbone's forward on the same (here perturbed, as trained) weights, exactly what the
    premise that the mixing acts compares against; with the mixing on it differs, and leaving the switch restores
    it."""
    backbone = make(layers=2)
    model = hd(backbone, n_streams=n, attention=attention, positions="shared", predictor_table="backbone")
    with torch.no_grad():  # "trained": every weight moved, the extra tables included
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = tokens()
    on = model(x).logits
    with model.mixing_off():
        off = model(x).logits
    model_impl = backbone.config._attn_implementation
    torch.testing.assert_close(off, backbone(x).logits, atol=2e-5, rtol=1e-5)
    assert (on - off).abs().max() > 1e-3
    assert torch.equal(model(x).logits, on) and backbone.config._attn_implementation == model_impl


def test_the_gated_start_switched_off_is_its_gate_shut_and_local_layers_are_refused():
    model = hd(llama(), n_streams=2, positions="shared", start="gated")
    x = tokens()
    with model.mixing_off():
        off = model(x).logits
    assert torch.equal(off, model(x).logits)  # α = 0: the mixing switched off changes nothing
    with torch.no_grad():
        for g in model.mix_gates:
            g.fill_(0.5)
    with model.mixing_off():
        assert torch.equal(model(x).logits, off)
    assert (model(x).logits - off).abs().max() > 1e-4
    with pytest.raises(ValueError, match="local cross-stream layers"):
        with hd(llama(), n_streams=2, local_layers=[1]).mixing_off():
            pass


@pytest.mark.parametrize("make", [llama, qwen3])
def test_the_backbones_table_on_the_predicting_stream_starts_at_the_backbones_function(make):
    """Under the open start with token positions and the last of two layers mixing, the predicting stream on the
    backbone's own table starts as the backbone up to float rounding where the hidden tables are exact copies, and
    with noisy copies it starts nearer the backbone than a predicting stream on a noisy copy does."""
    backbone, x = make(layers=2), tokens(T=16)
    ref = backbone(x).logits

    def gap(**kw):
        return (hd(backbone, n_streams=2, positions="shared", **kw)(x).logits - ref).abs().mean().item()

    assert gap(predictor_table="backbone", embed_noise=0.0) < 1e-6
    assert gap(predictor_table="backbone") < gap(predictor_table="copy") / 2
    model = hd(backbone, n_streams=3, positions="shared", predictor_table="backbone")
    assert model.embeddings()[-1] is backbone.get_input_embeddings()


def test_a_backbone_per_seed_is_that_seeds_pretrain_cell():
    from scalelab.config.hidden_decoding import PER_SEED_DEP

    cfg = HiddenDecodingConfig(source={"per_seed": "standard-xs-base"}, source_dep=PER_SEED_DEP,
                               cells={"n1": {}}, grid=["n1"], seeds=[0, 3])
    three = cfg.for_seed(3)
    assert three.source == ModelSource(cell="standard-xs-base-3")
    assert three.source_dep == "data/pretrain/standard-xs-base-3/model/hf" and three.train.corpus == "auto"
    assert not cfg.uses_text() and not three.uses_text()  # a pipeline cell continues on the pipeline's shards
    fixed = HiddenDecodingConfig(cells={"n1": {}}, grid=["n1"])
    assert fixed.for_seed(3) is fixed
    with pytest.raises(ValueError, match="the folder of every seed's export"):
        HiddenDecodingConfig(source={"per_seed": "standard-xs-base"}, source_dep="data/pretrain/standard-xs-base-0",
                             cells={"n1": {}}, grid=["n1"])
    with pytest.raises(ValueError, match="per_seed"):
        HiddenDecodingConfig(source={"per_seed": "a b"}, source_dep=PER_SEED_DEP, cells={"n1": {}}, grid=["n1"])


def test_a_continued_cell_records_its_backbones_run_and_draws_other_windows(tmp_path, monkeypatch):
    """A cell continuing a pipeline pretrain cell records that cell's own run (its tokens, non-embedding parameters
    and validation curve: the backbone-trained premise's input) and draws its training windows from a stream other
    than its backbone's pretraining on the same seed; a path or random source draws the seed's own."""
    from scalelab.hidden_decoding import train as hdt

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "data/pretrain/standard-xs-base-2/model"
    (folder / "hf").mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"tokens": 4096, "params": 900, "non_embedding_params": 200,
                                                     "val_loss": 3.1}))
    (folder / "curve.csv").write_text("step,tokens,train_loss,val_loss,lr\n1,1024,5.0,,0.1\n2,2048,4.0,3.5,0.1\n"
                                      "4,4096,3.2,3.1,0.1\n")
    cfg = HiddenDecodingConfig(source={"per_seed": "standard-xs-base"}, source_dep="data/pretrain",
                               cells={"n1": {}}, grid=["n1"]).for_seed(2)
    assert hdt.backbone_run(cfg) == {"cell": "standard-xs-base-2", "tokens": 4096, "params": 900,
                                     "non_embedding_params": 200, "val_loss": 3.1,
                                     "val_curve": [[2048.0, 3.5], [4096.0, 3.1]]}
    assert hdt.stream_seed(cfg, 2) != 2
    path = HiddenDecodingConfig(source={"path": "somewhere"}, source_dep="somewhere", cells={"n1": {}}, grid=["n1"])
    assert hdt.stream_seed(path, 2) == 2 and hdt.backbone_run(path) is None


def test_a_flop_matched_control_is_capped_at_its_passes():
    from scalelab.hidden_decoding.train import cell_steps

    cells = {"n4": {"n_streams": 4}, "c4": {"flops_of": {"n_streams": 4}, "max_passes": 2}}
    cfg = HiddenDecodingConfig(cells=cells, grid=list(cells), train={"max_steps": 100, "seq_len": 16,
                                                                     "batch_size": 8})
    uncapped = cell_steps(cfg.model_copy(update={"cells": {**cfg.cells, "c4": cfg.cells["c4"].model_copy(
        update={"max_passes": None})}}), "c4", llama().config)
    assert uncapped > 100
    assert cell_steps(cfg, "c4", llama().config, train_tokens=10**9) == uncapped  # far from the cap
    assert cell_steps(cfg, "c4", llama().config, train_tokens=16 * 8 * 30) == 60  # 2 passes of 30 steps' tokens
    with pytest.raises(ValueError, match="max_passes needs the training stream"):
        cell_steps(cfg, "c4", llama().config)
    with pytest.raises(ValueError, match="max_passes .* without flops_of"):
        HiddenDecodingConfig(cells={"n1": {"max_passes": 4}}, grid=["n1"])


def test_the_setup_premises_fail_where_the_setup_is_wrong():
    """Each setup premise of a continued pretraining against the bound it is given: a step-0 gap past the bound in
    one seed, a backbone caught mid-descent (most of its drop in its last quarter), a budget below the paper's over
    the factor all fail; their counterparts pass."""
    from scalelab.hidden_decoding import premises as hdp

    assert hdp.start_preserved("n2", [0.001, -0.004, 0.002], 0.005)["passed"]
    assert not hdp.start_preserved("n2", [0.001, -0.006, 0.002], 0.005)["passed"]
    assert not hdp.start_preserved("n2", [], 0.005)["passed"]
    plateaued = [[t * 100.0, 3.0 + 4.0 / t] for t in range(1, 41)]  # 1/t: most of the drop long before the end
    descending = [[t * 100.0, 7.0 - 0.1 * t] for t in range(1, 41)]  # linear: a quarter of the drop in each quarter
    assert hdp.plateau_share(plateaued) < 0.1 < hdp.plateau_share(descending)
    rows = lambda curve: [{"backbone_run": {"val_curve": curve}} for _ in range(3)]  # noqa: E731
    assert hdp.backbone_trained(rows(plateaued), 0.1)["passed"]
    assert not hdp.backbone_trained(rows(plateaued)[:2] + rows(descending)[:1], 0.1)["passed"]
    assert not hdp.backbone_trained([{}], 0.1)["passed"]
    at = lambda tokens: hdp.regime(4, params=400, non_embedding_params=100, tokens=tokens, steps=1,  # noqa: E731
                                   probe=False, per_non_embedding=True, scope="paper")
    assert at(1875)["ratio"] == pytest.approx(1.0) and at(1875)["tokens_per_param"] == pytest.approx(18.75)
    assert hdp.budget(at(1875), 2)["passed"] and hdp.budget(at(950), 2)["passed"]
    assert not hdp.budget(at(900), 2)["passed"]  # below half the paper's 18.75 tokens per parameter


@pytest.mark.parametrize("profile,size", [("hd-cpt-xs", "xs"), ("hd-cpt-s", "s")])
def test_the_pretrained_backbone_study_runs_the_budgets_it_states(profile, size):
    """configs/hd-cpt-xs.yaml (and its overlay at size s) as written: each seed's backbone pretrained to 20 tokens per
    non-embedding parameter of its size (the pretrain cell's own count), the continued pretraining at the paper's n = 4 tokens per parameter over
    the same count (within a step), at least five seeds, every arm from the open start with token positions and
    the backbone's table on the predicting stream, the FLOP controls capped at four passes, and the setup premises'
    bounds fixed; the plan's budget premise holds at those tokens."""
    from scalelab.config import load_params
    from scalelab.hidden_decoding import premises as hdp

    params = load_params(ROOT / f"configs/{profile}.yaml")
    assert params.pretrain.grid.sizes == [size] and params.pretrain.grid.variants == ["standard"]
    n_params = Transformer(params.resolve_model(size, "standard", vocab_size=2048, recipe="base")).num_params(
        non_embedding=True)
    pre = params.pretrain
    assert pre.total_steps() * pre.batch_size * pre.seq_len == pytest.approx(20 * n_params, abs=pre.batch_size * pre.seq_len)
    hdc = params.hidden_decoding
    step_tokens = hdc.train.batch_size * hdc.train.seq_len
    cpt = hdc.train.max_steps * step_tokens
    assert cpt == pytest.approx(hdp.paper_tokens_per_param(4) * n_params, abs=step_tokens)
    assert (hdc.train.seq_len, hdc.train.batch_size) == (pre.seq_len, pre.batch_size)
    assert len(hdc.seeds) >= 5 and hdc.seeds == pre.grid.seeds and hdc.source.per_seed == f"standard-{size}-base"
    arms = {(c.n_streams, c.attention, c.flops_of.n_streams if c.flops_of else None)
            for c in map(hdc.cells.get, hdc.grid)}
    assert arms == {(1, "sfa", None), (2, "sfa", None), (4, "sfa", None), (4, "full", None), (1, "sfa", 2),
                    (1, "sfa", 4)}
    for name in hdc.grid:
        m, c = hdc.model(name), hdc.cells[name]
        assert m.start == "open" and m.position_kind("mixing") == m.position_kind("within") == "token"
        assert m.n_streams == 1 or m.predictor_table == "backbone"
        assert c.flops_of is None or c.max_passes == 4
    b = hdc.claims
    assert (b.start_gap, b.budget_factor, b.backbone_plateau, b.sfa_fraction) == (0.005, 2, 0.15, 0.8)
    reg = hdp.regime(4, params=None, non_embedding_params=n_params, tokens=cpt, steps=hdc.train.max_steps,
                     probe=False, per_non_embedding=True, scope="paper")
    assert hdp.budget(reg, b.budget_factor)["passed"] and reg["ratio"] == pytest.approx(1.0, abs=1e-3)

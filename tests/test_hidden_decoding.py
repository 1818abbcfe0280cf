"""Hidden Decoding (METHODS §C): the properties the method stands on, on tiny random Llama/Qwen3 backbones built
from configs (no download)."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mutants import mutant, mutation_checks
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from scalelab.config import HiddenDecodingConfig, HiddenDecodingModelConfig, ModelConfig, ModelSource
from scalelab.model import Transformer, export_hf
from scalelab.model.hf import load_causal_lm
from scalelab.model.hidden_decoding import HiddenDecodingLM, StreamCache, attended_pairs, mixing_mask
from scalelab.model.hidden_decoding_io import from_source, load_hidden_decoding, save_hidden_decoding

V = 64


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
def reference_mask(kind: str, n: int, T: int) -> torch.Tensor:
    """[n, T, n, T]: may (i,s) read (j,t)? Built position by position from METHODS §C."""
    m = torch.zeros(n, T, n, T, dtype=torch.bool)
    for s in range(n):
        for i in range(T):
            for t in range(n):
                for j in range(T):
                    if kind == "within":
                        m[s, i, t, j] = t == s and j <= i
                    else:
                        m[s, i, t, j] = j < i or (j == i and t <= s)
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


@pytest.mark.parametrize("positions", ["shared", "interleaved"])
@pytest.mark.parametrize("kind", ["within", "mixing"])
def test_layer_attention_equals_reference_mask(kind, positions):
    n, T = 3, 5
    model = hd(qwen3(layers=1), n_streams=n, positions=positions, mixing_layers=[0] if kind == "mixing" else [])
    assert model.layer_kind(0) == kind
    assert torch.equal(dependency(model, n, T), reference_mask(kind, n, T))
    # the mask function itself, on the stream-major layout the mixing layers use
    tok, st = torch.arange(T).repeat(n), torch.arange(n).repeat_interleave(T)
    assert torch.equal(mixing_mask(tok, st, tok, st), reference_mask("mixing", n, T).reshape(n * T, n * T))
    assert reference_mask(kind, n, T).sum() == attended_pairs(kind, n, T)


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


# ------------------------------------------------------------------ decoding
@pytest.mark.parametrize("positions", ["shared", "interleaved"])
@pytest.mark.parametrize("n,attention", [(1, "sfa"), (3, "sfa"), (3, "full")])
def test_cached_decoding_equals_the_full_forward(n, attention, positions):
    model = hd(qwen3(), n_streams=n, attention=attention, positions=positions, mixing_layers=[1, 3],
               embed_noise=0.1)
    x = tokens(T=10)
    full = model(x).logits
    cache = StreamCache()
    # a prompt, a chunk of two (causal with an offset), then one token at a time
    steps = [model.step(x[:, :4], cache), model.step(x[:, 4:6], cache)]
    steps += [model.step(x[:, t : t + 1], cache) for t in range(6, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # every layer holds all n streams of every token: within-stream layers per stream, mixing layers as one sequence
    for i, (k, _) in cache.kv.items():
        assert k.shape[0] * k.shape[2] == x.shape[0] * n * 10


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
    # the folder is still the backbone's checkpoint for transformers (stream 1's table as its embedding)
    assert torch.equal(load_causal_lm(tmp_path)(x).logits, model.backbone(x).logits)
    # a weights-only checkpoint of the state dict restores the same function on a fresh model
    torch.save(model.state_dict(), tmp_path / "state.pt")
    fresh = hd(llama(tie=tie, seed=5), n_streams=3, mixing_layers=[1])
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert torch.equal(fresh(x).logits, ref)


def test_bad_inputs_fail_with_one_clear_line():
    with pytest.raises(ValueError, match="mixing_layers"):
        hd(llama(layers=2), n_streams=2, mixing_layers=[5])
    base = {"cells": {"n1": {}}, "grid": ["n1"]}
    with pytest.raises(ValueError, match="source_dep"):
        HiddenDecodingConfig(**base, source={"cell": "standard-m-base-0"}, source_dep="data/elsewhere")
    with pytest.raises(ValueError, match="unknown cells"):
        HiddenDecodingConfig(cells={"n1": {}}, grid=["n2"])


# ------------------------------------------------------------------ FLOPs and training
def test_flops_are_counted_by_mask_and_controls_match_them():
    from scalelab.train.hidden_decoding import cell_steps

    T = 16
    cells = {"n4": {"n_streams": 4}, "n1_flops_n4": {"n_streams": 1, "flops_of": {"n_streams": 4}}}
    cfg = HiddenDecodingConfig(cells=cells, grid=list(cells), train={"max_steps": 100, "seq_len": T})
    backbone = llama()  # 4 layers, d 32, 4 heads of 8, 2 kv heads, d_ff 64, vocab 64; mixing layer: 3
    # by hand: 6 × weights per position (q, o 32·32; k, v 32·16; gate, up, down 32·64) × 4 streams × 4 layers,
    # the head once per token; 12 × 32 per attended pair, pairs counted on the reference masks
    weights = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64
    pairs = 3 * reference_mask("within", 4, T).sum().item() + reference_mask("mixing", 4, T).sum().item()
    expected = 6 * (4 * 4 * weights + 32 * V) + 12 * 32 * pairs / T
    model = HiddenDecodingLM(backbone, cfg.model("n4"))
    assert model.flops_per_token(T) == pytest.approx(expected, rel=1e-12)
    steps = cell_steps(cfg, "n1_flops_n4", backbone.config)
    f1 = HiddenDecodingLM(llama(), cfg.model("n1_flops_n4")).flops_per_token(T)
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
    from scalelab.train.hidden_decoding import fit_cell

    llama(layers=2).save_pretrained(tmp_path / "llama")
    _write_shards(tmp_path / "tokens")
    cfg = HiddenDecodingConfig(
        source={"path": str(tmp_path / "llama")}, source_dep=str(tmp_path / "llama"), mixing_layers=[1],
        cells={"n2": {"n_streams": 2}}, grid=["n2"],
        train={"seq_len": 16, "batch_size": 8, "max_steps": 30, "val_every": 15, "ckpt_every": 15,
               "val_tokens": 512, "optimizer": {"lr": 3e-3}},
    )
    metrics = fit_cell(cfg, "n2", 0, tmp_path / "out", tmp_path / "tokens")
    curve = (tmp_path / "out/model/curve.csv").read_text().splitlines()
    first = float(curve[1].split(",")[2])  # train loss at step 0
    assert metrics["val_loss"] < first - 1.0 and metrics["steps"] == 30
    assert math.isfinite(metrics["flops"]) and metrics["n_streams"] == 2
    reloaded = load_hidden_decoding(tmp_path / "out/model")
    assert len(reloaded.extra_embeds) == 1
    # every table trained: with zero noise E_2 started as the backbone's E_1 (frozen tables still drop the loss)
    start = LlamaForCausalLM.from_pretrained(tmp_path / "llama").get_input_embeddings().weight
    for s, table in enumerate(reloaded.embeddings(), 1):
        assert (table.weight - start).abs().max() > 1e-3, f"E_{s} did not train"


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
        train={"seq_len": 16, "batch_size": 4, "max_steps": 8, "val_every": 4, "ckpt_every": 4,
               "val_tokens": 256, "optimizer": {"lr": 3e-3}})


def test_an_interrupted_cell_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    """fit_cell killed after its step-4 checkpoint, then rerun: it trains only steps 5..8 and ends with the
    uninterrupted run's losses, curve and weights (extra tables included); a changed backbone is a new config
    hash, so its checkpoint would not be resumed."""
    from scalelab.train import hidden_decoding as hdt

    llama(layers=2).save_pretrained(tmp_path / "llama")
    _write_shards(tmp_path / "tokens")
    cfg, shards = _resume_cfg(tmp_path / "llama"), tmp_path / "tokens"
    straight = hdt.fit_cell(cfg, "n2", 0, tmp_path / "straight", shards)
    starts = []

    class Counting(hdt.StepCheckpoint):  # the cell's own checkpoint callback, counting steps and crashing on cue
        crash_at = 4

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if pl_module.step == self.crash_at:
                raise RuntimeError("killed")
            starts.append(pl_module.step)

    monkeypatch.setattr(hdt, "StepCheckpoint", Counting)
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

    chash = hdt.config_hash(cfg, "n2", 0, 8, shards)
    llama(layers=2, seed=1).save_pretrained(tmp_path / "llama")  # same config, other weights
    assert hdt.config_hash(cfg, "n2", 0, 8, shards) != chash


# ------------------------------------------------------------------ the summary's comparisons and claims
def test_summary_pairs_cells_by_role_and_seed(tmp_path):
    from scalelab.analysis import hidden_decoding as hdr

    cfg = HiddenDecodingConfig(
        cells={"n1": {}, "n2": {"n_streams": 2}, "n4": {"n_streams": 4},
               "n4full": {"n_streams": 4, "attention": "full"},
               "c2": {"flops_of": {"n_streams": 2}}, "c4": {"flops_of": {"n_streams": 4}}},
        grid=["n1", "n2", "n4", "n4full", "c2", "c4"], seeds=[0, 1, 2])
    assert hdr.roles(cfg) == {"base": {1: "n1", 2: "n2", 4: "n4"}, "full": {4: "n4full"}, "control": {2: "c2", 4: "c4"}}
    # n = 2 helps by 0.10 and n = 4 by 0.05 at equal tokens; at equal FLOPs the controls close most of it, and
    # n = 4 falls behind its control; SFA is 0.001 worse than full. Seed offsets cancel in the pairing.
    loss = {"n1": 3.0, "n2": 2.9, "n4": 2.95, "n4full": 2.949, "c2": 2.92, "c4": 2.9}
    for cell, value in loss.items():
        for seed in cfg.seeds:
            jitter = 0.001 * np.random.default_rng([seed, *map(ord, cell)]).standard_normal()  # per cell and seed
            (tmp_path / f"{cell}-{seed}.json").write_text(json.dumps({"val_loss": value + 0.3 * seed + jitter}))
    cmp = hdr.comparisons(hdr.collect(tmp_path, cfg), cfg)
    assert cmp["gain_tokens"][2] == pytest.approx([0.1] * 3, abs=0.003)
    verdicts = {c["id"]: c["verdict"] for c in hdr.claims(cmp, margin=0.02)}
    assert verdicts == {"C.gain.tokens.n2": "reproduced", "C.gain.tokens.n4": "reproduced",
                        "C.grows.tokens.n2-n4": "contradicted", "C.gain.flops.n2": "reproduced",
                        "C.gain.flops.n4": "contradicted", "C.grows.flops.n2-n4": "contradicted",
                        "C.sfa.n4": "reproduced"}
    (tmp_path / "c4-1.json").unlink()
    with pytest.raises(ValueError, match="c4-1.json: missing"):
        hdr.collect(tmp_path, cfg)


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
    from scalelab.train import hidden_decoding as hdt

    real = hdt.claim_ckpt_dir
    monkeypatch.setattr(hdt, "claim_ckpt_dir", lambda *a, **k: real(*a, **k) and None)


@mutant("hd-hash-ignores-backbone")  # the backbone's files left out of the config hash
def _(monkeypatch):
    from scalelab.train import hidden_decoding as hdt

    monkeypatch.setattr(hdt, "source_digest", lambda location: location)


T = "tests/test_hidden_decoding.py::"
CAUGHT = [
    ("hd-tables-frozen", f"{T}test_a_local_llama_continues_training"),
    ("hd-tables-not-copied", f"{T}test_tables_start_as_exact_copies_of_the_backbones_embedding"),
    ("hd-resume-ignored", f"{T}test_an_interrupted_cell_resumes_to_the_uninterrupted_result"),
    ("hd-hash-ignores-backbone", f"{T}test_an_interrupted_cell_resumes_to_the_uninterrupted_result"),
]


test_a_broken_hidden_decoding_is_caught = mutation_checks(CAUGHT)

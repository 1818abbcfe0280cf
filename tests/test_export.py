"""Exports: folded Llama/Qwen3 checkpoints load in transformers with equal logits;
MoE and post-norm models round-trip through scalelab's own format; every dense Pre-Norm pretrain cell writes its
export to data/pretrain/<cell>/model/hf."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from scalelab.config import ModelConfig, MoEConfig, ScaleConfig
from scalelab.model import Transformer, export_hf, load_exported, save_model
from scalelab.model.export import export_cell, hf_exportable
from scalelab.runtime import yamlio

VARIANTS = {
    "none": ScaleConfig(scales=False),
    "standard": ScaleConfig(),
    "unified": ScaleConfig(branch=True, placement=True, magdir=True, wd_input_scales=True),
}


def micro(variant: str, **kw) -> ModelConfig:
    base = dict(vocab_size=64, n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=32,
                qk_norm=True, post_norm=False, scale=VARIANTS[variant], rope_theta=500.0, norm_eps=1e-5)
    return ModelConfig(**{**base, **kw})


def random_model(cfg: ModelConfig) -> Transformer:
    """A model whose every scale parameter is random (not 1), so folding has work to do."""
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if model.param_kind(name).endswith("_scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    return model


def tokens() -> torch.Tensor:
    return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))


def hf_logits(path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        return hf(tokens()).logits


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:40])
    tok.train_from_iterator(["to be or not to be", "that is the question"] * 20, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize("qk_norm,arch", [(False, "llama"), (True, "qwen3")])
@pytest.mark.parametrize("variant", ["standard", "unified", "none"])
def test_hf_export_loads_in_transformers_with_equal_logits(tmp_path, variant, qk_norm, arch):
    model = random_model(micro(variant, qk_norm=qk_norm))
    assert export_hf(model, tmp_path) == arch
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == arch and config["rms_norm_eps"] == 1e-5 and config["head_dim"] == 8
    assert config["rope_parameters"]["rope_theta"] == 500.0 and config["num_key_value_heads"] == 2
    weights = load_file(str(tmp_path / "model.safetensors"))
    for i in range(2):  # input-norm γ folded away; QK-norm γ exported at their effective value
        assert torch.equal(weights[f"model.layers.{i}.input_layernorm.weight"], torch.ones(32))
        assert torch.equal(weights[f"model.layers.{i}.post_attention_layernorm.weight"], torch.ones(32))
        if qk_norm:
            q_gamma = model.blocks[i].attn.q_scale() if variant != "none" else torch.ones(8)
            torch.testing.assert_close(weights[f"model.layers.{i}.self_attn.q_norm.weight"], q_gamma.detach())
    assert torch.equal(weights["model.norm.weight"], torch.ones(32))
    with torch.no_grad():
        ours = model(tokens()).logits
    torch.testing.assert_close(hf_logits(tmp_path), ours, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant,tied", [("standard", True), ("unified", False)])
def test_tied_head_stays_tied_unless_a_final_gamma_is_folded(tmp_path, variant, tied):
    model = random_model(micro(variant, qk_norm=False, tie_embeddings=True))
    if variant == "standard":
        with torch.no_grad():
            model.final_scale.weight.fill_(1.0)  # nothing to fold into the head
    export_hf(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is tied
    assert ("lm_head.weight" in load_file(str(tmp_path / "model.safetensors"))) is not tied
    with torch.no_grad():
        ours = model(tokens()).logits
    torch.testing.assert_close(hf_logits(tmp_path), ours, atol=1e-4, rtol=0)


def test_tokenizer_is_saved_with_its_eos(tmp_path, tokenizer_file):
    from transformers import AutoTokenizer

    export_hf(random_model(micro("unified")), tmp_path, tokenizer_path=tokenizer_file)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    eos_id = Tokenizer.from_file(str(tokenizer_file)).token_to_id("<|endoftext|>")
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == eos_id
    assert json.loads((tmp_path / "config.json").read_text())["eos_token_id"] == eos_id
    assert tok("to be")["input_ids"] == Tokenizer.from_file(str(tokenizer_file)).encode("to be").ids


def test_bad_tokenizer_is_refused(tmp_path, tokenizer_file):
    model = random_model(micro("standard"))
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        export_hf(model, tmp_path / "a", tokenizer_path=tmp_path / "missing.json")
    with pytest.raises(ValueError, match="no eos token"):
        export_hf(model, tmp_path / "b", tokenizer_path=tokenizer_file, eos_token="<eos>")
    with pytest.raises(ValueError, match="more than the model's vocab_size"):
        export_hf(random_model(micro("standard", vocab_size=32)), tmp_path / "c", tokenizer_path=tokenizer_file)


@pytest.mark.parametrize("moe,post_norm", [(True, True), (True, False), (False, True)])
def test_moe_and_post_norm_export_to_the_own_format(tmp_path, moe, post_norm):
    moe_cfg = MoEConfig(n_experts=4, top_k=2, shared_expert=True) if moe else None
    cfg = micro("unified", post_norm=post_norm, moe=moe_cfg)
    model = random_model(cfg)
    assert export_hf(model, tmp_path) == "scalelab"
    assert not (tmp_path / "config.json").exists()
    loaded = load_exported(tmp_path)
    assert loaded.cfg.scale == ScaleConfig() and loaded.cfg.moe == cfg.moe  # folded: the standard variant
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens()).logits, model(tokens()).logits, atol=1e-5, rtol=0)


def test_save_model_round_trips_any_variant(tmp_path):
    cfg = micro("unified", post_norm=True, tie_embeddings=True, moe=MoEConfig(n_experts=3, top_k=1))
    model = random_model(cfg)
    save_model(model, tmp_path)
    loaded = load_exported(tmp_path)
    assert loaded.cfg == cfg
    assert loaded.lm_head.weight is loaded.embed.weight  # still tied
    for (name, p), (name2, q) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name2 and torch.equal(p, q)
    with torch.no_grad():
        assert torch.equal(loaded(tokens()).logits, model(tokens()).logits)


def test_load_exported_refuses_what_is_not_its_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="scalelab_config.json"):
        load_exported(tmp_path)
    save_model(random_model(micro("standard")), tmp_path)
    meta = json.loads((tmp_path / "scalelab_config.json").read_text())
    (tmp_path / "scalelab_config.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        load_exported(tmp_path)
    save_model(random_model(micro("standard", n_layer=3)), tmp_path / "other")
    (tmp_path / "scalelab_config.json").write_text((tmp_path / "other" / "scalelab_config.json").read_text())
    with pytest.raises(RuntimeError, match="blocks.2"):  # weights of 2 layers under a 3-layer config
        load_exported(tmp_path)


@pytest.mark.parametrize("qk_norm,arch", [(True, "qwen3"), (False, "llama")])
def test_export_cell_writes_a_loadable_hf_folder_beside_the_weights(tmp_path, tokenizer_file, qk_norm, arch):
    """A trained cell's model/ (scalelab's format) gains model/hf: what method stages load through
    scalelab.model.hf, with the tokenizer, and with the trained model's logits."""
    from scalelab.model.hf import load_causal_lm, load_hf_tokenizer

    model = random_model(micro("unified", qk_norm=qk_norm))
    save_model(model, tmp_path / "model")
    assert export_cell(tmp_path / "model", tokenizer_file) == arch
    hf = tmp_path / "model" / "hf"
    with torch.no_grad():
        torch.testing.assert_close(load_causal_lm(hf)(tokens()).logits, model(tokens()).logits, atol=1e-4, rtol=0)
    assert load_hf_tokenizer(hf).eos_token == "<|endoftext|>"
    assert not [p for p in (tmp_path / "model").iterdir() if p.name.startswith(".")]  # no temp folder left


@pytest.mark.parametrize("moe,post_norm", [(True, False), (False, True)])
def test_export_cell_skips_what_llama_and_qwen3_cannot_represent(tmp_path, tokenizer_file, moe, post_norm):
    cfg = micro("standard", post_norm=post_norm, moe=MoEConfig(n_experts=2, top_k=1) if moe else None)
    save_model(random_model(cfg), tmp_path / "model")
    assert not hf_exportable(cfg) and export_cell(tmp_path / "model", tokenizer_file) is None
    assert not (tmp_path / "model" / "hf").exists()


def _tiny_shards(out, vocab: int = 64) -> None:
    from scalelab.data.shards import file_sha256

    out.mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = {}
    for split, n in (("train", 8000), ("val", 1000)):
        path = out / f"{split}.bin"
        rng.integers(0, 60, n).astype(np.uint16).tofile(path)
        entries[split] = {"file": path.name, "tokens": n, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    meta = {"dtype": "uint16", "vocab_size": vocab, "eot_id": 0, "tokenizer_sha256": "none", "shards": entries}
    (out / "meta.json").write_text(json.dumps(meta))


def test_pretrain_stage_writes_the_cells_hf_export(tmp_path, tokenizer_file, monkeypatch):
    """stages/pretrain.py on a dense Pre-Norm cell: model/hf loads in transformers and gives the trained model's
    logits; the Peri-LN recipe's cell has no hf/ (its post-branch norm has no Llama/Qwen3 slot)."""
    import argparse
    import importlib.util


    from conftest import MICRO, ROOT
    from scalelab.config import parse_params
    from scalelab.model.hf import load_causal_lm

    raw = yamlio.safe_load(MICRO.read_text())
    raw["pretrain"].update(max_steps=4, val_every=4, ckpt_every=4, gamma_every=4)
    raw["pretrain"]["sharpness"]["enabled"] = False
    params = parse_params(raw)
    monkeypatch.chdir(tmp_path)
    _tiny_shards(tmp_path / "data" / "tokens")
    (tmp_path / "data" / "tokenizer").mkdir()
    (tmp_path / "data" / "tokenizer" / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    spec = importlib.util.spec_from_file_location("pretrain_stage", ROOT / "stages" / "pretrain.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    for recipe in ("base", "peri_ln"):
        stage.train(params, argparse.Namespace(variant="unified", size="a", recipe=recipe, seed=0))
    cell = tmp_path / "data/pretrain/unified-a-base-0/model"
    assert json.loads((tmp_path / "metrics/pretrain/unified-a-base-0.json").read_text())["hf_export"] == "qwen3"
    trained = load_exported(cell)
    x = torch.randint(0, 60, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(load_causal_lm(cell / "hf")(x).logits, trained(x).logits, atol=1e-4, rtol=0)
    assert not (tmp_path / "data/pretrain/unified-a-peri_ln-0/model/hf").exists()
    assert load_exported(tmp_path / "data/pretrain/unified-a-peri_ln-0/model").cfg.post_norm

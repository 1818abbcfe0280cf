"""Hidden Decoding models in and out: built on a backbone from a ModelSource, saved as Hugging Face
safetensors plus the extra embedding tables and the stream config.

A saved folder holds the backbone's weights as its Hugging Face checkpoint wrote them (E_1 as its `embed_tokens`)
with two files beside them:
    hidden_decoding.safetensors   E_2..E_n as `extra_embeds.<k>.weight` (and a gated start's α_ℓ as `mix_gates.<k>`)
    hidden_decoding.json          {"format", "format_version", "model": n_streams, attention, mixing layers, ...,
                                   "backbone": the backbone's own config.json}
and a config.json of its own (model_type `scalelab_hidden_decoding`, naming `load_hidden_decoding`): transformers
refuses the folder ("does not recognize this architecture") instead of silently loading the plain backbone and
dropping the extra tables and the streams.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from scalelab.config import HiddenDecodingModelConfig, ModelSource
from scalelab.config.hidden_decoding import RandomSource
from scalelab.model.hf import DTYPES, load_causal_lm, load_hf_config
from scalelab.hidden_decoding.model import HiddenDecodingLM

FORMAT, FORMAT_VERSION = "scalelab-hidden-decoding", 2
MODEL_TYPE = "scalelab_hidden_decoding"
CONFIG_NAME, WEIGHTS_NAME = "hidden_decoding.json", "hidden_decoding.safetensors"


def backbone_config(source: ModelSource | RandomSource, vocab_size: int | None = None):
    """The backbone's Hugging Face config without loading weights: a random source's Llama (untied, its vocabulary
    `vocab_size`, the corpus's), else the source's own config.json (scalelab.model.hf.ModelLoadError if unreadable)."""
    if not isinstance(source, RandomSource):
        return load_hf_config(source.location())
    from transformers import LlamaConfig

    if vocab_size is None:
        raise ValueError("a random backbone's vocabulary is its corpus's: pass vocab_size")
    s = source.init
    return LlamaConfig(vocab_size=vocab_size, hidden_size=s.d_model, intermediate_size=s.d_ff,
                       num_hidden_layers=s.n_layer, num_attention_heads=s.n_head,
                       num_key_value_heads=s.n_kv_head or s.n_head, rope_theta=s.rope_theta,
                       tie_word_embeddings=False)


def from_source(source: ModelSource | RandomSource, cfg: HiddenDecodingModelConfig,
                device: str | torch.device = "cpu", vocab_size: int | None = None) -> HiddenDecodingLM:
    """An n-stream model on a fresh backbone: a pretrain cell's Hugging Face export, a Llama/Qwen3 folder or hub id
    (safetensors, no remote code), or a random Llama (`backbone_config`) drawn from torch's RNG, which the caller
    seeds. The extra tables start as copies of the backbone's (torch's RNG draws the noise, after the backbone)."""
    if isinstance(source, RandomSource):
        from transformers import LlamaForCausalLM

        backbone = LlamaForCausalLM(backbone_config(source, vocab_size)).to(device).eval()
    else:
        backbone = load_causal_lm(source.location(), source.dtype, device)
    return HiddenDecodingLM(backbone, cfg)


def save_hidden_decoding(model: HiddenDecodingLM, out_dir: str | os.PathLike, tokenizer=None) -> None:
    """Write the backbone (Hugging Face format), the extra tables and the stream config; the tokenizer when given."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:  # first: its files must not depend on config.json's model type
        tokenizer.save_pretrained(out_dir)
    model.backbone.save_pretrained(out_dir, safe_serialization=True)
    tables = {f"extra_embeds.{k}.weight": t.weight.detach().contiguous() for k, t in enumerate(model.extra_embeds)}
    tables |= {f"mix_gates.{k}": g.detach().contiguous() for k, g in enumerate(model.mix_gates)}
    save_file(tables, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": model.cfg.model_dump(mode="json"),
            "mixing_layers": sorted(model.mixing_layers),  # as resolved for this backbone
            "local_layers": sorted(model.local_layers),
            "backbone": json.loads((out_dir / "config.json").read_text())}
    (out_dir / CONFIG_NAME).write_text(json.dumps(meta, indent=2) + "\n")
    (out_dir / "config.json").write_text(json.dumps(
        {"model_type": MODEL_TYPE, "architectures": ["HiddenDecodingLM"],
         "note": f"{model.n}-stream Hidden Decoding model: load with "
                 "scalelab.hidden_decoding.io.load_hidden_decoding (the backbone's config is in "
                 f"{CONFIG_NAME})"}, indent=2) + "\n")


def load_hidden_decoding(path: str | os.PathLike, dtype: str = "float32",
                         device: str | torch.device = "cpu") -> HiddenDecodingLM:
    """Rebuild a model written by `save_hidden_decoding` (weights only; every table must be there)."""
    path = Path(path)
    if not (path / CONFIG_NAME).is_file() or not (path / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"{path}: needs {CONFIG_NAME} and {WEIGHTS_NAME} beside the Hugging Face files "
                                "(a folder written by save_hidden_decoding)")
    meta = json.loads((path / CONFIG_NAME).read_text())
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path / CONFIG_NAME}: format {meta.get('format')!r} version {meta.get('format_version')!r}, "
                         f"expected {FORMAT!r} version {FORMAT_VERSION}")
    cfg = HiddenDecodingModelConfig.model_validate(meta["model"])
    backbone = dict(meta["backbone"])
    config = AutoConfig.for_model(backbone.pop("model_type"), **backbone)  # config.json is the HD model's own
    weights = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=DTYPES[dtype], use_safetensors=True,
                                                   local_files_only=True, trust_remote_code=False)
    model = HiddenDecodingLM(weights.to(device).eval(), cfg)
    tables = load_file(str(path / WEIGHTS_NAME), device=str(device))
    expected = {f"extra_embeds.{k}.weight" for k in range(len(model.extra_embeds))}
    expected |= {f"mix_gates.{k}" for k in range(len(model.mix_gates))}
    if set(tables) != expected:
        raise ValueError(f"{path / WEIGHTS_NAME}: tables {sorted(tables)}, expected {sorted(expected)}")
    for prefix, module in (("extra_embeds.", model.extra_embeds), ("mix_gates.", model.mix_gates)):
        module.load_state_dict({k.removeprefix(prefix): v for k, v in tables.items() if k.startswith(prefix)},
                               strict=True)
    return model

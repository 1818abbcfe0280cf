"""Exports: fold the input-side scales, then write a plain checkpoint.

Folding is exact because an input-side scale only multiplies the input of a linear map:
    W · diag(γ) · x̂        → γ into the columns of W   (pre-attention/pre-MLP/final γ, branch γ)
    diag(s_out) · W · x    → s_out into the rows of W   (placement)
Output-norm γ (QK-norm, post-branch norm) are capacity and stay, at their effective (after magdir) values.
The result is the `standard` variant with all input-norm γ equal to 1: a Llama checkpoint (Qwen3 with QK-norm) that
`transformers.AutoModelForCausalLM` loads as it is; MoE and post-norm models, which neither architecture covers, use
scalelab's own format (model.safetensors + scalelab_config.json), as `save_model` does for any variant.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from scalelab.config import ModelConfig, ScaleConfig
from scalelab.data import atomic_dir
from scalelab.model.norm import OUTPUT_SCALE, Projection, Scale
from scalelab.model.transformer import Transformer

FORMAT_VERSION = 1
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "scalelab_config.json"
HF_DIR = "hf"  # a pretrain cell's Hugging Face export: data/pretrain/<cell>/model/hf (scalelab.config.CELL_EXPORT)

# our names -> Hugging Face Llama/Qwen3 names, per layer
_HF_LAYER_NAMES = {
    "attn_scale.weight": "input_layernorm.weight",
    "mlp_scale.weight": "post_attention_layernorm.weight",
    "attn.q.weight": "self_attn.q_proj.weight",
    "attn.k.weight": "self_attn.k_proj.weight",
    "attn.v.weight": "self_attn.v_proj.weight",
    "attn.o.weight": "self_attn.o_proj.weight",
    "attn.q_scale.weight": "self_attn.q_norm.weight",
    "attn.k_scale.weight": "self_attn.k_norm.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}


def plain_config(model: Transformer) -> ModelConfig:
    """Config of the folded model: the `standard` variant, untied when a non-trivial final γ had to go into the
    LM head (the tied embedding cannot take it)."""
    cfg = model.cfg
    tied = cfg.tie_embeddings and (model.final_scale is None or bool((model.final_scale() == 1).all()))
    return cfg.model_copy(update={"scale": ScaleConfig(), "tie_embeddings": tied})


@torch.no_grad()
def fold_scales(model: Transformer) -> dict[str, torch.Tensor]:
    """State dict of `Transformer(plain_config(model))` that computes the same logits as `model`."""
    norm_gamma: dict[Projection, torch.Tensor] = {}  # the shared input-norm γ each map reads
    for block in model.blocks:
        for scale, consumer in ((block.attn_scale, block.attn), (block.mlp_scale, block.mlp)):
            if scale is not None:
                norm_gamma.update((p, scale()) for p in consumer.input_projections())
    if model.final_scale is not None:
        norm_gamma[model.lm_head] = model.final_scale()

    like = model.embed.weight
    modules = dict(model.named_modules())
    with torch.device("meta"):
        plain = Transformer(plain_config(model))
    state = {}
    for name, ref in plain.state_dict().items():
        src = modules.get(name.rsplit(".", 1)[0])
        if isinstance(src, Projection):
            w = src.effective_weight()  # own s_in (columns) and s_out (rows)
            value = w * norm_gamma[src] if src in norm_gamma else w  # shared γ into the columns
        elif isinstance(src, nn.Embedding):
            value = src.weight
        elif isinstance(src, Scale) and src.kind == OUTPUT_SCALE:
            value = src()
        else:  # an input-norm γ (now folded) or a γ the `none` variant never had: 1
            value = torch.ones(ref.shape, dtype=like.dtype, device=like.device)
        state[name] = value.detach().clone().contiguous()
    return state


def _write_own(cfg: ModelConfig, state: dict[str, torch.Tensor], out_dir: Path) -> None:
    if cfg.tie_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}  # safetensors refuses shared storage
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(out_dir / WEIGHTS_NAME),
              metadata={"format": "pt"})
    meta = {"format": "scalelab", "format_version": FORMAT_VERSION, "model_config": cfg.model_dump(mode="json")}
    (out_dir / CONFIG_NAME).write_text(json.dumps(meta, indent=2))


def save_model(model: Transformer, out_dir: str | os.PathLike) -> None:
    """Write any variant, unfolded, in scalelab's own format (model.safetensors + scalelab_config.json)."""
    _write_own(model.cfg, model.state_dict(), Path(out_dir))


def load_exported(out_dir: str | os.PathLike, device: str | torch.device = "cpu") -> Transformer:
    """Rebuild a `Transformer` from scalelab's own format (weights only, every tensor must match)."""
    out_dir = Path(out_dir)
    if not (out_dir / CONFIG_NAME).is_file() or not (out_dir / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(
            f"{out_dir}: needs {CONFIG_NAME} and {WEIGHTS_NAME} (scalelab's own format); Llama/Qwen3 exports "
            "load with transformers.AutoModelForCausalLM.from_pretrained")
    meta = json.loads((out_dir / CONFIG_NAME).read_text())
    if meta.get("format") != "scalelab" or meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{out_dir / CONFIG_NAME}: format {meta.get('format')!r} version "
                         f"{meta.get('format_version')!r}, expected 'scalelab' version {FORMAT_VERSION}")
    cfg = ModelConfig.model_validate(meta["model_config"])
    state = load_file(str(out_dir / WEIGHTS_NAME), device=str(device))
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["embed.weight"]
    model = Transformer(cfg).to(device)
    model.load_state_dict(state, strict=True)
    return model


def _hf_state_dict(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = dict(state)
    out = {"model.embed_tokens.weight": state.pop("embed.weight"), "model.norm.weight": state.pop("final_scale.weight")}
    lm_head = state.pop("lm_head.weight")
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = lm_head
    for i in range(cfg.n_layer):
        for ours, theirs in _HF_LAYER_NAMES.items():
            if f"blocks.{i}.{ours}" in state:
                out[f"model.layers.{i}.{theirs}"] = state.pop(f"blocks.{i}.{ours}")
    if state:
        raise ValueError(f"no Hugging Face name for {sorted(state)}")
    return out


def _hf_config(cfg: ModelConfig, dtype: torch.dtype, eos_token_id: int | None):
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, hidden_act="silu", max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, initializer_range=cfg.init_std,
        bos_token_id=None, eos_token_id=eos_token_id, dtype=str(dtype).removeprefix("torch."),
    )
    if cfg.qk_norm:
        return Qwen3Config(**common, use_sliding_window=False, architectures=["Qwen3ForCausalLM"])
    return LlamaConfig(**common, mlp_bias=False, architectures=["LlamaForCausalLM"])


def _save_tokenizer(path: str | os.PathLike, out_dir: Path, eos_token: str, vocab_size: int) -> int:
    """Save tokenizer.json as a PreTrainedTokenizerFast next to the weights; returns the eos id."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if not Path(path).is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    eos_id = Tokenizer.from_file(str(path)).token_to_id(eos_token)
    if eos_id is None:
        raise ValueError(f"{path}: has no eos token {eos_token!r}")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=eos_token)
    if len(tok) > vocab_size:
        raise ValueError(f"{path}: {len(tok)} tokens, more than the model's vocab_size {vocab_size}")
    tok.save_pretrained(out_dir)
    return eos_id


def hf_exportable(cfg: ModelConfig) -> bool:
    """Whether Llama/Qwen3 represent the folded model: dense, without a post-branch norm (Peri-LN has no slot)."""
    return cfg.moe is None and not cfg.post_norm


def export_cell(model_dir: str | os.PathLike, tokenizer_path: str | os.PathLike,
                eos_token: str = "<|endoftext|>") -> str | None:
    """Write the folded Hugging Face export of a trained cell (its weights in scalelab's format in `model_dir`) to
    `model_dir/hf`, all or nothing; returns its architecture, or None (nothing written) for MoE or Peri-LN cells,
    which stay in scalelab's own format only."""
    model = load_exported(model_dir)
    if not hf_exportable(model.cfg):
        return None
    with atomic_dir(Path(model_dir) / HF_DIR) as tmp:
        return export_hf(model, tmp, tokenizer_path=tokenizer_path, eos_token=eos_token)


def export_hf(model: Transformer, out_dir: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None,
              eos_token: str = "<|endoftext|>") -> str:
    """Fold the scales and write a checkpoint that loads as it is: "llama" (LlamaForCausalLM), "qwen3"
    (Qwen3ForCausalLM, with QK-norm) or "scalelab" (own format, for MoE or post-norm); returns which.
    With `tokenizer_path` (a tokenizer.json) the tokenizer is saved alongside, `eos_token` as its eos."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg, state = plain_config(model), fold_scales(model)
    eos_id = None
    if tokenizer_path is not None:
        eos_id = _save_tokenizer(tokenizer_path, out_dir, eos_token, cfg.vocab_size)
    if cfg.moe is not None or cfg.post_norm:
        _write_own(cfg, state, out_dir)
        return "scalelab"
    hf_cfg = _hf_config(cfg, model.embed.weight.dtype, eos_id)
    save_file(_hf_state_dict(cfg, state), str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})
    hf_cfg.save_pretrained(out_dir)
    return hf_cfg.model_type

"""One interface for every model the evaluation scores: logits for token ids, its tokenizer, its size.

Formats, told apart by the files in the folder:
- `config.json` + safetensors: a Hugging Face causal LM (scalelab's Llama/Qwen3 exports, compressed or continued
  models saved in that format, or any Llama/Qwen-style model on disk), through `scalelab.model.hf` (no remote code);
- `scalelab_config.json`: scalelab's own export (MoE, Peri-LN), rebuilt as a `Transformer`;
- `hidden_decoding.json`: a Hidden Decoding model (its HF backbone plus the extra embedding tables), scored on the
  logits of each token's last stream, as its training loss is.
A stage that writes yet another format adds a loader here (or saves an HF export beside it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from scalelab.data import DataError


@dataclass
class EvalLM:
    """A causal LM under evaluation: `logits(ids [B, T]) -> [B, T, V]` in float32, on `device`.

    `masked`, where the model takes an explicit attention mask and positions (Hugging Face causal LMs), is one forward
    under them with the vocabulary projection only where asked: `masked(ids [B, T], allowed [B, T, T] (bool:
    position i attends to j), position_ids [B, T], rows [N], cols [N]) -> logits [N, V]` at (rows[n], cols[n]).
    The zero-shot tasks use it to score all the continuations of a context in one row (zeroshot._shared_contexts).
    """

    name: str
    path: str
    kind: str  # "hf:<model_type>" or "scalelab"
    forward: Callable[[torch.Tensor], torch.Tensor]
    tokenizer: Any  # a transformers tokenizer: encode(text, add_special_tokens=False), decode(ids)
    max_len: int  # longest sequence the model takes (positions it was configured for)
    n_params: int
    device: torch.device
    module: torch.nn.Module
    masked: Callable[..., torch.Tensor] | None = None

    @torch.inference_mode()
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.forward(ids.to(self.device)).float()

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise DataError("evaluate.device: cuda requested but no CUDA device is available")
    return torch.device(device)


def _tokenizer(folder: Path, fallback: str | os.PathLike | None):
    """The tokenizer saved beside the weights, else `fallback` (a tokenizer.json, e.g. the project's)."""
    from scalelab.model.hf import ModelLoadError, load_hf_tokenizer

    try:
        return load_hf_tokenizer(str(folder))
    except ModelLoadError:
        if fallback is None or not Path(fallback).is_file():
            raise
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_file=str(fallback))


def load_lm(path: str | os.PathLike, name: str, dtype: str = "float32", device: str = "cpu",
            tokenizer_fallback: str | os.PathLike | None = None) -> EvalLM:
    """Load the model folder `path` for evaluation; DataError (one line) when it is missing or unreadable."""
    from scalelab.model.hf import ModelLoadError, load_causal_lm

    folder, dev = Path(path), resolve_device(device)
    if not folder.is_dir():
        raise DataError(f"model {name!r}: no folder {folder} (run the stage that writes it first)")
    config = folder / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("model_type", "").startswith("scalelab_lowrank_"):
        import scalelab.compress  # noqa: F401  registers the low-rank model classes compressed models are saved as
    try:
        tokenizer = _tokenizer(folder, tokenizer_fallback)
        if (folder / "hidden_decoding.json").is_file():  # Hidden Decoding: n streams per token, the last one predicts
            from scalelab.hidden_decoding.io import load_hidden_decoding

            model = load_hidden_decoding(folder, dtype=dtype, device=dev).eval()
            cfg = model.backbone.config
            return EvalLM(name, str(folder), f"hidden_decoding:n={model.n}", lambda ids: model(ids).logits, tokenizer,
                          int(getattr(cfg, "max_position_embeddings", None) or 2048),
                          sum(p.numel() for p in model.parameters()), dev, model)
        if (folder / "scalelab_config.json").is_file():
            from scalelab.model import load_exported

            model = load_exported(folder, device=dev).to(torch.bfloat16 if dtype == "bfloat16" else torch.float32)
            model.eval()
            return EvalLM(name, str(folder), "scalelab", lambda ids: model(ids).logits, tokenizer,
                          model.cfg.max_seq_len, model.num_params(), dev, model)
        model = load_causal_lm(str(folder), dtype=dtype, device=dev)
    except (ModelLoadError, FileNotFoundError, ValueError) as err:
        raise DataError(f"model {name!r} at {folder}: {str(err).splitlines()[0]}") from None
    cfg = model.config
    max_len = getattr(cfg, "max_position_embeddings", None) or 2048
    return EvalLM(name, str(folder), f"hf:{cfg.model_type}", lambda ids: model(input_ids=ids, use_cache=False).logits,
                  tokenizer, int(max_len), sum(p.numel() for p in model.parameters()), dev, model, _hf_masked(model))


def _hf_masked(model) -> Callable[..., torch.Tensor] | None:
    """EvalLM.masked for a `transformers` causal LM: its decoder under a 4-D additive mask (what both its SDPA and
    eager attention take), then its output embedding at the positions asked for. None for a model whose logits are
    more than that projection of the last hidden state (a final soft cap)."""
    if getattr(model.config, "final_logit_softcapping", None):
        return None
    decoder, head = model.base_model, model.get_output_embeddings()

    @torch.inference_mode()
    def masked(ids, allowed, position_ids, rows, cols):
        dev, dtype = model.device, model.dtype
        bias = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed.to(dev),
                                                                                 torch.finfo(dtype).min)
        hidden = decoder(input_ids=ids.to(dev), attention_mask=bias[:, None], position_ids=position_ids.to(dev),
                         use_cache=False).last_hidden_state
        return head(hidden[rows.to(dev), cols.to(dev)]).float()

    return masked

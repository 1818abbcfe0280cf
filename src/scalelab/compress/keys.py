"""Stable identities for reusable compression results: what a stored result was computed from.

A sensitivity table or a map's converged scalings depends on the uncompressed model's weights, the calibration
windows and the settings, never on the process, the cell or the machine that computed it. Each is named here by a
digest of exactly those inputs, so any later process can find it (store.py) and a changed input can never be
mistaken for a stored one:

    model     sha256 over every parameter and buffer of the state dict (name, dtype, shape, bytes; tied weights once)
    tokens    sha256 over the calibration windows' token ids
    key       sha256 of canonical JSON (sorted keys) of a dict of such digests and settings

`map_seed` gives each map its own random stream: a map's initial scalings depend on its name and the seed only, not
on which maps were drawn before it (another allocation, a map left dense, a cell resumed half way).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

import torch
from torch import nn

# Bumped when what a stored result means changes (the optimiser, the probe, the file layout): older files then no
# longer match any key and are recomputed, never read as if they were current.
VERSION = 1


def digest(obj: Mapping) -> str:
    """sha256 hex of the canonical JSON of `obj` (sorted keys, floats as JSON writes them)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _update(h, t: torch.Tensor) -> None:
    t = t.detach()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


@torch.no_grad()
def model_fingerprint(model: nn.Module) -> str:
    """Digest of every tensor of the model's state dict (~0.8 s for SmolLM2-135M's 540 MB on one core)."""
    h, seen = hashlib.sha256(), set()
    for name, t in sorted(model.state_dict(keep_vars=False).items()):
        ptr = (t.data_ptr(), t.dtype, tuple(t.shape))
        h.update(name.encode())
        if ptr in seen:  # a tied weight: its name is hashed, its bytes once
            continue
        seen.add(ptr)
        _update(h, t)
    return h.hexdigest()


def tokens_fingerprint(batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> str:
    """Digest of the input ids of every window, in order (targets are the shifted inputs: not hashed again)."""
    h = hashlib.sha256()
    for x, _ in batches:
        _update(h, x.to(torch.int64))
    return h.hexdigest()


def map_seed(name: str, seed: int) -> int:
    """A 63-bit seed for map `name` under run seed `seed`, the same in every process and on every machine."""
    raw = hashlib.sha256(f"sigmascale-init\0{name}\0{seed}".encode()).digest()
    return int.from_bytes(raw[:8], "little") >> 1


def map_generator(name: str, seed: int) -> torch.Generator:
    """A CPU generator seeded with `map_seed(name, seed)`: one per map, drawn from in a fixed order."""
    return torch.Generator().manual_seed(map_seed(name, seed))


def normal_part(key: Mapping) -> dict:
    """A part's key (cells.part_key) with its settings read through today's schema, so a part written before a
    setting existed matches the key that names the setting at its default, which is what the code did before it
    had the setting (`eval.calib_nll`: the calibration NLL computed; a method's `blocks`: every block compressed).
    A default that changes must bump VERSION: a part written under the old one would read as the new."""
    from scalelab.config.compress import AllocationConfig, EvalConfig, MethodConfig, RefineConfig, SigmaScaleConfig

    out = dict(key)
    for name, model in (("method", MethodConfig), ("eval", EvalConfig), ("sigmascale", SigmaScaleConfig),
                        ("allocation", AllocationConfig), ("refine", RefineConfig)):
        if isinstance(out.get(name), Mapping):
            out[name] = model.model_validate(out[name]).model_dump(mode="json")
    return out

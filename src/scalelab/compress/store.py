"""A folder of reusable compression results: sensitivity tables, converged SigmaScale scalings, finished cell parts.

Each is expensive (the probe: a forward pass per map and candidate; a map's scalings: up to 1000 eigendecompositions;
a part: its factorization and an evaluation) and each depends only on inputs that keys.py names: so any process, cell, slice of a study or machine that needs one
with the same key reads it instead of recomputing. A study commits the folder beside its cells.

    <folder>/sensitivity/<key digest>.json          {"key", "table": {map: {ratio: NLL}}, "seconds", "tokens"}
    <folder>/parts/<key digest>.json                {"key", "metrics", "maps"}: one (method, ρ) part of a seed's cell
    <folder>/scalings/<context digest>/<map>.r<rank>.safetensors
                                                    d_r, d_c (float32) + metadata {"key", "info"} (stop, steps, loss)

A part is what a seed's cell computed for one method and kept fraction (its metrics and per-map rows), keyed by the
model, the calibration and evaluation windows and the settings it read: a cell stopped by a study's deadline and run
again skips the parts it finished. A map's file is keyed by (map, rank) within its context: the model, the
calibration windows, the seed and the SigmaScale settings. Every cell of a seed with the same settings shares one context folder, so a cell with another
allocation or kept fraction reuses each map whose rank it shares. The full key is stored in each file and compared on
reading: a file whose key differs is a miss, never a silent reuse. Writes go to a temporary name first and are then
renamed, so a reader never sees half a file (two processes may write the same file: both write the same bytes).
SmolLM2-135M: 210 maps, Σ(m+n) = 305k scalings, 1.2 MB of float32 per context and rank set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from scalelab.compress import keys


class MissingScalings(LookupError):
    """A frozen store (Store.frozen) lacks a SigmaScale map's scalings: the run would have to optimise it."""


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


class Store:
    """The results folder at `folder` (created on first write); counts its hits, misses and writes. `frozen`: its
    SigmaScale scalings are all a run may use: a map it lacks is an error (MissingScalings), never optimised here
    (a cell evaluated from stored answers only, steps.py)."""

    def __init__(self, folder: str | os.PathLike, *, frozen: bool = False) -> None:
        self.folder = Path(folder)
        self.frozen = frozen
        self.hits = self.misses = self.writes = 0

    # ------------------------------------------------------------ sensitivity tables
    def _sensitivity_path(self, key: dict) -> Path:
        return self.folder / "sensitivity" / f"{keys.digest(key)[:20]}.json"

    def get_sensitivity(self, key: dict) -> tuple[dict[str, dict[float, float]], float] | None:
        """(table, seconds the probe took) stored under `key`, or None."""
        path = self._sensitivity_path(key)
        if not path.is_file():
            self.misses += 1
            return None
        raw = json.loads(path.read_text())
        if raw.get("key") != key:
            self.misses += 1
            return None
        self.hits += 1
        table = {name: {float(r): float(v) for r, v in row.items()} for name, row in raw["table"].items()}
        return table, float(raw.get("seconds", 0.0))

    def put_sensitivity(self, key: dict, table: dict[str, dict[float, float]], *, seconds: float, tokens: int) -> Path:
        path = self._sensitivity_path(key)
        body = {"key": key, "seconds": seconds, "tokens": tokens,
                "table": {name: {repr(float(r)): v for r, v in sorted(row.items())} for name, row in table.items()}}
        _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(body, indent=1) + "\n"))
        self.writes += 1
        return path

    # ------------------------------------------------------------ finished parts of a cell
    def _part_path(self, key: dict) -> Path:
        return self.folder / "parts" / f"{keys.digest(key)[:20]}.json"

    def get_part(self, key: dict) -> tuple[dict, list[dict]] | None:
        """(metrics, per-map rows) of a (method, ρ) part of a seed's cell stored under `key`, or None. A part written
        before a setting of its key existed sits under another file name: found by its key read through today's
        schema (keys.normal_part), the file name only the first place looked."""
        path = self._part_path(key)
        raw = json.loads(path.read_text()) if path.is_file() else None
        if raw is None or raw.get("key") != key:
            want = keys.normal_part(key)
            raw = next((r for p in sorted((self.folder / "parts").glob("*.json"))
                        if keys.normal_part((r := json.loads(p.read_text()))["key"]) == want), None)
        if raw is None:
            self.misses += 1
            return None
        self.hits += 1
        return raw["metrics"], raw["maps"]

    def put_part(self, key: dict, metrics: dict, maps: list[dict]) -> Path:
        path = self._part_path(key)
        body = json.dumps({"key": key, "metrics": metrics, "maps": maps}, indent=None, default=float) + "\n"
        _atomic_write(path, lambda tmp: tmp.write_text(body))
        self.writes += 1
        return path

    # ------------------------------------------------------------ SigmaScale scalings
    def scalings_path(self, context: dict, name: str, rank: int) -> Path:
        return self.folder / "scalings" / keys.digest(context)[:20] / f"{name}.r{rank}.safetensors"

    def get_scalings(self, context: dict, name: str, rank: int) -> tuple[torch.Tensor, torch.Tensor, dict] | None:
        """(d_r, d_c, info) of map `name` at `rank` in `context`, or None (counted as a miss)."""
        from safetensors import safe_open

        path = self.scalings_path(context, name, rank)
        if not path.is_file():
            self.misses += 1
            return None
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if json.loads(meta.get("key", "null")) != {"context": context, "name": name, "rank": rank}:
                self.misses += 1
                return None
            d_r, d_c = f.get_tensor("d_r"), f.get_tensor("d_c")
        self.hits += 1
        return d_r, d_c, json.loads(meta.get("info", "{}"))

    def put_scalings(self, context: dict, name: str, rank: int, d_r: torch.Tensor, d_c: torch.Tensor,
                     info: dict) -> Path:
        from safetensors.torch import save_file

        path = self.scalings_path(context, name, rank)
        meta = {"key": json.dumps({"context": context, "name": name, "rank": rank}, sort_keys=True),
                "info": json.dumps(info, sort_keys=True)}
        tensors = {"d_r": d_r.detach().float().cpu().contiguous(), "d_c": d_c.detach().float().cpu().contiguous()}
        _atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))
        self.writes += 1
        return path


def parts(folder: str | os.PathLike) -> list[tuple[dict, dict, list[dict]]]:
    """Every finished part in the store at `folder`: (key, metrics, per-map rows), in file order; none without one."""
    out = []
    for p in sorted((Path(folder) / "parts").glob("*.json")):
        raw = json.loads(p.read_text())
        out.append((raw["key"], raw["metrics"], raw["maps"]))
    return out


def progress(folder: str | os.PathLike) -> str:
    """What a store holds, as a study's README shows it (a generated block): its sensitivity tables, its finished
    (method, ρ) parts by seed, and its converged SigmaScale maps by seed and stopping rule."""
    from safetensors import safe_open

    folder = Path(folder)
    tables = sorted((folder / "sensitivity").glob("*.json"))
    seconds = [json.loads(p.read_text()).get("seconds", 0.0) for p in tables]
    parts: dict[str, list[int]] = {}
    for p in sorted((folder / "parts").glob("*.json")):
        m = json.loads(p.read_text())["metrics"]
        parts.setdefault(f"{m['method']} at ρ {m['keep']:g}", []).append(m["seed"])
    maps: dict[tuple[int, str], int] = {}
    for ctx in sorted(d for d in (folder / "scalings").glob("*") if d.is_dir()):
        files = sorted(ctx.glob("*.safetensors"))
        if files:
            with safe_open(str(files[0]), framework="pt") as f:
                context = json.loads((f.metadata() or {})["key"])["context"]
            at = (context["seed"], context["settings"]["stop"])
            maps[at] = maps.get(at, 0) + len(files)
    def seeds(v: list[int]) -> str:
        return ", ".join(f"{s}" + (f" ×{v.count(s)}" if v.count(s) > 1 else "") for s in sorted(set(v)))

    lines = [f"- sensitivity tables: {len(tables)}" + (f" ({sum(seconds) / 60:.1f} min of probing)" if tables else ""),
             "- finished parts: " + ("; ".join(f"{k} (seed {seeds(v)})" for k, v in sorted(parts.items())) or "none"),
             "- converged SigmaScale maps: " + ("; ".join(f"seed {s}, stop {rule}: {n}"
                                                          for (s, rule), n in sorted(maps.items())) or "none")]
    return "\n".join(lines)

"""Params the schema accepts that still cannot run here: what `scalelab check` refuses beyond the schema.

- A name DVC cannot address: dvc.yaml lists a cell's own params as `evaluate.models.${key}`, and DVC reads every dot
  of that key as one more level, so a model named `sigmascale-0.8` is looked up as `evaluate.models.sigmascale` ->
  `0.8` and its stage fails after DVC removed its outs (`Parameters ... are missing from 'params.yaml'`). The keyed
  sections are read from dvc.yaml itself, so a stage added later is covered.
- CUDA asked for on a machine without it (a machine setting: the line to use instead is named).
- A hub dataset the stages would read while the Hugging Face libraries are offline and it is not in their cache.

The first is pure Python (DVC's own process runs it, scalelab.pipeline.check.dvc_preflight); the other two import
torch or datasets only when the params ask for CUDA or name a hub dataset while offline.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.config.base import ParamsError

if TYPE_CHECKING:
    from scalelab.config import Params

# A params entry of dvc.yaml keyed by an interpolated name: `- evaluate.models.${key}` (a path has a slash before it)
KEYED = re.compile(r"^\s*-\s*[\"']?([A-Za-z_]\w*(?:\.\w+)*)\.\$\{", re.M)
TRUE = ("1", "true", "yes", "on")


def keyed_sections(dvc_yaml: Path) -> list[str]:
    """The params sections whose keys dvc.yaml pastes into a params key (`model.sizes`, `optim`, `evaluate.models`);
    none without a dvc.yaml (the library used alone)."""
    if not dvc_yaml.is_file():
        return []
    return sorted(set(KEYED.findall(dvc_yaml.read_text())))


def _section(params: Params, dotted: str):
    node = params
    for part in dotted.split("."):
        node = getattr(node, part, None) if not isinstance(node, dict) else node.get(part)
        if node is None:
            return None
    return node


def check_keys(params: Params, dvc_yaml: Path) -> None:
    """Every name of a keyed section is one DVC can address: no dot in it (ParamsError naming the first)."""
    for dotted in keyed_sections(dvc_yaml):
        names = _section(params, dotted)
        for name in names if isinstance(names, dict) else ():
            if "." in str(name):
                raise ParamsError(
                    f"{dotted}.{name}: a name with a dot, which DVC reads as a nested params key ({dvc_yaml.name} "
                    f"lists `{dotted}.<name>` as a stage's params): name it without dots, e.g. "
                    f"{str(name).replace('.', '_')!r}")


# ---------------------------------------------------------------- CUDA
def cuda_settings(params: Params) -> list[tuple[str, str, str]]:
    """(setting, its value, the CPU value) of each machine setting that needs CUDA."""
    out = []
    for section, key, cpu in (("pretrain", "accelerator", "cpu"), ("hidden_decoding.train", "accelerator", "cpu"),
                              ("evaluate", "device", "cpu"), ("compress", "device", "cpu")):
        value = getattr(_section(params, section), key, None)
        if value in ("cuda", "gpu"):
            out.append((f"{section}.{key}", value, cpu))
    return out


def check_cuda(params: Params, machine_file: Path, available=None) -> None:
    """A setting that needs CUDA on a machine without it: ParamsError with the machine file's line for this machine.
    `available`: torch.cuda.is_available (imported only when a setting asks for CUDA)."""
    if not (need := cuda_settings(params)):
        return
    if available is None:
        import torch

        available = torch.cuda.is_available
    if available():
        return
    setting, value, cpu = need[0]
    line = _flow(setting.split("."), cpu)
    raise ParamsError(f"{setting}: {value}, but this machine has no CUDA device: for a CPU run put `{line}` in "
                      f"{machine_file} (a machine setting: no stage reruns for it)")


def _flow(parts: list[str], value: str) -> str:
    """`a: {b: {c: value}}`: the machine file's line for the setting a.b.c."""
    return f"{parts[0]}: {value}" if len(parts) == 1 else f"{parts[0]}: {{{_flow(parts[1:], value)}}}"


# ---------------------------------------------------------------- hub datasets offline
def offline() -> bool:
    return any(os.environ.get(k, "").lower() in TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_splits(params: Params) -> list[tuple[str, object]]:
    """(setting, HubSplit) of each hub dataset split a stage reads: compress.eval.hub (the papers' WikiText-2)."""
    hub = getattr(getattr(params.compress, "eval", None), "hub", None) if params.compress is not None else None
    return [("compress.eval.hub", hub)] if hub is not None else []


def check_hub_offline(params: Params, readable=None) -> None:
    """Offline, each hub split a stage reads is in the local datasets cache (read as the stage reads it); else
    ParamsError naming it and the two ways out. `readable(split) -> None | str` (the error) replaces the read."""
    if not offline() or not (splits := hub_splits(params)):
        return
    readable = readable or _read_error
    for setting, split in splits:
        if (why := readable(split)) is not None:
            name = f"{split.hub_id}/{split.hub_config}:{split.hub_split}" if split.hub_config else \
                f"{split.hub_id}:{split.hub_split}"
            raise ParamsError(f"{setting}: {name} cannot be read offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set, "
                              f"not in the datasets cache: {why}): drop `hub:` to evaluate on the prepared corpus's "
                              "validation split, or load it once with network access (HF_HUB_OFFLINE=0)")


def _read_error(split) -> str | None:
    """None when `datasets` reads the split from its cache (offline: memory-mapped, no network); else the error."""
    import datasets

    try:
        datasets.load_dataset(split.hub_id, split.hub_config, split=split.hub_split, revision=split.hub_revision)
    except Exception as err:  # offline and not cached, unknown config or split: the stage would fail the same way
        return f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"
    return None

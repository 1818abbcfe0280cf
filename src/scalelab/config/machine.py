"""Machine settings: where and how fast the work runs, kept out of the DVC-tracked params.

Threads, devices, accelerator, torch.compile, peak FLOPs, the DDP strategy and node count, and the evaluate and
compress stages' device and threads decide where a result is computed, not what it is (up to the order of
floating-point sums). As params, moving the same experiment to another machine reran every stage that read them.
They still are fields of the params schema, so the library reads them where it always did (`params.pretrain.threads`),
but their values come from layers that DVC does not track, merged into the params after loading (later wins):

1. the schema's defaults;
2. a `machine:` section of the params file: a profile's defaults (the GPU presets carry `devices: 8`, `compile:
   true`). params.yaml is a dependency of the `validate` stage only, so editing this section reruns that check and
   nothing else;
3. the machine file: $SCALELAB_MACHINE, else `machine.yaml` beside the params file; not committed, not a DVC
   dependency: the settings of this machine;
4. at run time, SCALELAB_THREADS (the flow's share of cores per worker) over every `threads` (placement).

Every file is written as params.yaml's own sections: `pretrain: {threads: 4, compile: true}`. The same keys inline in
params.yaml's sections (or a profile's, on a switch) are refused with one line saying where they go.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from scalelab.config.base import ParamsError
from scalelab.runtime import yamlio

MACHINE_ENV = "SCALELAB_MACHINE"  # a machine file to use instead of machine.yaml beside the params file
MACHINE_FILE = "machine.yaml"
SECTION = "machine"  # a params file's own defaults (a profile's)
TRACKED = "params.yaml"  # the params file DVC reads (dvc.yaml's params): machine keys inline here are refused

# Section path (dots into params) -> its machine keys. Precision, batch and steps change results: they stay params.
MACHINE_KEYS: dict[str, tuple[str, ...]] = {
    "pretrain": ("accelerator", "devices", "strategy", "num_nodes", "compile", "threads", "peak_flops"),
    "evaluate": ("device", "threads"),
    "compress": ("device", "threads"),
    "hidden_decoding.train": ("accelerator", "devices", "num_nodes", "threads", "peak_flops"),
}


def _get(tree: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def machine_keys_in(raw: dict) -> list[str]:
    """The machine settings written inline in the sections of a params dict, as `section.key` paths."""
    found = []
    for section, keys in MACHINE_KEYS.items():
        if isinstance(node := _get(raw, section), dict):
            found += [f"{section}.{k}" for k in keys if k in node]
    return found


def split(raw: dict) -> tuple[dict, dict]:
    """(params without any machine setting, the machine settings as a machine file's sections): what `scalelab
    profile` writes to params.yaml and to the machine file. The input's `machine:` section is merged under its inline
    keys."""
    import copy

    params = copy.deepcopy(raw)
    machine = copy.deepcopy(params.pop(SECTION, None) or {})
    for section, keys in MACHINE_KEYS.items():
        if not isinstance(node := _get(params, section), dict):
            continue
        moved = {k: node.pop(k) for k in keys if k in node}
        if moved:
            target = machine
            for part in section.split("."):
                target = target.setdefault(part, {})
            target.update(moved)
    return params, machine


def validate(machine: Any, source: str, path: str = "") -> dict:
    """A machine mapping holds only machine settings, in params.yaml's section layout (their values are checked by
    the params schema once merged); one line naming the first key that is not one otherwise."""
    if machine is None:
        return {}
    if not isinstance(machine, dict):
        raise ParamsError(f"{source}: {path or 'top level'}: must be a mapping (params.yaml's section layout)")
    for key, node in machine.items():
        dotted = f"{path}.{key}" if path else str(key)
        if dotted in MACHINE_KEYS:
            if not isinstance(node, dict):
                raise ParamsError(f"{source}: {dotted}: must be a mapping of machine settings")
            if bad := [k for k in node if k not in MACHINE_KEYS[dotted]]:
                raise ParamsError(f"{source}: {dotted}.{bad[0]}: not a machine setting; those of {dotted}: "
                                  f"{', '.join(MACHINE_KEYS[dotted])} (the rest are params: params.yaml)")
        elif any(section.startswith(f"{dotted}.") for section in MACHINE_KEYS):
            validate(node, source, dotted)
        else:
            raise ParamsError(f"{source}: {dotted}: not a section with machine settings; those are "
                              f"{', '.join(MACHINE_KEYS)}")
    return machine


def machine_path(params_path: str | os.PathLike) -> Path:
    """The machine file for a params file: $SCALELAB_MACHINE, else machine.yaml beside it."""
    if env := os.environ.get(MACHINE_ENV):
        return Path(env)
    return Path(params_path).resolve().parent / MACHINE_FILE


def read_machine(path: Path) -> dict:
    """The machine file's settings ({} when there is none; $SCALELAB_MACHINE must exist)."""
    if not path.is_file():
        if os.environ.get(MACHINE_ENV):
            raise ParamsError(f"{MACHINE_ENV}={path}: no such machine file")
        return {}
    try:
        raw = yamlio.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: YAML syntax error: {' '.join(str(err).split())}") from None
    return validate(raw, str(path))


def refuse_inline(raw: dict, source: str) -> None:
    """One line when params.yaml (what DVC reads) or a profile on its way there holds machine settings inline."""
    if found := machine_keys_in(raw):
        section, key = found[0].rsplit(".", 1)
        named = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ParamsError(
            f"{source}: {named}: machine settings, not params (as params, another machine reruns every "
            f"stage that reads them): put them in {MACHINE_FILE} (untracked) as `{section}: {{{key}: ...}}`, or in "
            f"the profile's `{SECTION}:` section")


def merge(raw: dict, *layers: dict) -> dict:
    """`raw` with each machine layer's settings set into its sections, later layers winning. A section the params do
    not have (no `compress:` in this profile) stays absent."""
    import copy

    out = copy.deepcopy(raw)
    for layer in layers:
        for section, keys in MACHINE_KEYS.items():
            values = _get(layer, section)
            target = _get(out, section)
            if not isinstance(values, dict) or not isinstance(target, dict):
                continue
            target.update({k: v for k, v in values.items() if k in keys})
    return out


def resolve(raw: dict, source: str, local: dict | None = None) -> dict:
    """`raw` without its `machine:` section, that section's settings and then `local`'s (the machine file's) merged
    into its sections: layers 2 and 3 of the module docstring."""
    raw = dict(raw)
    own = validate(raw.pop(SECTION, None), f"{source}: {SECTION}")
    return merge(raw, own, local or {})


def file_layer(raw: dict, params_path: str | os.PathLike, source: str) -> tuple[dict, str]:
    """The machine file's settings for a params file, and the source to name in errors. Machine settings inline in
    the sections of params.yaml (what DVC tracks) are refused first; other params files (a preset, a file built for
    one library run) may hold them inline, as their own defaults."""
    if Path(params_path).name == TRACKED:
        refuse_inline(raw, source)
    path = machine_path(params_path)
    local = read_machine(path)
    return local, (f"{source} + {path}" if local else source)

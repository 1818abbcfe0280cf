"""Profiles as overlays: a params file may name a `base:` and state only what differs from it.

    # configs/cpu-study.yaml
    base: defaults.yaml           # relative to this file's folder; a base may name a base of its own
    pretrain:
      max_steps: 300              # merged into the base's pretrain section
    compress:
      methods:
        ~svd_llm_sens: null       # `~key`: the base's entry removed (Hydra's override grammar, as `dvc exp run -S`)

Composition is a deep merge, as Hydra composes a config group over its defaults: mappings merge key by key,
recursively; lists and scalars replace the base's value whole. A `~key` (value null) removes the base's `key`, so a
profile whose matrix has fewer cells than its base's (a method, a size, an optimizer left out) can say so; naming a
key the base lacks is an error, so a typo cannot remove nothing silently.

Why a file of its own and not params.yaml as the base: DVC reads params.yaml and nothing else, so params.yaml must be
complete and is the *active* profile, rewritten on every switch (scalelab.pipeline.profile). A base that changed with
each switch would make every overlay mean something different depending on which profile ran last. The stable base is
configs/defaults.yaml (the default profile, complete); params.yaml is the composition of the profile its first line
names, written whole (the default profile byte for byte), and `base:` in params.yaml itself is refused (DVC would see
the overlay's keys only).

`read_yaml` (scalelab.config.params) composes, so every reader of a params file (load_params, a study's profile, the
validate stage) sees the complete params; `complete_text` is the YAML written for DVC, comments of the base and of
the overlay kept where they stand (ruamel's round trip, as DVC edits YAML).
"""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

from scalelab.config.base import ParamsError

BASE = "base"  # the key naming an overlay's base file
REMOVE = "~"  # prefix of a key that removes the base's entry of that name
TRACKED = "params.yaml"  # what DVC reads: never an overlay


def merge(base: dict, overlay: dict, source: str, path: str = "") -> dict:
    """`overlay` deep-merged over `base` (module docstring); neither is changed. `source` and `path` name a bad
    `~key` in the error."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        dotted = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and key.startswith(REMOVE):
            name = key[len(REMOVE):]
            if value is not None:
                raise ParamsError(f"{source}: {dotted}: removes the base's {name!r}, so it takes no value")
            if name not in out:
                raise ParamsError(f"{source}: {dotted}: the base has no {name!r} to remove")
            del out[name]
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value, source, dotted)
        else:
            out[key] = copy.deepcopy(value)
    return out


def chain(path: str | Path, raw: dict) -> list[tuple[Path, dict]]:
    """The files `path` (read as `raw`) composes, from itself down to the first without a base, each with its mapping
    as written. A base is relative to the folder of the file that names it."""
    from scalelab.config.params import read_yaml

    path = Path(path)
    if path.name == TRACKED and BASE in raw:
        raise ParamsError(f"{path}: base: DVC reads {TRACKED} as written, so it holds complete params; put the overlay "
                          f"in configs/ and switch to it (scalelab profile)")
    layers = [(path, raw)]
    while BASE in layers[-1][1]:
        here, mapping = layers[-1]
        named = mapping[BASE]
        if not isinstance(named, str) or not named:
            raise ParamsError(f"{here}: base: must name a params file (relative to {here.parent or '.'})")
        base = here.parent / named
        if any(base.resolve() == p.resolve() for p, _ in layers):
            raise ParamsError(f"{here}: base: {named} composes a cycle ({' -> '.join(str(p) for p, _ in layers)})")
        if not base.is_file():
            raise ParamsError(f"{here}: base: {base} not found")
        layers.append((base, read_yaml(base, compose=False)))
    return layers


def compose(path: str | Path, raw: dict) -> dict:
    """The complete params of `path` (read as `raw`): its bases' merged from the bottom up, `base:` keys dropped."""
    layers = chain(path, raw)
    out: dict = {}
    for here, mapping in reversed(layers):
        out = merge(out, {k: v for k, v in mapping.items() if k != BASE}, str(here))
    return out


def _explicit_null():
    """ruamel's round-trip representer writing None as `null` (as the profiles spell it; its default writes nothing),
    in a class of its own: `add_representer` is a classmethod, so called on YAML().representer it rewrote None for
    every round-trip dump in the process, DVC's dvc.lock among them (`key: null` where DVC writes `key:`)."""
    from ruamel.yaml.representer import RoundTripRepresenter

    cls = type("ExplicitNullRepresenter", (RoundTripRepresenter,), {})
    cls.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    return cls


def _rt_merge(base: Any, overlay: Any) -> None:
    """`overlay` merged into `base` in place, as `merge`, on ruamel's round-trip maps: a replaced or added key takes
    the overlay's comment on its line when it has one."""
    for key in list(overlay):
        value = overlay[key]
        if isinstance(key, str) and key.startswith(REMOVE):
            del base[key[len(REMOVE):]]  # ruamel drops that key's own comment with it
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _rt_merge(base[key], value)
        else:
            base[key] = value
            if key in overlay.ca.items:
                base.ca.items[key] = overlay.ca.items[key]


def complete_text(path: str | Path) -> str:
    """The YAML DVC reads for profile `path`: the composed params (validated by the caller), under a first line naming
    the profile and its bases, with the comments of each file on the keys it sets; a profile without a base as it
    is."""
    from ruamel.yaml import YAML

    from scalelab.config.params import read_yaml

    layers = chain(path, read_yaml(path, compose=False))
    if len(layers) == 1:  # a complete profile is written as it is, byte for byte (the default one, the micro one)
        return Path(path).read_text()
    yml = YAML()  # round trip: comments, quotes and flow/block layout survive
    yml.Representer = _explicit_null()
    yml.preserve_quotes, yml.width = True, 4096  # no re-wrapping inside flow maps (ruamel breaks them mid-entry)
    yml.indent(mapping=2, sequence=4, offset=2)
    docs = [yml.load(here.read_text()) for here, _ in reversed(layers)]
    doc = docs[0]
    for overlay in docs[1:]:
        _rt_merge(doc, overlay)
    doc.pop(BASE, None)
    doc.ca.comment = None  # the bottom file's opening comment describes that file, not this composition
    out = io.StringIO()
    yml.dump(doc, out)
    named = " over ".join(str(here) for here, _ in layers)
    head = (f"# {named}, composed by `scalelab profile` for DVC (src/scalelab/config/profiles.py).\n"
            f"# Edit the profile, not this file: the next switch rewrites it (the previous one: params.yaml.prev).\n")
    return head + out.getvalue()

"""Switch the active profile: `scalelab profile configs/cpu-study.yaml` (or `python -m scalelab.pipeline.profile`).

DVC reads params.yaml, so a profile is a complete params file copied over it, after validation through the schema
(with this machine's machine.yaml merged in, as the stages will see it). The previous params.yaml is kept as
params.yaml.prev, so nothing is lost.

Machine settings (scalelab.config.machine) are no params: a profile carries its own in a `machine:` section, which
travels with it into params.yaml as that profile's defaults; this machine's machine.yaml, untouched by a switch, wins
over them. A profile written before that split, with machine settings inline in its sections, is migrated on the way
in: those keys move to its `machine:` section, comments and layout kept (ruamel's round trip, as DVC edits YAML).
`--migrate` does it to params.yaml in place.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
from pathlib import Path

from scalelab.config import ParamsError, machine, parse_params
from scalelab.config.params import read_yaml

TARGET = Path("params.yaml")


def _explicit_null():
    """ruamel's round-trip representer writing None as `null`, in a class of its own: `add_representer` is a
    classmethod, so called on YAML().representer it rewrote None for every round-trip dump in the process, DVC's
    dvc.lock among them (`key: null` where DVC writes `key:`)."""
    from ruamel.yaml.representer import RoundTripRepresenter

    cls = type("ExplicitNullRepresenter", (RoundTripRepresenter,), {})
    cls.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    return cls


def migrated(text: str) -> str:
    """`text` (a params file) with its inline machine settings moved into its `machine:` section, whose keys win."""
    from ruamel.yaml import YAML

    yml = YAML()  # round trip: comments, quotes and flow/block layout survive
    yml.Representer = _explicit_null()
    yml.preserve_quotes, yml.width = True, 4096  # no re-wrapping inside flow maps
    yml.indent(mapping=2, sequence=4, offset=2)
    doc = yml.load(text)
    own = doc.get(machine.SECTION) or {}
    for section, keys in machine.MACHINE_KEYS.items():
        node, target = doc, own
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not (moved := [k for k in keys if k in node]):
            continue
        for part in section.split("."):
            target = target.setdefault(part, {})
        for key in moved:
            value = node.pop(key)
            target.setdefault(key, value)  # the machine section's own value wins, as when loading
    doc[machine.SECTION] = own
    out = io.StringIO()
    yml.dump(doc, out)
    return out.getvalue()


def switch(profile: Path, target: Path = TARGET) -> list[str]:
    """Validate `profile` (migrated first if it holds machine settings inline) and write it over `target`, keeping
    the old one as .prev; returns the machine settings it moved. Raises ParamsError before touching anything."""
    raw = read_yaml(profile)
    text = profile.read_text()
    if moved := machine.machine_keys_in(raw):
        text = migrated(text)
        import yaml

        raw = yaml.safe_load(text)
    local = machine.read_machine(machine.machine_path(target))
    parse_params(raw, str(profile) + (f" + {machine.machine_path(target)}" if local else ""), local)
    if target.exists():
        shutil.copy2(target, target.with_suffix(".yaml.prev"))
    tmp = target.with_suffix(f".yaml.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)  # whole or not at all
    return moved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalelab profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", nargs="?", type=Path, help="a params file, e.g. configs/cpu-study.yaml")
    ap.add_argument("--migrate", action="store_true",
                    help="move params.yaml's inline machine settings to its machine: section, in place")
    args = ap.parse_args(argv)
    if (args.profile is None) == (not args.migrate):
        print("usage: scalelab profile PROFILE.yaml (e.g. configs/cpu-study.yaml) | scalelab profile --migrate",
              file=sys.stderr)
        return 2
    profile = args.profile or TARGET
    try:
        moved = switch(profile)
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2
    note = f"; moved {', '.join(moved)} to its machine: section" if moved else ""
    print(f"params.yaml now holds {profile} (previous kept as params.yaml.prev){note}; run `scalelab repro`")
    return 0


if __name__ == "__main__":
    sys.exit(main())

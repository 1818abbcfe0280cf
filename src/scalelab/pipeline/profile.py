"""Switch the active profile: `scalelab profile configs/cpu-study.yaml` (or `python -m scalelab.pipeline.profile`).

DVC reads params.yaml, so params.yaml holds complete params. A profile in configs/ is an overlay: it names a `base:`
(configs/defaults.yaml, the default profile, or another profile) and states only what differs from it
(scalelab.config.profiles has the merge rules and why the base is not params.yaml). A switch composes the profile,
validates the result through the schema (with this machine's machine.yaml merged in, as the stages will see it) and
only then writes it over params.yaml whole, the previous params.yaml kept as params.yaml.prev, so nothing is lost.

Machine settings (scalelab.config.machine) are no params: a profile carries its own in a `machine:` section, which
travels with it into params.yaml as that profile's defaults; this machine's machine.yaml, untouched by a switch, wins
over them. The same keys inline in a profile's sections are refused, as in params.yaml.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from scalelab.config import ParamsError, machine, parse_params, profiles
from scalelab.config.params import read_yaml

TARGET = Path("params.yaml")


def switch(profile: Path, target: Path = TARGET) -> None:
    """Compose and validate `profile`, then write it over `target`, keeping the old one as .prev. Raises ParamsError
    before touching anything."""
    raw = read_yaml(profile)
    # the profile would land in params.yaml, where load_params refuses them: say so now, naming the profile
    machine.refuse_inline(raw, str(profile))
    local = machine.read_machine(machine.machine_path(target))
    parse_params(raw, str(profile) + (f" + {machine.machine_path(target)}" if local else ""), local)
    text = profiles.complete_text(profile)
    if target.exists():
        shutil.copy2(target, target.with_suffix(".yaml.prev"))
    tmp = target.with_suffix(f".yaml.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)  # whole or not at all


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalelab profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path, help="a profile, e.g. configs/cpu-study.yaml")
    args = ap.parse_args(argv)
    try:
        switch(args.profile)
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"params.yaml now holds {args.profile}, composed (previous kept as params.yaml.prev); run `scalelab repro`")
    return 0


if __name__ == "__main__":
    sys.exit(main())

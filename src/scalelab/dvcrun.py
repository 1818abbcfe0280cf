"""`dvc` as the flow runs it (issue 6): DVC's own CLI, with dvc.lock read by the fast safe YAML loader when a stage
updates it.

    python -m scalelab.dvcrun repro --single-item pretrain@standard-xs-0      # any dvc command line

DVC rewrites dvc.lock after every stage, reading it first with ruamel's round-trip loader, which keeps comments and
layout for the next dump and is pure Python: with the default DAG's 102 stages (375 kB of dvc.lock) the read took
2.6 s of each stage's ~4.3 s of lock update, under the repo lock, so cells waited on each other. dvc.lock is written
only by DVC and holds no comments; the safe loader (ruamel's C parser) reads it in 0.4 s, and DVC's own dumper writes
the same bytes from the plain data (tests/test_dvcrun.py). dvc.yaml and every other file keep the round-trip loader.
"""

from __future__ import annotations

import os
import sys

LOCKFILE = "dvc.lock"


def patch() -> None:
    """Route DVC's read-for-update of dvc.lock through its safe parser (idempotent)."""
    from dvc.utils.serialize import _yaml

    if getattr(_yaml.parse_yaml_for_update, "scalelab", False):
        return
    round_trip = _yaml.parse_yaml_for_update

    def parse_for_update(text, path):
        if os.path.basename(os.fspath(path)) == LOCKFILE:
            return _yaml.parse_yaml(text, path)  # typ="safe": plain dicts, what DVC's dumper writes back unchanged
        return round_trip(text, path)

    parse_for_update.scalelab = True
    _yaml.parse_yaml_for_update = parse_for_update  # modify_yaml looks it up at call time


def main(argv: list[str] | None = None) -> int:
    patch()
    from dvc.cli import main as dvc_main

    return dvc_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())

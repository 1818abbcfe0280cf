"""Switch the active profile: `python -m scalelab.pipeline.profile configs/cpu-study.yaml`.

DVC reads params.yaml, so a profile is a complete params file copied over it, after validation through the schema.
The previous params.yaml is kept as params.yaml.prev, so nothing is lost.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from scalelab.config import ParamsError, load_params


def switch(profile: Path, target: Path = Path("params.yaml")) -> None:
    load_params(profile)  # refuse an invalid profile before touching anything
    if target.exists():
        shutil.copy2(target, target.with_suffix(".yaml.prev"))
    shutil.copyfile(profile, target)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m scalelab.pipeline.profile PROFILE.yaml  (e.g. configs/cpu-study.yaml)", file=sys.stderr)
        return 2
    try:
        switch(Path(argv[0]))
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"params.yaml now holds {argv[0]} (previous kept as params.yaml.prev); run `make repro`")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

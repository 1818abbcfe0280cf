"""`pip install ARGS` for the Makefile, done by uv when the venv has it (the same resolution as pip's in under half the
time: a newcomer's first `make repro` pays the install), by pip otherwise.

uv does not read pip's configuration, and a machine's indexes, local wheels and constraints live there (an offline
machine's torch wheel, a registry mirror), so they are handed to uv as its own options: every `index-url`,
`extra-index-url`, `find-links` and `constraint` that `pip config list` reports (files and PIP_* variables alike).
With extra indexes, uv is told to pick the best version across all of them, as pip does.

    python tools/install.py -e '.[dev]'
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

OPTIONS = ("index-url", "extra-index-url", "find-links", "constraint")


def pip_options(listing: str | None = None) -> list[str]:
    """uv options equal to pip's configured index, extra indexes, find-links and constraints (`listing`: the output
    of `pip config list`, read from this venv's pip when None)."""
    if listing is None:
        listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                                 text=True).stdout
    found: dict[str, list[str]] = {}
    for line in listing.splitlines():  # e.g. global.find-links='/opt/wheels' or :env:.constraint='a b'
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in OPTIONS:
            for item in " ".join(shlex.split(value)).split():
                if item not in found.setdefault(name, []):
                    found[name].append(item)
    args = [f"--{name}={item}" for name in OPTIONS for item in found.get(name, [])[: 1 if name == "index-url" else None]]
    if found.get("extra-index-url"):
        args.append("--index-strategy=unsafe-best-match")  # pip's rule: the best match over every index
    return args


def main(argv: list[str]) -> int:
    uv = Path(sys.executable).with_name("uv")
    if uv.exists() and os.environ.get("SCALELAB_INSTALLER", "uv") == "uv":
        # --compile-bytecode: as pip does. Without it the first import writes each .pyc, unless PYTHONDONTWRITEBYTECODE
        # is set (it is on CI's machines): then every process compiled every module it imported, which made the test
        # suite 1.6x slower (1438 s against 926 s with pip's install) and every stage of the DAG pay its imports again
        cmd = [str(uv), "pip", "install", "--quiet", "--compile-bytecode", f"--python={sys.executable}", *pip_options(),
               *argv]
    else:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", *argv]
    print("+", shlex.join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

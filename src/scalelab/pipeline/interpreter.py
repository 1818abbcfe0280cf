"""`dvc repro` from any shell runs the project's interpreter (issue 20, item 1).

dvc.yaml's commands call a bare `python`, which the stage's shell looks up on PATH. DVC does not put its own
interpreter there: `.venv/bin/dvc repro` with the venv not activated deleted a stage's outs, then failed with
`python: not found`; with some other `python` first on PATH it would have run an interpreter without scalelab, or
with another copy of it. Two parts:

- The path hook. `make setup` (`python -m scalelab.pipeline.interpreter`) writes a `.pth` file into the venv's
  site-packages. Python runs a `.pth` line that starts with `import` when the venv's interpreter starts (the `site`
  module), so in DVC's own process, started by `.venv/bin/dvc`'s shebang, the venv's bin goes first on PATH: the
  stage shells DVC starts inherit it, and `python` is the venv's, whatever PATH the user's shell had. The line
  imports nothing of scalelab (every process of the venv runs it) and changes nothing outside a venv.
- The guard (`check_project_code`, at every stage's entry and in the `validate` stage): a stage that DVC runs
  (DVC_ROOT set) must run the code DVC hashes, its project's src/scalelab; an interpreter importing a different copy
  (another clone's editable install, a stale site-packages install) stops with one line saying what to do, exit 2,
  before computing anything. `validate` heads the DAG, so when it runs, nothing else has been touched yet.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from scalelab.config import ParamsError

PTH_NAME = "scalelab-venv-path.pth"
# One line, run by `site` at every start of the venv's interpreter: its bin first on PATH, once.
PTH_LINE = ("import os, sys; _b = os.path.join(sys.prefix, 'bin'); _p = os.environ.get('PATH', ''); "
            "sys.prefix != sys.base_prefix and _p.split(os.pathsep)[0] != _b and "
            "os.environ.__setitem__('PATH', _b + os.pathsep + _p)\n")
FIX = "run `make setup` (the venv's PATH hook), activate .venv, or use `scalelab repro`"


class WrongInterpreter(ParamsError):
    """The stage's interpreter runs other code than its project's: exit 2 (deterministic, as a params error)."""


def bin_dir() -> str:
    """This interpreter's bin folder (a venv's bin, where its `python` and `dvc` are)."""
    return os.path.dirname(sys.executable)


def with_bin_first(env: dict[str, str]) -> dict[str, str]:
    """`env` with this interpreter's bin first on PATH: `python` in a stage command is this interpreter."""
    path = env.get("PATH", "")
    if path.split(os.pathsep)[0] != bin_dir():
        env["PATH"] = bin_dir() + (os.pathsep + path if path else "")
    return env


def install(site_packages: str | os.PathLike | None = None) -> Path:
    """Write the path hook into `site_packages` (default: this venv's); refuses outside a venv."""
    if site_packages is None:
        if sys.prefix == sys.base_prefix:
            raise SystemExit(f"scalelab: {sys.executable} is not a venv's interpreter: nothing to hook; stage "
                             "commands run the `python` on PATH (activate the environment that has scalelab)")
        site_packages = sysconfig.get_paths()["purelib"]
    path = Path(site_packages) / PTH_NAME
    path.write_text(PTH_LINE)
    return path


def check_project_code() -> None:
    """Under DVC, the scalelab modules loaded so far must be byte for byte those of DVC_ROOT/src/scalelab (the code
    dvc.yaml hashes as deps); raises WrongInterpreter naming both places otherwise. Outside DVC, or for a project
    without its own src/, nothing to compare."""
    root = os.environ.get("DVC_ROOT")
    if not root or not (project := Path(root).resolve() / "src" / "scalelab").is_dir():
        return
    import scalelab
    from scalelab.pipeline.forkcheck import digest

    here = Path(scalelab.__file__).resolve().parent
    if here == project:
        return
    for name, module in list(sys.modules.items()):
        # scalelab's modules, and a module of it run as __main__ (`python -m scalelab.pipeline.check`: validate)
        if not (f := getattr(module, "__file__", None)) or not (name == "scalelab" or name.startswith("scalelab.")
                                                                or name == "__main__" and _under(f, here)):
            continue
        rel = Path(f).resolve().relative_to(here) if Path(f).resolve().is_relative_to(here) else None
        if rel is None or digest(str(here / rel)) != digest(str(project / rel)):
            raise WrongInterpreter(f"{sys.executable} runs scalelab from {here}, not this project's {project} "
                                   f"({rel or name} differs): {FIX}")


def _under(path: str, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder)


def main(argv: list[str] | None = None) -> int:
    """`python -m scalelab.pipeline.interpreter`: install the path hook into this venv (make setup runs it)."""
    print(f"scalelab: {install()}: DVC run from this venv finds its python first on PATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())

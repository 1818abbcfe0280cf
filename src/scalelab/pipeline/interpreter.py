"""`dvc repro` from any shell runs the project's interpreter, and checks the project's params before DVC acts.

dvc.yaml's commands call a bare `python`, which the stage's shell looks up on PATH. DVC does not put its own
interpreter there: `.venv/bin/dvc repro` with the venv not activated deleted a stage's outs, then failed with
`python: not found`; with some other `python` first on PATH it would have run an interpreter without scalelab, or
with another copy of it. Three parts:

- The path hook. `make setup` (`python -m scalelab.pipeline.interpreter`) writes a `.pth` file into the venv's
  site-packages. Python runs a `.pth` line that starts with `import` when the venv's interpreter starts (the `site`
  module), so in DVC's own process, started by `.venv/bin/dvc`'s shebang, the venv's bin goes first on PATH: the
  stage shells DVC starts inherit it, and `python` is the venv's, whatever PATH the user's shell had. Every process
  of the venv runs the line: outside DVC's CLI it imports nothing, and it changes nothing outside a venv.
- The guard (`check_project_code`, at every stage's entry and in the `validate` stage): a stage that DVC runs
  (DVC_ROOT set) must run the code DVC hashes, its project's src/scalelab; an interpreter importing a different copy
  (another clone's editable install, a stale site-packages install) stops with one line saying what to do, exit 2,
  before computing anything. `validate` heads the DAG, so when it runs, nothing else has been touched yet.
- The params guard. DVC removes a stage's outs right before running its command, and with `dvc repro -s STAGE`, or
  `dvc repro STAGE` of a stage whose upstream is cached, `validate` does not run: a stage that refused a bad param
  had already lost its results. So the same line, in a process that is DVC's CLI (`dvc`, `python -m dvc`,
  `python -m scalelab.pipeline.dvcrun`), hooks DVC's `main`: for `dvc repro` and `dvc exp run` it first checks the
  project's params.yaml (with `exp run`'s `-S` overrides) and machine.yaml (scalelab.pipeline.check.dvc_preflight)
  and, on a bad param, exits 2 (3: a missing input) with one line naming the key, before DVC takes its lock or
  touches a file. Any other command, a project without params.yaml or not run by scalelab, a process that is not
  DVC's: nothing happens. The check imports neither torch nor Lightning, and its verdict is remembered by the hash
  of what it read: an unchanged project costs DVC a few file reads. A `dvc repro` (not `--dry`) that passes then
  starts its stages warm from the second on (scalelab.pipeline.repro_warm). Every command in a scalelab project
  (`dvc status`, `dvc exp run`, a queue's workers, ...) gets the flow's own DVC patches (scalelab.pipeline.dvcrun:
  each YAML text parsed once, dvc.lock read by the safe loader and rewritten by splicing, files written whole):
  a `dvc status` of the default DAG costs a quarter less, a `dvc exp run` of a micro cell 40% less of DVC's CPU.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from pathlib import Path

# This module is imported by the hook in every DVC process: nothing heavy at the top (scalelab.config is 0.4 s).

PTH_NAME = "scalelab-venv-path.pth"
# One line, run by `site` at every start of the venv's interpreter: its bin first on PATH, once; in a process that
# is DVC's CLI, the params guard (`guard_dvc`; a venv without scalelab importable: nothing).
PTH_LINE = ("import os, sys; _b = os.path.join(sys.prefix, 'bin'); _p = os.environ.get('PATH', ''); "
            "sys.prefix != sys.base_prefix and _p.split(os.pathsep)[0] != _b and "
            "os.environ.__setitem__('PATH', _b + os.pathsep + _p); _a = getattr(sys, 'orig_argv', []); "
            "_m = _a[_a.index('-m') + 1:][:1] if '-m' in _a else []; "
            "(os.path.basename(sys.argv[0]) == 'dvc' or _m in (['dvc'], ['scalelab.pipeline.dvcrun'])) and "
            "exec('try:\\n from scalelab.pipeline.interpreter import guard_dvc\\nexcept ImportError:\\n pass\\n"
            "else:\\n guard_dvc()')\n")
FIX = "run `make setup` (the venv's PATH hook), activate .venv, or use `scalelab repro`"


def __getattr__(name: str):
    """WrongInterpreter, defined on first use: its base, ParamsError, is scalelab.config's (not imported at the top)."""
    if name == "WrongInterpreter":
        if name in globals():  # called directly (the raise below) after a first attribute lookup: one class only
            return globals()[name]
        from scalelab.config import ParamsError

        class WrongInterpreter(ParamsError):
            """The stage's interpreter runs other code than its project's: exit 2 (deterministic, as a params
            error)."""

        WrongInterpreter.__module__ = __name__
        globals()[name] = WrongInterpreter
        return WrongInterpreter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
            raise __getattr__("WrongInterpreter")(f"{sys.executable} runs scalelab from {here}, not this project's "
                                                  f"{project} ({rel or name} differs): {FIX}")


def _under(path: str, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder)


# ---------------------------------------------------------------- the params guard in DVC's process
class _DvcMainFinder:
    """On `sys.meta_path` in a DVC process: finds nothing itself; when `dvc.cli` is imported, loads it as the path
    finder would and wraps its `main` (the console script and dvcrun look `main` up after the import)."""

    done = False

    def find_spec(self, name, path=None, target=None):
        if name != "dvc.cli" or self.done:
            return None
        from importlib.machinery import PathFinder

        self.done = True
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_guard(module):
            exec_module(module)
            module.main = guarded(module.main)

        spec.loader.exec_module = exec_and_guard
        return spec


def guard_dvc() -> None:
    """Install the params guard in this process (the .pth line calls it in DVC's CLI processes; idempotent: `site`
    may read the venv's site-packages twice, as lib and lib64)."""
    if "dvc.cli" not in sys.modules and not any(isinstance(f, _DvcMainFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DvcMainFinder())


def guarded(dvc_main):
    """DVC's `main`, preceded by the params check for the commands that can remove outs."""

    @functools.wraps(dvc_main)
    def main(argv=None):
        argv = sys.argv[1:] if argv is None else list(argv)
        command = _repro_command(argv)
        refusal = _refusal(command)
        if refusal is not None:
            code, line = refusal
            print(line, file=sys.stderr)
            return code
        if command is not None and command[2] == "dvc repro" and not getattr(command[0], "dry", False):
            try:
                from scalelab.pipeline import repro_warm

                repro_warm.install(command[1])  # its stages from the second on start warm (pipeline/repro_warm.py)
            except Exception as err:  # noqa: BLE001 - DVC runs its stages cold, as it would have
                _skipped(err, "warm stages")
        root = command[1] if command is not None else _dvc_root(Path.cwd())
        if root is not None and (command is not None or _is_scalelab(root)):
            try:
                from scalelab.pipeline import dvcrun

                dvcrun.patch()  # each YAML text parsed once, dvc.lock read safe and spliced, files written whole
            except Exception as err:  # noqa: BLE001 - DVC reads and writes as it would have
                _skipped(err, "the flow's DVC patches")
        return dvc_main(argv)

    return main


def _repro_command(argv: list[str]):
    """(DVC's parsed args, the project root, "dvc repro" or "dvc exp run") when `dvc <argv>` is a `repro` or `exp
    run` of a scalelab project; None otherwise (help, a usage error DVC reports itself, `--run-all`, another command
    or project)."""
    if "-h" in argv or "--help" in argv:
        return None
    import contextlib
    import io

    try:
        from dvc.cli import parse_args
        from dvc.commands.repro import CmdRepro

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = parse_args(argv)
    except BaseException:  # noqa: BLE001 - a usage error: DVC's own parse reports it
        return None
    func = getattr(args, "func", None)
    if not (isinstance(func, type) and issubclass(func, CmdRepro)) or getattr(args, "run_all", False):
        return None  # --run-all runs queued experiments, whose params were checked when they were queued
    root = _dvc_root(Path(args.cd or "."))
    if root is None or not _is_scalelab(root):
        return None
    return args, root, "dvc exp run" if hasattr(args, "set_param") else "dvc repro"


def dvc_refusal(argv: list[str]) -> tuple[int, str] | None:
    """(exit code, one line) when `dvc <argv>` is a `repro` or `exp run` of a scalelab project whose params are bad;
    None otherwise, and whenever the check itself cannot run (DVC then runs as it would have)."""
    return _refusal(_repro_command(argv))


def _refusal(command) -> tuple[int, str] | None:
    """dvc_refusal of a command `_repro_command` parsed."""
    if command is None:
        return None
    args, root, prog = command
    overrides = []  # `-S [file:]override` (dvc.utils.cli_parse.to_path_overrides): those for params.yaml
    for value in getattr(args, "set_param", None) or []:
        file, _, override = value.partition(":") if ":" in value.partition("=")[0] else ("params.yaml", "", value)
        if os.path.normpath(file) == "params.yaml":
            overrides.append(override)
    try:
        from scalelab.pipeline.check import dvc_preflight

        dvc_preflight(root, overrides)
    except Exception as err:  # noqa: BLE001 - a check that cannot run never stops DVC: its stages check again
        from dvc.exceptions import DvcException

        from scalelab.config import ParamsError
        from scalelab.data import DataError

        if isinstance(err, (ParamsError, DataError)):
            return (2 if isinstance(err, ParamsError) else 3), f"{prog}: {err} (nothing run, nothing removed)"
        if not isinstance(err, DvcException):  # DVC's own error (a -S it cannot apply): DVC reports it itself
            _skipped(err)
    return None


def _skipped(err: BaseException, what: str = "params check before DVC") -> None:
    print(f"scalelab: {what} skipped ({type(err).__name__}: {' '.join(str(err).split())[:200]})", file=sys.stderr)


def _dvc_root(start: Path) -> Path | None:
    """The DVC project holding `start`, as DVC finds it: the nearest folder with a .dvc directory."""
    start = start.resolve()
    return next((d for d in (start, *start.parents) if (d / ".dvc").is_dir()), None)


def _is_scalelab(root: Path) -> bool:
    """A project this guard checks: a params.yaml, and a dvc.yaml whose stages run scalelab."""
    try:
        return (root / "params.yaml").is_file() and "scalelab" in (root / "dvc.yaml").read_text(errors="replace")
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    """`python -m scalelab.pipeline.interpreter`: install the path hook into this venv (make setup runs it)."""
    print(f"scalelab: {install()}: DVC run from this venv finds its python first on PATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())

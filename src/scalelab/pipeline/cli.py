"""scalelab: run the experiment pipeline (DVC stages chained by a Prefect flow), check it, see it, share it.

    scalelab repro [--workers N] [--target STAGE]...   the pipeline: independent stages and cells at once
    scalelab check                                     params and inputs, before DVC touches anything
    scalelab ui                                        MLflow and Prefect dashboards on 127.0.0.1
    scalelab report                                    build the report (and what it needs), say where it is
    scalelab profile configs/cpu-study.yaml            switch the params profile
    scalelab study cpu-study [--plan]                  a study's grid, resumable, kept in results/<name>/cells
    scalelab push | pull                               results to and from the DVC remote

Run `scalelab COMMAND --help` for a command's options. As litgpt's CLI: one console script, one subcommand per
task, each subcommand's help is its docstring. Every command runs in the project folder it finds from the current
one (where dvc.yaml is) and with this interpreter's environment first on PATH, so the stages DVC starts run the
interpreter that runs this command.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

EXIT_USAGE = 2  # no command, as argparse exits on a bad one

REMOTE_MODULES = ("scalelab.pipeline.remote",)


def _root() -> Path:
    from scalelab import project_root

    root = project_root()
    if not (root / "dvc.yaml").is_file():
        raise SystemExit(f"scalelab: no dvc.yaml in {root} or above: run it inside a scalelab project")
    return root


def _env(machine: str | None = None) -> dict[str, str]:
    """This process's environment with this interpreter's bin first on PATH (stage commands call `python`)."""
    from scalelab.pipeline.interpreter import with_bin_first

    env = with_bin_first(dict(os.environ))
    if machine:
        env["SCALELAB_MACHINE"] = str(Path(machine).resolve())
    return env


def _parser(name: str, fn: Callable) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"scalelab {name}", description=fn.__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def repro(argv: list[str]) -> int:
    """Build the pipeline. The params check first, then the Prefect flow (flows/pipeline.py), which runs independent
    stages and matrix cells at once, each on its share of the machine; `--plain` runs `dvc repro` instead, one stage
    at a time. Both leave dvc.lock complete and `dvc status` clean."""
    ap = _parser("repro", repro)
    ap.add_argument("--workers", type=int, help="cells at once (default: one per GPU, else one per core up to 8)")
    ap.add_argument("--target", action="append", dest="targets", help="a stage or matrix cell (repeatable)")
    ap.add_argument("--downstream", action="store_true", help="the targets and what depends on them")
    ap.add_argument("--runner", help="where the flow's tasks run: threads (default), dask, slurm, ray")
    ap.add_argument("--address", help="an existing Dask scheduler or Ray cluster")
    ap.add_argument("--machine", help="a machine file to use instead of machine.yaml (scalelab.config.machine)")
    ap.add_argument("--plain", action="store_true", help="`dvc repro` in one process instead of the flow")
    args = ap.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        ap.error("--workers must be at least 1")
    root, env = _root(), _env(args.machine)
    if code := _run([sys.executable, "-m", "scalelab.pipeline.check"], root, env):
        return code  # a bad params file fails here, before DVC deletes any outs
    if args.plain:
        cmd = [sys.executable, "-m", "scalelab.pipeline.dvcrun", "repro", *(args.targets or [])]
        cmd += ["--downstream"] if args.downstream else []
    else:
        cmd = [sys.executable, str(root / "flows" / "pipeline.py")]
        cmd += [f"--target={t}" for t in args.targets or []] + (["--downstream"] if args.downstream else [])
        for flag in ("workers", "runner", "address"):
            if (value := getattr(args, flag)) is not None:
                cmd.append(f"--{flag}={value}")
    return _run(cmd, root, env)


def check(argv: list[str]) -> int:
    """Check the params and inputs before DVC touches anything. params.yaml's YAML, schema, names, every grid cell's
    model, the machine settings merged in, and the local inputs it names; exit 2 on a params error, 3 on a data
    error, with one line saying what is wrong."""
    from scalelab.pipeline import check as mod

    return mod.main(argv)


def ui(argv: list[str]) -> int:
    """Open the MLflow and Prefect dashboards. Both on 127.0.0.1 (ports 5000 and 4200) over the project's stores,
    with the saved-view link printed (scalelab.tracking.ui)."""
    from scalelab.tracking import ui as mod

    sys.argv = ["scalelab ui", *argv]  # its parser reads sys.argv; the name is what its --help shows
    return mod.main() or 0


def report(argv: list[str]) -> int:
    """Build the report and its claims ledger. The flow with target `report` (it and whatever it needs that is out of
    date), then where it is; `--no-build` only says where it is and what it concludes."""
    ap = _parser("report", report)
    ap.add_argument("--no-build", action="store_true", help="do not build; show the report that exists")
    ap.add_argument("--workers", type=int, help="cells at once while building")
    args = ap.parse_args(argv)
    root = _root()
    if not args.no_build:
        code = repro(["--target", "report", *([f"--workers={args.workers}"] if args.workers else [])])
        if code:
            return code
    md, metrics = root / "data/report/report.md", root / "metrics/report.json"
    if not md.is_file():
        print(f"scalelab report: no report yet ({md.relative_to(root)}): run `scalelab report`", file=sys.stderr)
        return 1
    import json

    verdicts = json.loads(metrics.read_text()).get("verdicts") if metrics.is_file() else None
    print(f"report: {md}, {md.with_suffix('.html')} (claims: {verdicts or 'none yet'})")
    return 0


def profile(argv: list[str]) -> int:
    """Switch the params profile. Composed over its base and validated with this machine's settings, then written
    over params.yaml whole, the old one kept as params.yaml.prev."""
    from scalelab.pipeline import profile as mod

    return mod.main(argv)


def study(argv: list[str]) -> int:
    """Run a study's grid as pipeline cells, resumably. The cells of configs/studies/NAME.yaml that no committed
    result covers run through the flow in the study's own workspace, each kept in results/NAME/cells/ as it finishes;
    then its ledger and README are regenerated (`--plan`: what is left and its cost; scalelab.study.run)."""
    _root()
    from scalelab.study import run as mod

    return mod.main(argv)


def _remote(command: str, argv: list[str]) -> int:
    for name in REMOTE_MODULES:  # an install without the remote module (a trimmed package) says so in one line
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is not None and not name.startswith(err.name):  # the module exists, one of its imports not
                raise
            continue
        return mod.main([command, *argv]) or 0
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: scalelab {command} [...]: {command} results with the DVC remote (not in this install)")
        return 0
    print(f"scalelab {command}: not available in this install (no {' or '.join(REMOTE_MODULES)}); use "
          f"`dvc {command}` with a remote configured in .dvc/config", file=sys.stderr)
    return 1


def push(argv: list[str]) -> int:
    """Push the results to the DVC remote. DVC's cache of every out, so a colleague's `scalelab pull` gets them
    without recomputing."""
    return _remote("push", argv)


def pull(argv: list[str]) -> int:
    """Pull the results from the DVC remote. After it, `dvc status` is clean and nothing reruns."""
    return _remote("pull", argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "repro": repro, "check": check, "ui": ui, "report": report, "profile": profile, "study": study, "push": push,
    "pull": pull,
}


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> int:
    try:
        return subprocess.run(cmd, cwd=cwd, env=env).returncode
    except KeyboardInterrupt:  # the child got the same Ctrl-C and stops its stages itself
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="scalelab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, fn in COMMANDS.items():
        sub.add_parser(name, help=" ".join((fn.__doc__ or "").split(". ")[0].split()), add_help=False)  # 1st sentence
    if not argv or argv[0] not in COMMANDS:  # --help, --version, nothing, or a typo: argparse says which
        args = ap.parse_args(argv)
        if args.command is None:
            ap.print_help(sys.stderr)
            return EXIT_USAGE
    return COMMANDS[argv[0]](argv[1:])


def _version() -> str:
    import scalelab

    return f"scalelab {scalelab.__version__}"


if __name__ == "__main__":
    sys.exit(main())

"""Results travel through DVC remotes: push and pull the project's outs, and the remote location of a
model folder.

.dvc/config names a default remote `local`: a folder outside every clone, ~/.cache/scalelab/dvc-remote, so the clones
of one user share their cells (`dvc remote modify --local local url PATH` moves it). A team adds a network remote and
makes it the default, e.g. DVC over SSH (dvc-ssh):

    dvc remote add -d --local team ssh://user@host/srv/scalelab-dvc
    dvc remote modify --local team keyfile ~/.ssh/id_ed25519

DVC stores an out by content (`<remote>/files/md5/<2 hex>/<rest>`; a folder as its `.dir` listing), so the location
of a model folder follows from its hash in dvc.lock. After a push, each MLflow logged model of a pushed folder is
tagged with that location (`scalelab.dvc_url`, and `scalelab.dvc_remote`): a colleague finds the weights from the run.

    python -m scalelab.pipeline.remote push [-r REMOTE] [-j JOBS] [TARGET ...]
    python -m scalelab.pipeline.remote pull [-r REMOTE] [-j JOBS] [TARGET ...]
    python -m scalelab.pipeline.remote url PATH [-r REMOTE]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Sequence

from scalelab import project_root
from scalelab.runtime import yamlio

URL_TAG = "scalelab.dvc_url"  # on a logged model: where its folder's DVC object lives in the remote
REMOTE_TAG = "scalelab.dvc_remote"  # ... and the remote's name


class RemoteError(ValueError):
    """No remote to push to or read from, or a path DVC does not track."""


def dvc(args: Sequence[str], root: Path | None = None) -> int:
    """`dvc ARGS` at the project root with this interpreter's DVC (the venv's, whatever PATH holds)."""
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root or project_root()).returncode


def remote_of(root: Path | None = None, remote: str | None = None) -> tuple[str, str]:
    """(name, url) of `remote`, or of the default remote (core.remote); RemoteError when there is none."""
    from dvc.repo import Repo

    with Repo(str(root or project_root())) as repo:
        config = repo.config
        name = remote or config["core"].get("remote")
        if not name:
            raise RemoteError("no DVC remote: add one with `dvc remote add -d NAME URL` (see scalelab.pipeline.remote)")
        if name not in config["remote"]:
            raise RemoteError(f"no DVC remote named {name!r} (have: {', '.join(sorted(config['remote'])) or 'none'})")
        return name, str(config["remote"][name]["url"]).rstrip("/")


def _lock_outs(root: Path) -> dict[str, str]:
    """{out path: md5} of every cached out dvc.lock records (a folder's md5 ends in `.dir`); `cache: false` outs
    never reach a remote."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return {Path(out.fs_path).relative_to(root).as_posix(): out.hash_info.value for out in repo.index.outs
                if out.use_cache and out.hash_info and out.hash_info.value}


def remote_url(path: str | Path, root: Path | None = None, remote: str | None = None) -> str:
    """The location in the remote of the DVC out holding `path` (a model folder inside an out, e.g. model/hf, gets
    its out's location and the path inside it after `#`), as dvc.lock records it: where `dvc push` puts it."""
    root = Path(root or project_root()).resolve()
    p = Path(path)
    rel = (p.resolve().relative_to(root) if p.is_absolute() else p).as_posix()
    for out, md5 in _lock_outs(root).items():  # DVC's outs never overlap: one holds `path`, at most
        if rel == out or rel.startswith(f"{out}/"):
            url = f"{remote_of(root, remote)[1]}/files/md5/{md5[:2]}/{md5[2:]}"
            return url + (f"#{rel[len(out) + 1:]}" if rel != out else "")
    raise RemoteError(f"{rel}: not in a cached out of dvc.lock (run its stage first)")


def model_urls(root: Path | None = None, remote: str | None = None) -> dict[str, str]:
    """{model folder (relative to the root): its remote location} for every model folder in a cached out of
    dvc.lock: the links the report lists."""
    from scalelab.tracking import dashboard

    root = Path(root or project_root()).resolve()
    folders = [f for out in _lock_outs(root) if (f := dashboard.model_folder(root / out)) is not None]
    return {Path(f).relative_to(root).as_posix(): remote_url(f, root, remote) for f in folders}


def link_models(root: Path | None = None, remote: str | None = None) -> int:
    """Tag the newest MLflow logged model of each model folder in a cached out with its remote location; returns how
    many were tagged. Best effort, like all tracking: a store that is down warns and tags nothing. Run at
    the project root: logged models name their folders relative to it."""
    from mlflow import MlflowClient

    from scalelab import tracking
    from scalelab.tracking import dashboard

    root = Path(root or project_root()).resolve()
    name, _ = remote_of(root, remote)
    params = yamlio.safe_load((root / "params.yaml").read_text()) or {}
    experiment = (params.get("tracking") or {}).get("experiment", "scalelab")
    tagged = 0
    try:
        client = MlflowClient(tracking.tracking_uri())
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return 0
        for folder, url in model_urls(root, name).items():
            if model_id := dashboard.find_model(client, exp.experiment_id, root / folder):
                client.set_logged_model_tags(model_id, {URL_TAG: url, REMOTE_TAG: name})
                tagged += 1
    except Exception as err:  # tracking never stops the work
        warnings.warn(f"MLflow: logged models not linked to remote {name!r} ({type(err).__name__}: {err})",
                      RuntimeWarning)
    return tagged


def push(targets: Sequence[str] = (), remote: str | None = None, jobs: int | None = None,
         root: Path | None = None) -> int:
    """`dvc push` of `targets` (default: everything in dvc.lock), then the logged models' links; DVC's exit code."""
    root = Path(root or project_root())
    name, url = remote_of(root, remote)  # one clear line before any transfer when there is no remote
    rc = dvc(["push", "-r", name, *(["-j", str(jobs)] if jobs else []), *targets], root)
    if rc == 0:
        print(f"pushed to {name} ({url}); {link_models(root, name)} logged model(s) linked")
    return rc


def pull(targets: Sequence[str] = (), remote: str | None = None, jobs: int | None = None,
         root: Path | None = None) -> int:
    """`dvc pull` of `targets` (default: everything in dvc.lock) into the workspace; DVC's exit code."""
    root = Path(root or project_root())
    name, _ = remote_of(root, remote)
    return dvc(["pull", "-r", name, *(["-j", str(jobs)] if jobs else []), *targets], root)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelab.pipeline.remote", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command, fn in (("push", push), ("pull", pull)):
        p = sub.add_parser(command, help=fn.__doc__.split(";")[0])
        p.add_argument("targets", nargs="*", help="stages or outs (default: all in dvc.lock)")
        p.add_argument("-r", "--remote", help="remote name (default: core.remote of .dvc/config)")
        p.add_argument("-j", "--jobs", type=int, help="parallel transfers")
    p = sub.add_parser("url", help="the remote location of a DVC-tracked path (e.g. a model folder)")
    p.add_argument("path")
    p.add_argument("-r", "--remote")
    args = parser.parse_args(argv)
    try:
        if args.command == "url":
            print(remote_url(args.path, remote=args.remote))
            return 0
        return (push if args.command == "push" else pull)(args.targets, args.remote, args.jobs)
    except RemoteError as err:
        print(f"scalelab.pipeline.remote: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

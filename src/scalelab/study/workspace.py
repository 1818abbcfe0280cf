"""A study's own DVC workspace: .dvc/tmp/studies/<name>/ under the project (git-ignored, machine-local).

A study runs its cells through the pipeline as `scalelab repro` would, but not in the project's own workspace: there
it would switch the user's params.yaml and overwrite the project's dvc.lock, metrics and plots with the study's. The
workspace holds a copy of the project's code as it is now (tracked and untracked, git's ignores applied, no
results), the study's params.yaml, and DVC's own state for it (its dvc.lock, data, cache, checkpoints), so a cell
interrupted on this machine resumes from its checkpoint on the next run and the data stages are not rebuilt. Its
stages use the project's MLflow store, Prefect home and caches (the environment the study command runs in).

Only one run of a study at a time: its workspace is locked (flock) by the study command and the flow it starts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

# Not code: the project's results, its own pipeline state, and the per-machine files (the study writes its own)
SKIP_PREFIXES = ("results/", "metrics/", "plots/", "data/", "models/", ".dvc/")
SKIP_FILES = {"dvc.lock", "params.yaml", "params.yaml.prev", "machine.yaml"}
MANIFEST = ".study-files.json"


class Busy(RuntimeError):
    """Another run of the study holds its workspace."""


class Workspace:
    def __init__(self, root: Path, name: str):
        self.root = root
        self.path = root / ".dvc" / "tmp" / "studies" / name
        self.lock_path = self.path / ".lock"
        self.gate = self.path / "gate.json"
        self.logs = self.path / "logs"
        self._lock_fd: int | None = None

    @contextmanager
    def locked(self):
        """Hold the workspace for this run; Busy when another run holds it."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise Busy(f"another run of this study holds {self.path} (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        try:
            yield self
        finally:
            self._lock_fd = None
            os.close(fd)

    @property
    def lock_fd(self) -> int:
        assert self._lock_fd is not None, "not locked"
        return self._lock_fd

    def code_files(self) -> list[str]:
        """The project's files a workspace copies: git's tracked and untracked-but-not-ignored files, minus results
        and pipeline state."""
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=self.root,
                             capture_output=True)
        if out.returncode:
            raise RuntimeError(f"a study runs in a git checkout: `git ls-files` failed in {self.root}")
        names = sorted({n for n in out.stdout.decode().split("\0") if n})
        return [n for n in names if not n.startswith(SKIP_PREFIXES) and n not in SKIP_FILES
                and (self.root / n).is_file()]

    def sync(self) -> int:
        """Copy the project's code into the workspace (files whose size or mtime differ; files the project dropped
        are dropped); returns how many were copied or removed. Its DVC config: the project's, without git."""
        manifest = self.path / MANIFEST
        before = set(json.loads(manifest.read_text())) if manifest.is_file() else set()
        files = self.code_files()
        changed = 0
        for rel in files:
            src, dst = self.root / rel, self.path / rel
            s = src.stat()
            if dst.is_file() and (d := dst.stat()).st_size == s.st_size and d.st_mtime_ns == s.st_mtime_ns:
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            changed += 1
        for rel in sorted(before - set(files)):
            (self.path / rel).unlink(missing_ok=True)
            changed += 1
        (self.path / ".dvc").mkdir(exist_ok=True)
        config = self.root / ".dvc" / "config"
        (self.path / ".dvc" / "config").write_text(config.read_text() if config.is_file() else "")
        # DVC keeps git out of the workspace (it lies inside the project's checkout, git-ignored)
        (self.path / ".dvc" / "config.local").write_text("[core]\n    no_scm = true\n")
        machine = self.root / "machine.yaml"
        if machine.is_file():
            shutil.copy2(machine, self.path / "machine.yaml")
        else:
            (self.path / "machine.yaml").unlink(missing_ok=True)
        manifest.write_text(json.dumps(files))
        return changed

    def link(self, rel: Path) -> None:
        """The project's folder `rel` (created) seen at the same relative path in the workspace, as a symlink: what
        the cells write there (a study's store) lands in the project's copy, committed with the cells."""
        target, at = self.root / rel, self.path / rel
        target.mkdir(parents=True, exist_ok=True)
        if at.is_symlink() and at.resolve() == target.resolve():
            return
        if at.is_symlink() or at.is_file():
            at.unlink()
        elif at.is_dir():
            shutil.rmtree(at)
        at.parent.mkdir(parents=True, exist_ok=True)
        at.symlink_to(target.resolve(), target_is_directory=True)

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        """The flow's environment: this process's (the project's MLflow store, Prefect home, caches), the workspace
        as the project root, its copy of the library first on the import path, this interpreter first on PATH."""
        env = {**os.environ, **extra, "SCALELAB_ROOT": str(self.path), "PYTHONUNBUFFERED": "1",
               "DVC_NO_ANALYTICS": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.path / "src"), os.environ.get("PYTHONPATH")]))
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        for var in ("SCALELAB_PARENT_RUN_ID", "SCALELAB_PREFECT_FLOW_RUN_ID", "SCALELAB_RUN_ID", "DVC_ROOT"):
            env.pop(var, None)  # a study started from inside a stage or flow is a run of its own
        return env

    def lock_stages(self) -> dict:
        """dvc.lock's stages as DVC reads them ({} before the first stage ran, or while DVC rewrites the file)."""
        from dvc.utils.serialize import parse_yaml

        path = self.path / "dvc.lock"
        try:
            return (parse_yaml(path.read_text(), str(path)) or {}).get("stages") or {}
        except Exception:  # absent, or caught mid-write: read again at the next change
            return {}

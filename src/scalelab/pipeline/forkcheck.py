"""What a forked stage would run: the project's imported code, fingerprinted, and the threads a fork cannot carry.

The warm server (scalelab.pipeline.warm) forks stage processes from one interpreter that imported the libraries once.
A fork is only the stage's own process if the code it runs is the code on disk (an edit to src/ restarts the server)
and no other thread was running at the fork (a thread's lock held at fork time stays held forever in the child).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

# Native threads the preloaded libraries start that survive a fork by design: jemalloc's background threads (pyarrow;
# jemalloc re-initialises itself in the child) and polars' spill-file cleaner (only for its out-of-core engine).
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd", "polars-ooc-clea"})


def native_threads() -> set[str]:
    """The names of this process's threads other than the calling one (Linux /proc)."""
    import threading

    me = str(threading.get_native_id())
    names = set()
    for t in set(os.listdir("/proc/self/task")) - {me}:
        try:
            names.add(Path(f"/proc/self/task/{t}/comm").read_text().strip())
        except OSError:  # the thread ended between the listing and the read
            pass
    return names


def imported_files(root: Path) -> dict[str, bytes]:
    """Each project file under `root` that a loaded module came from -> its content hash: the code a fork would run.
    Installed packages are not the project's code (DVC hashes none of them), also where the venv sits under `root`
    (make's .venv): hashing every torch file before each fork cost seconds, and a file a package rewrote at run time
    restarted the server mid-test (CI run 5)."""
    files = {f for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)}
    return {f: digest(f) for f in sorted(files) if os.path.isabs(f) and _project_file(Path(f), root)}


def _project_file(path: Path, root: Path) -> bool:
    if not path.is_relative_to(root) or {"site-packages", "dist-packages"} & set(path.parts):
        return False
    return sys.prefix == sys.base_prefix or not path.is_relative_to(sys.prefix)  # a venv's own files are installed


def digest(path: str) -> bytes:
    try:
        return hashlib.blake2b(Path(path).read_bytes(), digest_size=16).digest()
    except OSError:  # deleted, or unreadable now: changed
        return b""

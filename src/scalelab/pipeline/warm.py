"""Warm start for stage processes: a server that has already imported the training stack forks one process
per stage command, so a cell pays neither the interpreter's start nor its imports (torch, Lightning, MLflow: seconds
per cell, most of a small cell's cost outside its compute).

    python -m scalelab.pipeline.warm --socket /tmp/x/warm.sock [--parent PID]    # the flow starts one per run

(and a plain `dvc repro` one at its second stage script: scalelab.pipeline.repro_warm). Neither waits for its imports:
a stage that comes meanwhile waits for the socket (handoff's STARTING file names the importing server), and runs cold
at once if that server dies.

DVC runs a stage's command as always (`python stages/pretrain.py ...`). With SCALELAB_WARM naming a live server's
socket, `scalelab.pipeline.stage.stage_main` first calls `handoff()` (scalelab.pipeline.handoff): it sends the server its argv, working directory and
environment, and its stdin/stdout/stderr as file descriptors (SCM_RIGHTS). The server forks; the child takes those
streams, directory and environment and runs the script as `__main__`, in its own process group; the server reports
the child's exit status back, and the stage's process exits with it, forwarding SIGINT/SIGTERM to the child's group
meanwhile. The child owns its process as a fresh one would: Lightning's DDP launcher re-executes the command for the
other ranks, which run cold (a rank never hands off). If the stage's process dies, the server ends its child.

The flow's own DVC commands (`python -m scalelab.pipeline.dvcrun repro --single-item <stage>`, one per stage) hand
off the same way (`handoff(module=...)`): the child runs the module's `main()` with DVC already imported, keeps
SCALELAB_WARM, so the stage script DVC starts is served in turn, and a command that comes while the server still
imports runs cold rather than wait.

The server runs exactly the code DVC hashes: at start it records a content hash of every file under the
project root (its working directory) that its imports loaded, and before each fork it hashes them again. When one
changed (an edit to src/ during a long flow), it refuses: that stage, and any until the server is idle, runs cold
(importing the new code), and once no child of its runs, the server re-executes itself and imports afresh. A refusal
costs a cold start (seconds); serving the old code would record results under the new code's hash.

When anything is off (no server, the socket gone, a refused request) the stage runs in its own process as before.
The server refuses to start with other threads running (a fork copies only the forking one) and is for CPU nodes:
the flow does not start it where GPUs are visible (CUDA does not survive a fork once initialised).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from scalelab.pipeline import forkcheck
from scalelab.pipeline.handoff import READY_S, STARTING, WARM_ENV, recv, send

# The server's modules are imported where used.

# What a pretrain cell imports, as `module` or `module:attr,attr` (a lazy module's attributes: the Hugging Face export's
# classes). A preload that fails is skipped: the stage then imports it itself and meets the error there.
PRELOAD = ("scalelab.train", "scalelab.tracking", "scalelab.model.export", "mlflow.store.tracking.sqlalchemy_store",
           "transformers:LlamaConfig,Qwen3Config,PreTrainedTokenizerFast")
# What other stages import beyond that, measured per forked child on the micro DAG: the Hugging Face model classes
# (~0.7 CPU s a cell: transformers' modelling, and scipy.optimize through transformers.loss), scipy.stats (~0.9 s) and
# pyplot (~0.7 s). A flow preloads them only when it runs such a stage (`preload_for`): in every server they would
# cost a flow of pretrain cells ~1.8 s for nothing.
_MODELS = ("transformers:LlamaForCausalLM,Qwen3ForCausalLM",)
_STATS, _PLOTS = ("scipy.stats",), ("matplotlib.pyplot",)
STAGE_PRELOAD = {"evaluate": _MODELS, "compress": _MODELS, "hidden_decoding": _MODELS,
                 "leaderboard": _STATS + _PLOTS, "compress_summary": _STATS + _PLOTS, "scaling": _PLOTS,
                 "report": _PLOTS, "hidden_decoding_summary": _PLOTS}


# What the flow's DVC commands import (`python -m scalelab.pipeline.dvcrun repro ...`, one per stage, handed to the
# server: scalelab.pipeline.handoff), measured on a forked no-op `repro` of a micro cell: 0.71 CPU s cold, 0.35 forked
# from a server holding these (0.44 s once, in the server). A plain `dvc repro`'s server (repro_warm) runs inside DVC
# and serves stage scripts alone, so only the flow's server holds them.
DVC_PRELOAD = ("scalelab.pipeline.dvcrun", "dvc.cli.parser", "dvc.repo.reproduce", "dvc.repo.index", "dvc.repo.stage",
               "dvc.repo.open_repo", "dvc.repo.artifacts", "dvc.repo.datasets", "dvc.repo.metrics.show",
               "dvc.repo.params.show", "dvc.repo.plots", "dvc.cachemgr", "dvc.data_cloud", "dvc.lock", "dvc.rwlock",
               "dvc.scm", "dvc.utils.strictyaml", "scmrepo.git", "dulwich.client", "dulwich.worktree", "ruamel.yaml",
               "dvc_render", "configobj", "platformdirs", "pyparsing", "unittest")


# A command that runs one of the project's stage scripts (stages/<name>.py: each starts with stage_main, which hands
# the process to the server); any other command (a user's own script, a shell tool) is never served
STAGE_SCRIPT = re.compile(r"(?:^|\s)python3?\s+(?:\S*/)?stages/\w+\.py(?:\s|$)")


def preload_for(stages: Iterable[str], cmds: Mapping[str, object] | None = None) -> tuple[str, ...]:
    """What the flow's server imports: PRELOAD, what the given stages (names, or matrix cells `stage@item`) import
    beyond it, and DVC (DVC_PRELOAD), whose commands the flow hands to the server too. With the stages' commands
    (`cmds`, as dvc.yaml gives them), DVC alone where none of them runs a stage script (STAGE_SCRIPT): the server
    would hold the training stack for no stage (~8 CPU s)."""
    def runs_script(cmd: object) -> bool:  # dvc.yaml's cmd: one command, or a list of them
        return any(STAGE_SCRIPT.search(c) for c in (cmd if isinstance(cmd, list) else [cmd or ""]))

    stages = list(stages)
    if cmds is not None and not any(runs_script(cmds.get(s)) for s in stages):
        return DVC_PRELOAD
    extra = {spec for stage in stages for spec in STAGE_PRELOAD.get(stage.partition("@")[0], ())}
    return PRELOAD + tuple(sorted(extra)) + DVC_PRELOAD


# ---------------------------------------------------------------- server
def _child(request: dict, fds: list[int], defaults: dict[str, str]) -> None:
    """In the forked child: become the stage's process and run its script; never returns."""
    import atexit
    import ctypes
    import importlib
    import io
    import random
    import runpy
    import traceback

    code = 1
    try:
        os.setsid()  # its own process group: the client's signals reach it and what it starts
        server = os.getppid()
        # Ends with the server, even when the server is SIGKILLed (its client then sees the stage fail): no stage
        # outlives a killed flow, to finish and write its outs behind the back of the DVC that gave up on it.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != server:
            os._exit(128 + signal.SIGKILL)
        # PR_SET_NAME: what ps, top and tools/suite_cpu.py show for it (its command line stays the server's)
        libc.prctl(15, b"scalelab-dvc" if request.get("module") else b"scalelab-stage")
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for key, value in defaults.items():  # what the preloaded modules set at import, as a cold start would
            os.environ.setdefault(key, value)
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
            raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
            text = io.TextIOWrapper(raw if fd == 0 else io.BufferedWriter(raw), encoding="utf-8", errors="replace",
                                    line_buffering=fd == 2 or raw.isatty(), write_through=fd > 0 and unbuffered)
            setattr(sys, name, text)
        random.seed()  # and numpy's global generator, if imported: each cold process seeds them afresh from the OS
        if (np_random := sys.modules.get("numpy.random")) is not None:
            np_random.seed()
        sys.argv = list(request["argv"])
        if module := request.get("module"):  # `python -m module`: the working directory first, its main()'s status
            sys.path[0] = os.getcwd()
            raise SystemExit(importlib.import_module(module).main())
        sys.path[0] = os.path.dirname(sys.argv[0])  # as `python script.py` does
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(path: str, preload: tuple[str, ...] = PRELOAD, parent: int | None = None) -> int:
    """Import `preload`, then fork a child per request on the socket at `path` until `parent` (a pid) is gone."""
    import importlib
    import selectors
    import threading

    Path(f"{path}{STARTING}").write_text(str(os.getpid()))  # stages that come while it imports wait (handoff)
    # Ctrl-C reaches the whole foreground group, this server included: its stages get it from their own processes
    # (handoff forwards it), as cold ones would; the server ends with its parent (SIGTERM, or the parent gone)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    before = dict(os.environ)
    for spec in preload:
        module, _, attrs = spec.partition(":")
        try:
            imported = importlib.import_module(module)
            for attr in filter(None, attrs.split(",")):
                getattr(imported, attr)
        except Exception as err:
            print(f"scalelab.pipeline.warm: not preloaded: {spec} ({type(err).__name__}: {err})", file=sys.stderr)
    defaults = {k: v for k, v in os.environ.items() if before.get(k) != v}
    root = Path.cwd().resolve()
    imported = forkcheck.imported_files(root)
    stale: list[str] = []  # the imported files changed since: refuse, re-execute once idle
    if threading.active_count() > 1 or (others := forkcheck.native_threads() - forkcheck.FORK_SAFE_THREADS):
        print(f"scalelab.pipeline.warm: threads {threading.enumerate()} {sorted(others)} run after the imports; not serving "
              "(set OMP_NUM_THREADS/OPENBLAS_NUM_THREADS=1 for the server)", file=sys.stderr)
        Path(f"{path}{STARTING}").unlink(missing_ok=True)
        return 1
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))  # ends its children, removes the socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(64)
    os.replace(tmp, path)  # clients see the socket only once it accepts
    Path(f"{path}{STARTING}").unlink(missing_ok=True)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    children: dict[int, tuple[socket.socket, int, str]] = {}  # pid -> (client connection, pidfd, stage name)
    served = commands = 0  # stage scripts, DVC commands
    try:
        while parent is None or os.getppid() == parent:
            for key, _ in sel.select(timeout=1.0):
                if key.data == "accept":
                    conn, _ = listener.accept()
                    request, fds = recv(conn, maxfds=3)
                    stale = stale or [str(Path(f).relative_to(root)) for f, d in imported.items() if forkcheck.digest(f) != d]
                    if not request or len(fds) != 3 or stale:
                        for fd in fds:
                            os.close(fd)
                        if request and stale:
                            with contextlib.suppress(OSError):  # the stage's process may be gone already
                                send(conn, {"refused": f"changed since this server imported them: {', '.join(stale)}"})
                        conn.close()
                        if stale and not children:
                            _reexec(path, preload, parent, before, listener, stale, served)
                        continue
                    pid = os.fork()
                    if pid == 0:  # the child keeps only the stage's streams
                        sel.close()
                        listener.close()
                        conn.close()
                        for other, pidfd, _ in children.values():
                            other.close()
                            os.close(pidfd)
                        _child(request, fds, defaults)
                    for fd in fds:
                        os.close(fd)
                    pidfd = os.pidfd_open(pid)
                    if request.get("module"):  # a DVC command of the flow: `dvc repro --single-item <stage>`
                        name = " ".join(["dvc", *request["argv"][1:]])
                        commands += 1
                    else:
                        name = request["env"].get("DVC_STAGE") or " ".join(request["argv"])
                        served += 1
                    children[pid] = (conn, pidfd, name)
                    sel.register(pidfd, selectors.EVENT_READ, ("exit", pid))
                    sel.register(conn, selectors.EVENT_READ, ("client", pid))
                    send(conn, {"pid": pid})
                elif key.data[0] == "exit":  # a child ended: its status to its client
                    pid = key.data[1]
                    conn, pidfd, name = children.pop(pid)
                    _, status, usage = os.wait4(pid, 0)
                    code = os.waitstatus_to_exitcode(status)
                    print(f"scalelab.pipeline.warm: {name}: exit {code}, {usage.ru_utime + usage.ru_stime:.2f} CPU s",
                          file=sys.stderr, flush=True)
                    sel.unregister(pidfd)
                    os.close(pidfd)
                    if conn.fileno() in sel.get_map():
                        sel.unregister(conn)
                    try:
                        send(conn, {"exit": code if code >= 0 else 128 - code})
                    except OSError:
                        pass
                    conn.close()
                    if stale and not children:
                        _reexec(path, preload, parent, before, listener, stale, served)
                elif key.data[0] == "client":  # the stage's process went away (killed): end its child too
                    pid = key.data[1]
                    if pid in children and not children[pid][0].recv(1, socket.MSG_PEEK):
                        sel.unregister(children[pid][0])
                        try:
                            os.killpg(pid, signal.SIGTERM)
                        except ProcessLookupError:
                            pass
    finally:
        dvc = f", {commands} DVC command(s)" if commands else ""
        print(f"scalelab.pipeline.warm: served {served} stage(s){dvc}", file=sys.stderr, flush=True)
        for pid in list(children):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return 0


def _reexec(path: str, preload: tuple[str, ...], parent: int | None, env: dict[str, str], listener: socket.socket,
            stale: list[str], served: int) -> None:
    """Become a fresh server (same pid, so `parent` and the flow still know it) that imports the code as it is now.
    Stages that arrive meanwhile wait for it, as for a starting server (handoff's STARTING)."""
    Path(f"{path}{STARTING}").write_text(str(os.getpid()))
    listener.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    print(f"scalelab.pipeline.warm: served {served} stage(s); {', '.join(stale)} changed: restarting to import them afresh",
          file=sys.stderr, flush=True)
    argv = [sys.executable, "-m", "scalelab.pipeline.warm", "--socket", path, *(["--parent", str(parent)] if parent else []),
            "--preload", *preload]
    os.execve(sys.executable, argv, env)


@contextlib.contextmanager
def server(cwd: str | os.PathLike, log: Callable[[str], None] = print, env: dict[str, str] | None = None,
           wait: bool = False, preload: tuple[str, ...] = PRELOAD) -> Iterator[dict[str, str]]:
    """A server for stage processes started from `cwd`, alive while the caller is: yields the environment that points
    stages at it at once, while it imports (a stage that comes meanwhile waits for it: handoff's STARTING); with
    `wait`, once it serves (at most READY_S later; a failed start yields all the same: its stages run cold). It runs
    with one thread per library, each stage then sets its own share (SCALELAB_THREADS): OpenBLAS would otherwise
    start a thread pool at import, which a fork does not carry. It imports what a stage run with `env` (default: this
    process's) would, and `preload` (`preload_for` the stages it will serve). At the end, `log` gets its report."""
    import shutil
    import time

    tmp, proc = start(cwd, env, preload=preload)
    sock = tmp / "warm.sock"
    try:
        deadline = time.monotonic() + READY_S
        while wait and not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        yield {WARM_ENV: str(sock)}
    finally:
        stop(proc)
        if text := (tmp / "warm.log").read_text().strip():
            log(text)
        shutil.rmtree(tmp, ignore_errors=True)


def start(cwd: str | os.PathLike, env: dict[str, str] | None = None, threads: int | None = 1,
          preload: tuple[str, ...] = PRELOAD):
    """Start a server in a new temporary folder (its socket `warm.sock`, its output `warm.log`) for this process (it
    ends with it); returns (the folder, the server's Popen). Stages may point at the socket at once (STARTING).
    `threads`: every library's threads in the server (stages then set their share); None: torch's default, what a
    cold stage starts with (OpenBLAS's one thread all the same: its pool would start at import)."""
    import subprocess
    import tempfile

    from scalelab.runtime.placement import thread_env

    tmp = Path(tempfile.mkdtemp(prefix="scalelab-warm-"))
    sock = tmp / "warm.sock"
    env = {**(os.environ if env is None else env), **(thread_env(threads) if threads else {}),
           "OPENBLAS_NUM_THREADS": "1"}
    env.pop(WARM_ENV, None)
    cmd = [sys.executable, "-m", "scalelab.pipeline.warm", "--socket", str(sock), "--parent", str(os.getpid()),
           *(["--preload", *preload] if preload != PRELOAD else [])]
    with open(tmp / "warm.log", "w") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    Path(f"{sock}{STARTING}").write_text(str(proc.pid))  # before any stage can look (the server writes it too)
    return tmp, proc


def stop(proc) -> None:
    """End a server `start` started (its children with it) and wait for it."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True, help="the Unix socket to serve on")
    ap.add_argument("--parent", type=int, help="serve while this process lives")
    ap.add_argument("--preload", nargs="*", default=list(PRELOAD),
                    help="modules (module or module:attr,attr) to import before serving")
    args = ap.parse_args(argv)
    return serve(args.socket, tuple(args.preload), args.parent)


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # skips unloading torch and the rest: seconds the flow would wait for

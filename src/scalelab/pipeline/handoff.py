"""The stage's side of the warm start (scalelab.pipeline.warm): hand this process's stage to the server and exit
with its status, or return and run here. Every stage's start imports this module, so it imports only the standard
library.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

WARM_ENV = "SCALELAB_WARM"  # the server's socket path, set by the flow for its tasks
# Beside the socket while its server imports (the server's pid): a stage that comes meanwhile waits for the socket
# rather than importing everything itself, which would take as long and as much CPU as the server's own imports
STARTING = ".starting"
READY_S = 300.0  # the longest a stage waits for a starting server (its imports take seconds on idle cores)
RANK_VARS = ("RANK", "LOCAL_RANK", "NODE_RANK")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # to the stage's process group in the server
_HEADER = struct.Struct("!I")


def send(sock: socket.socket, obj: object, fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode()
    socket.send_fds(sock, [_HEADER.pack(len(data)) + data], list(fds))


def recv(sock: socket.socket, maxfds: int = 0) -> tuple[object, list[int]]:
    """One length-prefixed JSON message (and up to `maxfds` descriptors); None at EOF."""
    buf, fds = b"", []
    while len(buf) < _HEADER.size or len(buf) < _HEADER.size + _HEADER.unpack(buf[:_HEADER.size])[0]:
        chunk, got, _, _ = socket.recv_fds(sock, 1 << 16, maxfds)
        fds += got
        if not chunk:
            return None, fds
        buf += chunk
    return json.loads(buf[_HEADER.size:]), fds


def starting(path: str | os.PathLike) -> bool:
    """Whether a server for the socket at `path` is still importing: its STARTING file names a live process serving
    that very socket (a reused pid, even another warm server's, is not it; a dead server's is a zombie or gone, with
    no command line), written less than READY_S ago (a server stuck in its imports holds each stage at most until
    then, not READY_S each)."""
    marker = Path(f"{os.fspath(path)}{STARTING}")
    try:
        pid, written = int(marker.read_text()), marker.stat().st_mtime
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):  # none starting (the socket is up, or there never was a server)
        return False
    return b"scalelab.pipeline.warm" in cmdline and os.fsencode(path) in cmdline and time.time() - written < READY_S


def handoff(module: str | None = None) -> None:
    """Run this stage in the warm server and exit with its status; return (run here) when there is none to use.

    `module`: this process is `python -m <module>`, a DVC command as the flow runs it (scalelab.pipeline.dvcrun), whose
    `main()` the server runs (DVC's imports are half of a no-op `dvc repro`'s CPU). It keeps SCALELAB_WARM, so the
    stage script DVC then starts is served too, and it waits for no starting server: its own imports cost less."""
    path = os.environ.get(WARM_ENV)
    if not path or any(os.environ.get(v, "0") != "0" for v in RANK_VARS):
        return
    if module is None and not Path(sys.argv[0]).is_file():
        return
    while module is None and not os.path.exists(path) and starting(path):  # seconds: the server's imports (STARTING)
        time.sleep(0.05)
    # The forked stage starts (and may print) before the reply with its pid arrives here: a signal sent to this
    # process in between must wait for the handler that forwards it, not end this process and orphan the stage.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        env = {k: v for k, v in os.environ.items() if module or k != WARM_ENV}
        send(sock, {"argv": [os.path.abspath(sys.argv[0]), *sys.argv[1:]], "cwd": os.getcwd(), "env": env,
                    "module": module}, [0, 1, 2])
        reply, _ = recv(sock)
    except OSError:
        reply = None  # no server (yet, or any more): run in this process
    if not reply or "pid" not in reply:
        if reply and "refused" in reply:
            print(f"scalelab.pipeline.warm: running cold: {reply['refused']}", file=sys.stderr, flush=True)
        sock.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # a pending signal now acts here, as without a server
        return
    pid = reply["pid"]

    def forward(signum, frame):
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # one that came meanwhile is forwarded now
    status, _ = recv(sock)
    sys.stdout.flush()
    os._exit(status["exit"] if status else 1)

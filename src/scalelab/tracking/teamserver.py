"""The team MLflow server on one machine: Debian's PostgreSQL as the backend store and
`mlflow server --serve-artifacts`, both on 127.0.0.1. Clients send artifacts through the server (`mlflow-artifacts:`
URIs), so nobody needs the artifact folder's filesystem; the runs are rows in PostgreSQL, safe under many writers.

    python -m scalelab.tracking.teamserver [--dir .cache/scalelab/team-server] [--port 5000]
    export MLFLOW_TRACKING_URI=http://127.0.0.1:5000   # then `make repro`, the flow or `dvc repro` log there

The folder keeps the database cluster (postgres/), its generated password (0600) and the artifacts, across restarts.
PostgreSQL refuses to run as root: as root its processes run as the `postgres` user the Debian package creates.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

HOST = "127.0.0.1"
DB, USER = "mlflow", "scalelab"


class TeamServerError(RuntimeError):
    """PostgreSQL or the MLflow server could not be started."""


@dataclass(frozen=True)
class TeamServer:
    tracking_uri: str  # what MLFLOW_TRACKING_URI should be
    backend_uri: str  # the PostgreSQL database behind it (holds the password)
    artifacts: Path  # where the server keeps what clients upload


def free_port(host: str = HOST) -> int:
    """A port free now, below the kernel's ephemeral range: port 0 would hand out an ephemeral port, which any
    outgoing connection may take between this check and the server's bind (seen as EADDRINUSE in CI)."""
    low = _ephemeral_low()
    for port in random.Random().sample(range(max(1024, low - 12000), low), 64):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # all 64 taken: the kernel's choice
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: IANA's range starts at 49152
        return 49152


def pg_bin(name: str) -> str:
    """A PostgreSQL program: on PATH, else Debian's newest /usr/lib/postgresql/<version>/bin."""
    if found := shutil.which(name):
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    if not versions:
        raise TeamServerError(f"PostgreSQL's {name} not found (install Debian's `postgresql`)")
    return str(versions[-1])


def _as_db_user() -> dict:
    """Popen arguments that run PostgreSQL as the `postgres` user when this process is root (it refuses root)."""
    return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}


def _init_cluster(pgdata: Path, password: str, durable: bool) -> None:
    pgdata.mkdir(parents=True, exist_ok=True)
    pwfile = pgdata.parent / ".pgpass-init"
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(pgdata, "postgres", "postgres")
        shutil.chown(pwfile, "postgres", "postgres")
    pwfile.chmod(0o600)
    try:
        res = subprocess.run([pg_bin("initdb"), "-D", str(pgdata), "-U", USER, "--pwfile", str(pwfile),
                              "--auth=scram-sha-256", "-E", "UTF8", "--no-instructions",
                              *([] if durable else ["--no-sync"])],
                             capture_output=True, text=True, **_as_db_user())
    finally:
        pwfile.unlink(missing_ok=True)
    if res.returncode:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise TeamServerError(f"initdb {pgdata} failed: {tail[0]}")


def _wait(probe, what: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TeamServerError(f"{what} exited with {proc.returncode} while starting")
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(0.3)
    raise TeamServerError(f"{what} not ready after {timeout:.0f} s")


def _stop(proc: subprocess.Popen, sig: int, timeout: float = 30) -> None:
    """Signal the process group `proc` leads, then wait; SIGKILL if it outlives `timeout`."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def postgres(folder: Path, port: int | None = None, durable: bool = True) -> Iterator[str]:
    """PostgreSQL on 127.0.0.1 over the cluster in `folder`/postgres (created on first use, with database `mlflow`);
    yields its SQLAlchemy URI and stops the server on exit (fast shutdown: open sessions are rolled back).
    `durable=False` (a throwaway store: tests) skips fsync, which costs a busy shared disk tens of seconds."""
    import psycopg2

    folder.mkdir(parents=True, exist_ok=True)
    pgdata, secret = folder / "postgres", folder / "password"
    if not secret.is_file():
        secret.write_text(secrets.token_urlsafe(24))
        secret.chmod(0o600)
    password = secret.read_text().strip()
    if not (pgdata / "PG_VERSION").is_file():
        _init_cluster(pgdata, password, durable)
    port = port or free_port()
    # TCP on loopback only; no Unix socket (its default folder may not exist or be writable)
    cmd = [pg_bin("postgres"), "-D", str(pgdata), "-h", HOST, "-p", str(port), "-k", ""]
    if not durable:
        cmd += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
    with open(folder / "postgres.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
                                **_as_db_user())
    try:
        connect = lambda db: psycopg2.connect(host=HOST, port=port, user=USER, password=password, dbname=db,
                                              connect_timeout=3)
        _wait(lambda: connect("postgres").close() or True, f"PostgreSQL on {HOST}:{port}", proc, 60)
        conn = connect("postgres")
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,))
                if cur.fetchone() is None:
                    cur.execute(f"CREATE DATABASE {DB}")
        finally:
            conn.close()
        yield f"postgresql+psycopg2://{USER}:{password}@{HOST}:{port}/{DB}"
    finally:
        _stop(proc, signal.SIGINT)


@contextlib.contextmanager
def team_server(folder: str | os.PathLike, port: int | None = None, pg_port: int | None = None,
                workers: int = 1, durable: bool = True, timeout: float = 180) -> Iterator[TeamServer]:
    """PostgreSQL and `mlflow server --serve-artifacts` over it, on 127.0.0.1; both stop on exit (`durable`: see
    `postgres`)."""
    folder = Path(folder).resolve()
    artifacts = folder / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    with postgres(folder, pg_port, durable) as backend:
        port = port or free_port()
        uri = f"http://{HOST}:{port}"
        cmd = [sys.executable, "-m", "mlflow", "server", "--serve-artifacts", "--artifacts-destination",
               artifacts.as_uri(), "--host", HOST, "--port", str(port), "--workers", str(workers)]
        env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": backend}  # not on the command line: it holds the password
        with open(folder / "mlflow-server.log", "ab") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # its workers in its group: stopped together
        try:  # the first start runs MLflow's migrations on the empty database (tens of seconds on 2 busy cores)
            _wait(lambda: urllib.request.urlopen(f"{uri}/health", timeout=3).status == 200,
                  f"mlflow server on {uri}", proc, timeout)
            yield TeamServer(uri, backend, artifacts)
        finally:
            _stop(proc, signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalelab.tracking.teamserver", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=".cache/scalelab/team-server", help="database, password and artifacts")
    ap.add_argument("--port", type=int, default=5000, help="the MLflow server's port (default 5000)")
    ap.add_argument("--pg-port", type=int, help="PostgreSQL's port (default: a free one)")
    ap.add_argument("--workers", type=int, default=2, help="MLflow server worker processes")
    args = ap.parse_args(argv)
    try:
        with team_server(args.dir, args.port, args.pg_port, args.workers) as server:
            print(f"MLflow on {server.tracking_uri} (PostgreSQL backend, artifacts in {server.artifacts}); "
                  f"in another shell: export MLFLOW_TRACKING_URI={server.tracking_uri}   (Ctrl-C stops both)",
                  flush=True)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops both servers like Ctrl-C
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    except TeamServerError as err:
        print(f"scalelab.tracking.teamserver: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

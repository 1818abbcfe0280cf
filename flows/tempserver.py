"""The flow's temporary Prefect server, started from the flow's process without importing Prefect's server package.

A flow run reports to a Prefect API. Without PREFECT_API_URL, Prefect's client starts a temporary server itself
(prefect.server.api.server.SubprocessASGIServer), and to reach that class it imports the whole server package into the
flow's process: FastAPI, SQLAlchemy's ORM, the services (measured: ~2 CPU s of the flow process's ~4 in a three-task
flow, for a process that only ever talks HTTP to the server). `ensure` starts the same server (uvicorn on Prefect's app
factory, with the flags Prefect's own start sets) from here, exports its URL to this process's Prefect settings and
to every process the flow starts (a Dask or Ray cluster's workers report to it too), and stops it at exit.

Two of the server's start-up jobs are left out, since the server ends with its flow: automations (the triggers and
actions services: nothing is left running to act on one), and registering every installed block type at each start
(it imports every Prefect collection installed: prefect-dask loads Dask's distributed). Measured on this machine, the
server's CPU for a three-task flow 5.7 -> 5.1 s.
"""

import atexit
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

API_ENV = "PREFECT_API_URL"
# what Prefect's own temporary server runs with (SubprocessASGIServer): no UI, the ephemeral set of services
EPHEMERAL = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
LEFT_OUT = {"PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false", "PREFECT_API_BLOCKS_REGISTER_ON_START": "false"}
PORT_TRIES = 5
STOP_WAIT_S = 5.0

_server: list[subprocess.Popen] = []  # this process's temporary server, while it runs


def ensure() -> str:
    """This process's Prefect API: PREFECT_API_URL (the environment's, or Prefect's settings') when set, else a
    temporary server started now and stopped when this process exits. Either way PREFECT_API_URL is then in this
    process's environment and Prefect's settings."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL

    current = PREFECT_API_URL.value()
    url = os.environ.get(API_ENV) or current or start()
    os.environ[API_ENV] = url
    if url != current:  # Prefect read its settings at import: read them again
        prefect.context.refresh_global_settings_context()
    return url


def start(env: dict[str, str] | None = None, patience: float | None = None) -> str:
    """This process's temporary server, started now (`env` over this process's environment; `patience`: seconds to
    wait for it, else Prefect's PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS): uvicorn on Prefect's app factory at
    a free port of 127.0.0.1. Its API URL, once /api/health answers; a port taken between the check and uvicorn's bind
    makes uvicorn exit: then another port. Stopped by `stop`, or when this process exits."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    from scalelab.tracking.teamserver import free_port

    import prefect

    stop()  # one temporary server a process
    patience = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value() if patience is None else patience
    env = {**os.environ, **(env or {}), **LEFT_OUT, **EPHEMERAL}
    for _ in range(PORT_TRIES):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent),
                                 "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "error", "--lifespan", "on"], env=env)
        if not _server:
            atexit.register(stop)
        _server[:] = [proc]
        url = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + patience
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as res:
                    if res.status == 200:
                        print(f"Prefect: a temporary server at {url} for this flow run", file=sys.stderr)
                        return url
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        if proc.poll() is None:  # up, but no answer within the patience
            stop()
            raise RuntimeError(f"the temporary Prefect server at {url} did not answer within {patience:.0f} s "
                               f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
    stop()
    raise RuntimeError(f"the temporary Prefect server exited at start on {PORT_TRIES} ports (last: exit {proc.returncode})")


def stop() -> None:
    """The temporary server ended: SIGTERM, SIGKILL after STOP_WAIT_S (as Prefect stops its own)."""
    for proc in _server:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _server.clear()

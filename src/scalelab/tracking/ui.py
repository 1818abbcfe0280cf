"""`make ui`: the MLflow UI and the Prefect UI over the project's stores, both on 127.0.0.1 (nothing exposed).

    python -m scalelab.tracking.ui [--mlflow-port 5000] [--prefect-port 4200]

MLflow reads MLFLOW_TRACKING_URI (default: the project's sqlite:///mlflow.db); Prefect reads PREFECT_HOME (default:
the project's .prefect/, the database `python flows/pipeline.py` records its runs in). Ctrl-C stops both.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import scalelab  # noqa: F401  (offline, telemetry-free defaults before the servers inherit the environment)
from scalelab import store_root

HOST = "127.0.0.1"


def _wait(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {url} answered")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


@contextlib.contextmanager
def servers(mlflow_port: int = 5000, prefect_port: int = 4200, *, env: dict[str, str] | None = None,
            log_dir: Path | None = None, timeout: float = 90) -> Iterator[dict[str, str]]:
    """Start both servers, wait until they answer, yield their base URLs; stop them on exit."""
    env = {**os.environ, **(env or {}), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "true",
           "PREFECT_UI_API_URL": f"http://{HOST}:{prefect_port}/api"}  # the UI's calls follow the port
    env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{store_root() / 'mlflow.db'}")
    env.setdefault("PREFECT_HOME", str(store_root() / ".prefect"))
    bin_dir = Path(sys.executable).parent
    commands = {
        "mlflow": [str(bin_dir / "mlflow"), "server", "--host", HOST, "--port", str(mlflow_port),
                   "--backend-store-uri", env["MLFLOW_TRACKING_URI"], "--workers", "1"],
        "prefect": [str(bin_dir / "prefect"), "server", "start", "--host", HOST, "--port", str(prefect_port)],
    }
    health = {"mlflow": f"http://{HOST}:{mlflow_port}/health", "prefect": f"http://{HOST}:{prefect_port}/api/health"}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, cmd in commands.items():
            out = open(log_dir / f"{name}.log", "w") if log_dir else subprocess.DEVNULL
            procs[name] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True)  # its own group: stopped with its workers
        for name, proc in procs.items():
            _wait(health[name], proc, timeout)
        yield {"mlflow": f"http://{HOST}:{mlflow_port}", "prefect": f"http://{HOST}:{prefect_port}"}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mlflow-port", type=int, default=5000)
    ap.add_argument("--prefect-port", type=int, default=4200)
    args = ap.parse_args()
    with servers(args.mlflow_port, args.prefect_port) as urls:
        from mlflow import MlflowClient

        from scalelab.tracking import dashboard

        print(f"MLflow UI:  {urls['mlflow']}")
        for exp in MlflowClient(f"{urls['mlflow']}").search_experiments():
            if exp.name != "Default":
                print(f"  {exp.name}: {dashboard.view_url(urls['mlflow'], exp.experiment_id)}")
        print(f"Prefect UI: {urls['prefect']}  (flows/serve.py with PREFECT_API_URL={urls['prefect']}/api "
              "registers the scheduled deployment)")
        print("Ctrl-C stops both.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())

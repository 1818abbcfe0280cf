"""Serve the pipeline flow as a deployment on a cron schedule, visible in the Prefect UI
(docs/howto-schedule-the-flow.md).

    prefect server start --host 127.0.0.1                  # terminal 1: API and UI on http://127.0.0.1:4200
    prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api
    python flows/serve.py                                  # terminal 2: runs `scalelab-nightly` at 03:00 daily

Servers bind 127.0.0.1: nothing is exposed beyond this machine. SCALELAB_CRON overrides the schedule (cron syntax,
e.g. "0 */6 * * *"), SCALELAB_TZ its timezone (an IANA name, e.g. "Europe/Paris"); "Run" in the UI starts the
deployment now, with parameters (targets, downstream, params_file, workers). Runs execute in this process's
workspace, one flow run at a time (limit=1: two would race to build the same stages), each running its independent
cells concurrently on the thread runner.

The timezone is always given to Prefect: a cron without one runs in UTC (Prefect's default), so "0 3 * * *" ran at
03:00 UTC, not at the machine's 03:00 as the page said. Without SCALELAB_TZ it is the machine's own zone, resolved
here (TZ, else /etc/localtime's zoneinfo name, else /etc/timezone, else UTC) and printed when serving starts.
"""

import scalelab  # noqa: I001  first: sets PREFECT_HOME and telemetry off before prefect reads its settings

import os
import sys
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DEFAULT_CRON = "0 3 * * *"
CRON_ENV, TZ_ENV = "SCALELAB_CRON", "SCALELAB_TZ"
NAME = "scalelab-nightly"


def local_timezone() -> str:
    """The machine's timezone as an IANA name (what Prefect's schedules take)."""
    if (tz := os.environ.get("TZ", "").lstrip(":")) and _known(tz):
        return tz
    link = Path("/etc/localtime")
    if link.is_symlink() and "zoneinfo/" in (target := os.path.realpath(link)):
        if _known(name := target.split("zoneinfo/", 1)[1]):
            return name
    try:
        if _known(name := Path("/etc/timezone").read_text().strip()):
            return name
    except OSError:
        pass
    return "UTC"


def _known(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def schedule(env=os.environ):
    """The deployment's schedule: SCALELAB_CRON (default DEFAULT_CRON) in SCALELAB_TZ (default: local_timezone)."""
    from prefect.schedules import Cron

    tz = env.get(TZ_ENV) or local_timezone()
    if not _known(tz):
        raise SystemExit(f"serve: {TZ_ENV}={tz!r} is not an IANA timezone name (e.g. Europe/Paris, UTC)")
    return Cron(env.get(CRON_ENV) or DEFAULT_CRON, timezone=tz)


def deployment(env=os.environ):
    """The deployment `make serve` registers: the pipeline flow as `scalelab-nightly` on `schedule(env)`. Built from
    the project folder (its entrypoint, flows/pipeline.py, is resolved from the working directory)."""
    from pipeline import pipeline  # flows/ is on sys.path when this file runs as a script

    return pipeline.to_deployment(name=NAME, schedule=schedule(env))


if __name__ == "__main__":
    from prefect import serve

    os.chdir(scalelab.project_root())
    nightly = deployment()
    (when,) = nightly.schedules
    print(f"serve: {NAME} at cron {when.schedule.cron!r} in {when.schedule.timezone}", file=sys.stderr)
    serve(nightly, limit=1)

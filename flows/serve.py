"""Serve the pipeline flow as a deployment on a cron schedule, visible in the Prefect UI
(docs/howto-schedule-the-flow.md).

    prefect server start --host 127.0.0.1                  # terminal 1: API and UI on http://127.0.0.1:4200
    prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api
    python flows/serve.py                                  # terminal 2: runs `scalelab-nightly` at 03:00 daily

Servers bind 127.0.0.1: nothing is exposed beyond this machine. SCALELAB_CRON overrides the schedule (cron syntax,
e.g. "0 */6 * * *"); "Run" in the UI starts the deployment now, with parameters (targets, downstream, params_file,
workers). Runs execute in this process's workspace, one flow run at a time (limit=1: two would race to build the same
stages), each running its independent cells concurrently on the thread runner.
"""

import scalelab  # noqa: I001  first: sets PREFECT_HOME and telemetry off before prefect reads its settings

import os

from pipeline import pipeline  # flows/ is on sys.path when this file runs as a script

if __name__ == "__main__":
    os.chdir(scalelab.project_root())  # the deployment's entrypoint (flows/pipeline.py) is resolved from here
    pipeline.serve(name="scalelab-nightly", cron=os.environ.get("SCALELAB_CRON", "0 3 * * *"), limit=1)

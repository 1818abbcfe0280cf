"""Recording runs: MLflow runs per stage cell under one parent per pipeline execution (runs), where the store is and
the keys that identify runs (store), what a researcher sees on opening the experiment (dashboard), runs left RUNNING
closed with their true status (orphans), and the local dashboards' launcher (ui).

`from scalelab import tracking` gives the stage-facing API: `tracking.stage_run(...)`, `tracking.flatten(...)`.
"""

from scalelab.tracking import dashboard, orphans  # before runs and store, which use them
from scalelab.tracking.runs import (StageRun, child_runs, nested_under, parent_run_id, pipeline_run,
                                    stage_run)
from scalelab.tracking.store import (FLOW_RUN_ENV, MAX_PARAM, PARENT_ENV, RUN_ENV, deps_hash, flatten,
                                     git_commit, pipeline_key, public_uri, run_url, tracking_uri)

__all__ = ["dashboard", "orphans", "StageRun", "child_runs", "nested_under", "parent_run_id", "pipeline_run",
           "stage_run", "FLOW_RUN_ENV", "MAX_PARAM", "PARENT_ENV", "RUN_ENV", "deps_hash", "flatten", "git_commit",
           "pipeline_key", "public_uri", "run_url", "tracking_uri"]

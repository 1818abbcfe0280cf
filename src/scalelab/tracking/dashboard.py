"""MLflow as the dashboard (used by scalelab.tracking): what a researcher sees on opening the experiment.

- The experiment's kind (`mlflow.experimentKind`, read by MLflow 3.17's UI) is set to custom model development, so
  the experiment opens on its training runs instead of the GenAI overview ("Traces: 0"); its primary metric
  (`mlflow.experiment.primaryMetric.name`) is the validation loss, the first chart of the chart view.
- A saved view (`mlflow.sharedViewState.<key>`, opened by `#/experiments/<id>/runs?viewStateShareKey=<key>`) puts
  variant, size, seed and the final validation loss first in the runs table, beside Source, Dataset and Model.
- Datasets are run inputs: each token split as an `mlflow.data` dataset (tokens, bytes, dtype; digest: its sha256).
- Models are external logged models pointing at their DVC out (no weights copied): evaluation metrics link to them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from mlflow import MlflowClient
from mlflow.data.dataset_source_registry import get_dataset_source_from_json
from mlflow.data.numpy_dataset import from_numpy
from mlflow.entities import DatasetInput, InputTag, LoggedModelOutput, LoggedModelStatus
from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_MODEL_IS_EXTERNAL

VIEW_KEY = "scalelab"
PRIMARY_METRIC = "val/loss"  # what the pretrain runs log as their validation loss (the last value is the final one)
PATH_TAG = "scalelab.path"  # a logged model's DVC out, relative to the project root

# what a researcher compares (the UI orders them: attributes, then metrics, then params); the zero-shot metrics are
# one click away (Columns) rather than pushing these off a laptop's screen
_COLUMNS = [("attributes", "Source"), ("attributes", "Dataset"), ("attributes", "Models"),
            ("params", "cell.variant"), ("params", "cell.size"), ("params", "cell.seed"),
            ("metrics", PRIMARY_METRIC), ("metrics", "eval/val_loss")]
VIEW_STATE = {"selectedColumns": [f"{kind}.`{key}`" for kind, key in _COLUMNS]}  # the UI's column ids

EXPERIMENT_TAGS = {
    "mlflow.experimentKind": "custom_model_development",
    "mlflow.experiment.primaryMetric.name": PRIMARY_METRIC,
    f"mlflow.sharedViewState.{VIEW_KEY}": json.dumps(VIEW_STATE),
    "mlflow.note.content": (
        "scalelab: one parent run per pipeline execution, one child run per DVC stage cell. "
        f"Open the runs table with variant, size, seed and validation loss first: add `?viewStateShareKey={VIEW_KEY}` "
        "to this page's runs URL (`make ui` prints it)."),
}


def ensure_experiment(client: MlflowClient, experiment_id: str, tags: dict[str, str]) -> None:
    """Set the dashboard tags an experiment lacks (one call per missing tag; none once set; a value a user changed
    in the UI stays)."""
    for key, value in EXPERIMENT_TAGS.items():
        if key not in tags:
            client.set_experiment_tag(experiment_id, key, value)


def view_url(ui: str, experiment_id: str) -> str:
    """The runs table of the experiment with the saved view, e.g. ui = http://127.0.0.1:5000."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_KEY}"


def source_tags(script: str | None = None) -> dict[str, str]:
    """Fill the Source column: the stage script (relative to the project root) run locally."""
    from scalelab import project_root

    script = script or (sys.argv[0] if sys.argv and sys.argv[0] else "python")
    try:
        script = str(Path(script).resolve().relative_to(project_root()))
    except ValueError:
        pass
    return {"mlflow.source.name": script, "mlflow.source.type": "LOCAL"}


def token_datasets(meta_path: str | os.PathLike) -> list[DatasetInput]:
    """Each split of a token-shard folder (the tokenize stage's meta.json) as a dataset input of a run: an
    `mlflow.data` numpy dataset over the shard (memory-mapped: its schema and profile, tokens and bytes, come from the
    array without reading it), its digest the shard's sha256, its source the shard's path."""
    meta_path = Path(meta_path)
    meta = json.loads(meta_path.read_text())
    out = []
    for split, shard in sorted(meta.get("shards", {}).items()):
        path = meta_path.parent / shard["file"]
        # by source type: resolving a bare path warns that two registered sources ("" and file://) both match it
        source = get_dataset_source_from_json(json.dumps({"uri": str(path)}), "local")
        ds = from_numpy(np.memmap(path, dtype=meta["dtype"], mode="r"), source=source,
                        name=f"{meta_path.parent.name}/{split}", digest=shard["sha256"][:16])
        context = "training" if split == "train" else "validation" if split == "val" else split
        out.append(DatasetInput(ds._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    return out


def log_inputs(client: MlflowClient, run_id: str, datasets: list | None, models: list | None) -> None:
    """`log_inputs`, once more if a concurrent cell created the same dataset row between MLflow's lookup and its
    insert: two cells reading the same shards both insert (name, digest), the second fails its UNIQUE constraint
    (found by the Dask runner test), and its retry finds the row. Anything else raises, as before."""
    for attempt in (0, 1):
        try:
            return client.log_inputs(run_id, datasets=datasets, models=models)
        except MlflowException as err:
            if attempt or "UNIQUE constraint" not in str(err):
                raise


def is_token_meta(path: str | os.PathLike) -> bool:
    path = Path(path)
    if path.name != "meta.json" or not path.is_file():
        return False
    try:
        return "shards" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def model_folder(out_dir: str | os.PathLike) -> Path | None:
    """The loadable model in a stage's out folder: its `hf/` export when there is one, else the folder itself when
    it holds weights; None for folders without a model."""
    out_dir = Path(out_dir)
    for folder in (out_dir / "hf", out_dir):
        if folder.is_dir() and any(folder.glob("*.safetensors")):
            return folder
    return None


def _relative(path: str | os.PathLike) -> str:
    from scalelab import project_root

    p = Path(path).resolve()
    try:
        return p.relative_to(project_root()).as_posix()
    except ValueError:
        return p.as_posix()


def log_model(client: MlflowClient, experiment_id: str, run_id: str, path: str | os.PathLike,
              name: str | None = None, tags: dict[str, str] | None = None) -> str:
    """An external logged model for the model folder `path` (weights stay in the DVC out), produced by `run_id`."""
    rel = _relative(path)
    name = name or (Path(rel).parent.parent.name if Path(rel).name == "hf" else Path(rel).parent.name)
    model_tags = {MLFLOW_MODEL_IS_EXTERNAL: "true", PATH_TAG: rel, **(tags or {})}
    model = client.create_logged_model(experiment_id, name=name, source_run_id=run_id, tags=model_tags,
                                       model_type="causal-lm")
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, 0)])
    return model.model_id


def find_model(client: MlflowClient, experiment_id: str, path: str | os.PathLike) -> str | None:
    """The newest logged model pointing at the model folder `path`, if any."""
    models = client.search_logged_models([experiment_id], filter_string=f"tags.`{PATH_TAG}` = '{_relative(path)}'",
                                         order_by=[{"field_name": "creation_time", "ascending": False}],
                                         max_results=1)
    return models[0].model_id if models else None


def system_metrics(run_id: str, uri: str, interval: float = 2.0) -> Any:
    """Start MLflow's system-metrics sampler (CPU, memory, disk, network; GPU when present) for a training run;
    returns the monitor (call .finish()) or None where it cannot run or is switched off.

    The sampler `mlflow.start_run(log_system_metrics=True)` starts, driven by hand: that switch exists only on the
    fluent API, whose run would become this process's active run, set RUNNING on start and FINISHED at exit (atexit),
    over the stage's own terminal state. Its public settings hold: MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=false turns it
    off, MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides `interval`; and, as start_run does for a reopened run, a
    resumed run continues its system-metric steps instead of logging step 0 again."""
    if MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.defined and not MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get():
        return None
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval, samples_before_logging=1,
                                       resume_logging=True, tracking_uri=uri)
        monitor.start()
        return monitor
    except Exception:  # psutil missing, a store without system-metrics support: training goes on without it
        return None

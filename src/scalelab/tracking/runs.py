"""MLflow tracking: one experiment per project, a parent run per pipeline execution, a child run per stage cell.

The Prefect flow opens the parent run (`pipeline_run`) and hands its id to the stages in
SCALELAB_PARENT_RUN_ID; under plain `dvc repro` every stage finds or creates the parent keyed by the git commit and the
sha256 of params.yaml, so all stages of one repro share it. Tracking never stops a stage: a failure (server down, bad
URI, sqlite locked) warns once and the run becomes a no-op (run_id None when no run could be opened).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import warnings
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from mlflow import MlflowClient
from mlflow.entities import LoggedModelInput, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from scalelab import experiment_tags, store_root
from scalelab.tracking import dashboard, orphans
from scalelab.tracking.store import (FLOW_RUN_ENV, MAX_KEY, MAX_PARAM, MAX_TAG, PARENT_ENV, RUN_ENV, _connect, _number,
                                     _repro_parent, deps_hash, flatten, git_commit, public_uri, run_url, tracking_uri)


class StageRun:
    """One MLflow run. A tracking failure warns once, then every method is a no-op; nothing raises."""

    def __init__(self, experiment: str, run_id: str | None = None, active: bool = True):
        self.experiment, self.run_id, self.experiment_id = experiment, run_id, None
        self._active = active  # False on DDP ranks > 0: rank 0 tracks and records
        self._client: MlflowClient | None = None
        self._parent: str | None = None  # the parent whose status this run keeps (plain `dvc repro`)
        self.parent_id: str | None = None  # the pipeline's parent run (flow's or repro's)
        self._logged: set[str] = set()  # param keys already in a reopened run: MLflow forbids changing them
        self._system = None  # the system-metrics sampler of a training run

    def _call(self, method: str | Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A client method by name, or a function taking the client first (scalelab.tracking.dashboard's)."""
        if self._client is None:
            return None
        try:
            fn = getattr(self._client, method) if isinstance(method, str) else partial(method, self._client)
            return fn(*args, **kwargs)
        except Exception as err:  # tracking never stops a stage
            self._client = None
            name = getattr(method, "__name__", method)
            msg = f"MLflow tracking off for this run ({name}: {type(err).__name__}: {err})"
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def _open(self, name: str, tags: dict[str, str], run_id: str | None = None, nested: bool = False) -> None:
        client, self.experiment_id = _connect(self.experiment)
        if nested:  # under the flow's parent, else under this repro's, whose status its stages keep
            parent = os.environ.get(PARENT_ENV)
            if not parent:
                parent = self._parent = _repro_parent(client, self.experiment_id, create=True)
                orphans.claim(client, parent)  # held by this stage while it runs (owner before status: orphans)
            tags[MLFLOW_PARENT_RUN_ID] = self.parent_id = parent
        if run_id:  # resume: continue the run stored beside the checkpoint
            try:
                self._logged = set(client.get_run(run_id).data.params)
                orphans.claim(client, run_id)  # owner before status: never RUNNING under its dead owner (orphans)
            except MlflowException as err:
                if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                warnings.warn(f"MLflow run {run_id} not found; starting a new one", RuntimeWarning)
                run_id = None
        owned = {orphans.OWNER_TAG: orphans.owner()}  # from the first write: a kill right after leaves it sweepable
        self.run_id = run_id or client.create_run(self.experiment_id, run_name=name, tags=owned).info.run_id
        self._client = client
        self.set_tags(tags)  # the owner tag is in already: create_run's or claim's

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = [Param(k[:MAX_KEY], str(v)[:MAX_PARAM]) for k, v in flatten(params).items() if k not in self._logged]
        self._call("log_batch", self.run_id, params=items)  # MlflowClient.log_batch chunks to MLflow's limits
        self._logged |= {p.key for p in items}

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None, *, model_id: str | None = None,
                    dataset: Any = None) -> None:
        """`model_id` links the values to a logged model, `dataset` (an mlflow Dataset) to the data they measure."""
        now = int(time.time() * 1000)
        values = {re.sub(r"[^\w\-./ ]", "_", k)[:MAX_KEY]: _number(v) for k, v in metrics.items()}  # MLflow's charset
        link = {"model_id": model_id} | ({"dataset_name": dataset.name, "dataset_digest": dataset.digest}
                                         if dataset is not None else {})
        items = [Metric(k, v, now, step or 0, **link) for k, v in values.items() if v is not None]
        self._call("log_batch", self.run_id, metrics=items)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._call("log_batch", self.run_id, tags=[RunTag(k[:MAX_KEY], str(v)[:MAX_TAG]) for k, v in tags.items()])

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None, parent: bool = False) -> None:
        """A file into this run, or with `parent` into the pipeline's parent run (e.g. the scaling plot)."""
        target = self.parent_id if parent else self.run_id
        if target:
            self._call("log_artifact", target, str(path), artifact_path)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """A matplotlib figure into the run, e.g. `plots/scaling.png`."""
        self._call("log_figure", self.run_id, figure, artifact_file)

    def log_inputs(self, datasets: Sequence[Any] = (), models: Sequence[str] = ()) -> None:
        """Datasets (mlflow DatasetInput) and logged models (ids) this run read: the Dataset and Model columns."""
        if self.run_id and (datasets or models):
            self._call(dashboard.log_inputs, self.run_id, list(datasets) or None,
                       [LoggedModelInput(m) for m in models] or None)

    def log_model(self, path: str | os.PathLike, name: str | None = None, tags: Mapping[str, str] | None = None
                  ) -> str | None:
        """An MLflow external logged model pointing at the model folder `path` (its DVC out; no weights copied),
        output of this run; returns its id (None when tracking is down)."""
        if self._client is None or not self._active:
            return None
        return self._call(dashboard.log_model, self.experiment_id, self.run_id, path, name, dict(tags or {}))

    def find_model(self, path: str | os.PathLike) -> str | None:
        """The newest logged model pointing at `path` (e.g. the pretrain cell an evaluation scores)."""
        return self._call(dashboard.find_model, self.experiment_id, path) if self._client is not None else None

    def record(self, out_dir: str | os.PathLike) -> Path | None:
        """Write out_dir/mlflow_run.json (atomically): the stage's outs point to the run that made them. A folder
        holding a model (weights, or an `hf/` export) also becomes an MLflow logged model (its id recorded).

        The pointer is this machine's (a run of its store), not data: .dvcignore keeps it out of the out's hash, so
        the out's hash depends on its data alone and a `dvc push` never sends it; a store under the project is
        written relative to it (`sqlite:///mlflow.db`: from the project root, where stages run)."""
        if not self._active:
            return None
        path = Path(out_dir) / "mlflow_run.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        info = {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": _project_uri()}
        if (folder := dashboard.model_folder(out_dir)) is not None and (model_id := self.log_model(folder)):
            info["model_id"] = model_id
        tmp.write_text(json.dumps(info, indent=1) + "\n")
        os.replace(tmp, path)
        return path

    def lightning_logger(self):
        """Lightning's MLFlowLogger bound to this run (always with the URI), or None when tracking is down.

        On DDP ranks > 0 it is bound to rank 0's run and logs nothing (Lightning logs from rank 0 only)."""
        if self.run_id is None or (self._active and self._client is None):
            return None
        if self._active and self._system is None:  # a training run: system metrics beside its curves
            self._system = dashboard.system_metrics(self.run_id, tracking_uri())
        return _safe_logger_class()(self.experiment, tracking_uri=tracking_uri(), run_id=self.run_id, log_model=False)

    def end(self, status: str = "FINISHED") -> None:
        if self._system is not None:
            self._system.finish()
        self._call("set_terminated", self.run_id, status)
        if self._parent:  # a plain repro's parent shows how its latest stage ended
            self._call("set_terminated", self._parent, status)
        if self._client is None and self._active and self.run_id:  # the store went away: the next contact closes them
            orphans.defer(tracking_uri(), [(self.run_id, status), *([(self._parent, status)] if self._parent else [])])
        if self._active and self.run_id and os.environ.get(RUN_ENV) == self.run_id:
            del os.environ[RUN_ENV]


def _project_uri() -> str:
    """The public tracking URI, a local store under the project (scalelab.store_root) written relative to it:
    `sqlite:///mlflow.db`, `mlruns`; a server, or a store elsewhere, as it is."""
    uri, root = public_uri(), store_root().resolve()
    prefix = next((p for p in ("sqlite:///", "file://") if uri.startswith(p)), "" if "://" not in uri else None)
    if prefix is None:
        return uri
    path = Path(uri[len(prefix):])
    if not path.is_absolute() or not path.resolve().is_relative_to(root):
        return uri
    rel = path.resolve().relative_to(root).as_posix()
    return f"sqlite:///{rel}" if prefix == "sqlite:///" else rel


@contextlib.contextmanager
def _lifecycle(run: StageRun) -> Iterator[StageRun]:
    try:
        yield run
    except BaseException as exc:
        run.end("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    run.end("FINISHED")


@lru_cache
def _safe_logger_class():
    from lightning.pytorch.loggers import MLFlowLogger

    class SafeMLFlowLogger(MLFlowLogger):
        """Lightning's MLFlowLogger whose calls warn, once, instead of raising: an outage mid-training (server gone,
        sqlite locked) never kills the run; the metrics still land in the stage's outs."""

        _down = False

        def _safe(self, fn, *args: Any) -> None:
            if self._down:
                return
            try:
                fn(*args)
            except Exception as err:
                self._down = True
                _warn_down(err)

        def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
            self._safe(super().log_metrics, metrics, step)

        def log_hyperparams(self, params: Any) -> None:
            self._safe(super().log_hyperparams, params)

        def finalize(self, status: str = "success") -> None:
            """Nothing: Lightning's marks the run FINISHED right after `fit`, before the stage's export and metrics
            are written. The stage's exit (`_lifecycle`, after its outs) writes the only terminal state."""

        def log_batch(self, metrics: list[Metric]) -> None:
            """Many steps' metrics in one request (MlflowClient.log_batch chunks them)."""
            self._safe(lambda: self.experiment.log_batch(self.run_id, metrics=metrics))

    return SafeMLFlowLogger


def _warn_down(err: Exception) -> None:
    msg = f"MLflow tracking unavailable at {public_uri()} ({type(err).__name__}: {err}); continuing without it"
    warnings.warn(msg, RuntimeWarning, stacklevel=4)


@contextlib.contextmanager
def stage_run(
    stage: str,
    *,
    params: Mapping[str, Any],
    experiment: str = "scalelab",
    deps: Sequence[str | os.PathLike] = (),
    run_id: str | None = None,
) -> Iterator[StageRun]:
    """The child run of one stage cell under the pipeline's parent run; `run_id` reopens a run (resume).

    Ends FINISHED, or FAILED when the body raises (the exception propagates)."""
    if any(os.environ.get(k, "0") != "0" for k in ("RANK", "LOCAL_RANK", "NODE_RANK")):  # a DDP rank > 0
        with _lifecycle(StageRun(experiment, os.environ.get(RUN_ENV) or None, active=False)) as run:
            yield run
        return
    params = params.model_dump(mode="json") if hasattr(params, "model_dump") else dict(params)
    run = StageRun(experiment)
    try:
        tags = {"dvc.stage": os.environ.get("DVC_STAGE", stage), "scalelab.deps_hash": deps_hash(params, deps)}
        tags |= {"git.commit": git_commit(), "mlflow.source.git.commit": git_commit(), **dashboard.source_tags()}
        tags |= experiment_tags()  # the DVC experiment this stage runs in (`dvc exp run`), if any
        if flow_run_id := os.environ.get(FLOW_RUN_ENV):
            tags["prefect.flow_run_id"] = flow_run_id
        run._open(stage, tags, run_id, nested=True)
        run.log_params(params)
        run.log_inputs([ds for d in deps if dashboard.is_token_meta(d) for ds in dashboard.token_datasets(d)])
        os.environ[RUN_ENV] = run.run_id
    except Exception as err:
        _warn_down(err)
    with _lifecycle(run):
        yield run


@contextlib.contextmanager
def nested_under(run: StageRun) -> Iterator[None]:
    """Stage runs opened inside nest under `run` (a cell that trains several models: one child of the pipeline's
    parent per cell, its training runs beneath it); nothing changes when `run` is not tracked."""
    before = os.environ.get(PARENT_ENV)
    if run.run_id:
        os.environ[PARENT_ENV] = run.run_id
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARENT_ENV, None)
        else:
            os.environ[PARENT_ENV] = before


@contextlib.contextmanager
def pipeline_run(
    name: str, *, experiment: str = "scalelab", tags: Mapping[str, str] | None = None
) -> Iterator[StageRun]:
    """The parent run of one pipeline execution (the Prefect flow's); run_id None when tracking is down."""
    run = StageRun(experiment)
    try:
        run._open(name, {"git.commit": git_commit(), **dashboard.source_tags("flows/pipeline.py"), **(tags or {})})
    except Exception as err:
        _warn_down(err)
    with _lifecycle(run):
        yield run


def parent_run_id(experiment: str = "scalelab") -> str | None:
    """The parent run stages started now would nest under: the flow's, else this repro's (None: none yet, or
    tracking is down). Creates nothing."""
    try:
        return os.environ.get(PARENT_ENV) or _repro_parent(*_connect(experiment), create=False)
    except Exception as err:
        _warn_down(err)
        return None


def child_runs(parent_id: str) -> list[dict[str, Any]]:
    """The stage runs under a parent: name, stage (tag `dvc.stage`), run_id, status, url (http servers only)."""
    try:
        client = MlflowClient(tracking_uri())
        exp_id = client.get_run(parent_id).info.experiment_id
        query = f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_id}'"
        runs = client.search_runs([exp_id], query, order_by=["attributes.start_time ASC"])
    except Exception as err:
        _warn_down(err)
        return []
    return [
        {
            "name": r.info.run_name,
            "stage": r.data.tags.get("dvc.stage", r.info.run_name),
            "run_id": r.info.run_id,
            "status": r.info.status,
            "url": run_url(exp_id, r.info.run_id),
        }
        for r in runs
    ]

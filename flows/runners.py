"""Where the pipeline flow's tasks run: Prefect task runners for this machine, Dask and Ray.

- `threads` (default): a thread pool in the flow's process; each task runs its stage in a subprocess on one share of
  this machine (scalelab.runtime.placement). Tasks wait for their upstream futures inside these threads, so there are many
  (idle threads cost nothing); how many cells run at once is the share pool's size, the flow's `workers`.
- `dask`: prefect-dask on a `distributed.LocalCluster` of `workers` single-threaded worker processes, or on an existing
  scheduler (`address`). `slurm`: the same on dask-jobqueue's SLURMCluster, one job per worker, adaptive up to
  `workers` jobs; each job runs one cell at a time (cores=1 dask thread), its size from dask-jobqueue's config.
- `ray`: prefect-ray on a local Ray instance with `workers` CPUs, or on a cluster (`address`).

Cluster workers share the workspace (a shared filesystem, the same path), the Prefect API and the MLflow store with
the flow's process.
"""

import importlib.util
import logging
import os
from contextlib import nullcontext
from types import ModuleType

import cloudpickle
from prefect.task_runners import ThreadPoolTaskRunner

from scalelab.runtime import placement

KINDS = ("threads", "dask", "slurm", "ray")
THREADS = 512
_BY_VALUE: list[ModuleType] = []


def by_value(module: ModuleType) -> None:
    """Dask and Ray workers cannot import flows/: what they receive from `module` (the tasks, and the flow in their
    context) travels by value. A script's own module (__main__, or loaded by path) does anyway; an imported one is
    registered here, with cloudpickle now and with Ray's own copy of it when the Ray runner is made."""
    cloudpickle.register_pickle_by_value(module)
    _BY_VALUE.append(module)


def shared_api_url() -> str:
    """The Prefect API this process reports to, exported to the processes it starts (Dask or Ray workers): without
    one, each worker would start a temporary server of its own and its task runs would be lost to the flow's.
    `python flows/pipeline.py` has one by now (its `main`); a flow called in-process may not."""
    import tempserver  # flows/, as lifetime: never a global (this module travels by value to the workers)

    return tempserver.ensure()


EXTRA = {"dask": ("prefect_dask", "dask_jobqueue"), "slurm": ("prefect_dask", "dask_jobqueue"),
         "ray": ("prefect_ray", "ray")}  # the modules each cluster runner needs: the `cluster` extra


def missing_extra(kind: str) -> str | None:
    """One line saying what to install when `kind`'s modules are absent (`make setup` installs the pipeline alone;
    `make test` or `pip install -e '.[cluster]'` adds them), else None."""
    if absent := [m for m in EXTRA.get(kind, ()) if importlib.util.find_spec(m) is None]:
        return f"--runner {kind} needs {', '.join(absent)}: pip install -e '.[cluster]' (or make test, which installs it)"
    return None


def task_runner(kind: str = "threads", workers: int | None = None, address: str | None = None):
    """The Prefect task runner for `kind`. Cluster workers share the workspace (a shared filesystem), the Prefect API
    and the MLflow store with this process; each runs one cell at a time."""
    workers = workers or placement.default_workers()
    if kind == "threads":
        return ThreadPoolTaskRunner(max_workers=THREADS)
    shared_api_url()
    share = placement.thread_env(max(1, (os.cpu_count() or 1) // workers))  # local clusters split this machine
    if kind in ("dask", "slurm"):
        from prefect_dask import DaskTaskRunner

        if address:
            return DaskTaskRunner(address=address)
        if kind == "slurm":  # queue, job_cpu, memory, walltime, GPUs: dask-jobqueue's config (README)
            return DaskTaskRunner(cluster_class="dask_jobqueue.SLURMCluster",
                                  cluster_kwargs={"cores": 1, "processes": 1}, adapt_kwargs={"maximum": workers})
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs={
            "n_workers": workers, "threads_per_worker": 1, "processes": True, "dashboard_address": None,
            "silence_logs": logging.WARNING, "env": share})
    if kind == "ray":
        from prefect_ray import RayTaskRunner
        from ray import cloudpickle as ray_cloudpickle

        for module in _BY_VALUE:
            ray_cloudpickle.register_pickle_by_value(module)

        if address:
            return RayTaskRunner(address=address)
        return RayTaskRunner(init_kwargs={"num_cpus": workers, "include_dashboard": False,
                                          "runtime_env": {"env_vars": share}})
    raise ValueError(f"unknown runner {kind!r}; one of {', '.join(KINDS)}")


def on_this_machine(runner) -> bool:
    """Whether `runner`'s tasks run on this machine: the thread pool, and a cluster it starts here itself (a Dask
    LocalCluster, a local Ray instance: no address). Their stages may start warm from the flow's server
    (scalelab.pipeline.warm), whose socket is in this machine's /tmp; a cluster's workers elsewhere would not reach it
    (their stages then run cold, as they do anyway: the server would be started for nothing)."""
    if isinstance(runner, ThreadPoolTaskRunner):
        return True
    if type(runner).__name__ == "DaskTaskRunner":
        import distributed

        if (cluster := getattr(runner, "_cluster", None)) is not None:  # started (the flow's), or given as an object
            return isinstance(cluster, distributed.LocalCluster)
        cls = runner.resolved_cluster_class or runner.cluster_class or distributed.LocalCluster  # Prefect's default
        return runner.address is None and isinstance(cls, type) and issubclass(cls, distributed.LocalCluster)
    if type(runner).__name__ == "RayTaskRunner":
        return runner.address in (None, "") and not os.environ.get("RAY_ADDRESS")  # ray.init() would connect there
    return False


def resources(runner, gpus_per_task: float):
    """What one task submission asks its runner for: GPUs from a Ray cluster (Ray hides them from tasks that ask for
    none); nothing otherwise (a SLURM job's GPUs are its worker's; the thread runner hands out shares itself)."""
    if gpus_per_task and type(runner).__name__ == "RayTaskRunner":
        from prefect_ray.context import remote_options

        return remote_options(num_gpus=gpus_per_task)
    return nullcontext()
